// Kernel hv's epilogue (chunk_bwd_hv.cu): after the slab loop, per half, from the accumulators of
// the h products (doh = do h^T, xw = -dXu h^T, vdh = vnew dh^T, [L,KW]), per (row r, key d),
// gamma = 2^b_r[d], e = 2^(b_end[d] - b_r[d]):
//   dq = gamma scale doh;  dk = e vdh + beta gamma xw  (-> dqv, dkv; the intra parts are added later)
//   x1 = q dq + beta bk,  x2 = k e vdh,  bk = k gamma xw
//   da_t[d] = sum_{r>=t} x1_r + sum_{r<t} x2_r + 2^b_end rowsum(h dh)
//   dbeta partial = sum_d bk (+ v . dXu)
// kda and gla scan x1, x2 per key over the rows (tiles X1, X2, Bk in the slab buffers); gdn sums them
// over the keys, which the accumulator layout gives by shuffles (hv_row_sums: no tiles, one pass and
// one barrier fewer; hv 1.92 -> 1.85 ms at gdn T = 32768, docs/BENCHMARKS.md).
// Covered by tests/cuda/test_cuda_backward.cpp (stage "chunk" against the CPU twin, and end to end).
#pragma once

#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_bwd_hv_tiles.cuh"
#include "cuda/chunk_bwd_tiles.cuh"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda::hv {

template <int NTW>
struct HvAcc {
  float doh[NTW][4], xw[NTW][4], vdh[NTW][4], X[4][4];
};

// gdn's row sums of x1, x2, bk (rows g, g + 8 of warp w's tile, over its KW / 2 keys, quad shuffles)
// into s.red + 384 z + 192 (w / 4) + 64 v: the two key quarters of a row summed by hv_gate_partials.
__device__ __forceinline__ void hv_row_sums(const HvSmem& s, float (&rs)[3][2], const HvThread& th) {
#pragma unroll
  for (int v = 0; v < 3; ++v)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      rs[v][i] += __shfl_xor_sync(0xffffffffu, rs[v][i], 1);
      rs[v][i] += __shfl_xor_sync(0xffffffffu, rs[v][i], 2);
    }
  if (lane_t() == 0) {
    float* red = s.red + 384 * th.z + 192 * (th.w >> 2) + 16 * (th.w & 3) + lane_g();
#pragma unroll
    for (int v = 0; v < 3; ++v) red[64 * v] = rs[v][0], red[64 * v + 8] = rs[v][1];
  }
}

// Epilogue of the h products of one half: dqv, dkv, and the per-element gate / dbeta terms: into
// X1, X2, Bk (kda, gla) or summed per row (gdn, hv_row_sums).
template <int KD, bool kKDA, bool kDelta, bool kSplit>
__device__ void hv_epilogue(const BwdParams& bp, const HvSmem& s, const HvAcc<HvShape<KD, kDelta>::NTW>& a,
                            const ChunkInfo& ck, int hv, int d0, const HvThread& th) {
  using S = HvShape<KD, kDelta>;
  const ChunkParams& p = bp.c;
  const int m0 = 16 * (th.w & 3), hb = (th.w >> 2) * (S::KW / 2), L = ck.len, h = hv / p.G;
  float rs[3][2] = {};  // gdn: row sums of x1, x2, bk
#pragma unroll
  for (int nt = 0; nt < S::NTW; ++nt) {
    float qv[4], kv[4], gr[4], ge[4];  // all loads of this tile first (no store may alias them)
    QkPairBits qb[2], kb[2];            // issued together, converted after: one round trip per tile
#pragma unroll
    for (int e = 0; e < 4; e += 2) {  // elements e, e + 1: keys d, d + 1 (d even) of one row
      const int rr = min(acc_row(m0, e), L - 1), d = d0 + acc_col(hb + 8 * nt, e);
      const int64_t tt = ck.t0 + rr;
      qb[e / 2] = qk_pair_load(q_rows(p), p.H, tt, h, d), kb[e / 2] = qk_pair_load(k_rows(p), p.H, tt, h, d);
      if constexpr (kKDA) {  // gcum rows are K floats: pairs 8-byte aligned
        const float2 g2 = *reinterpret_cast<const float2*>(p.gcum + (tt * p.HV + hv) * KD + d);
        const float2 e2 = *reinterpret_cast<const float2*>(p.gcum + (int64_t(ck.t0 + L - 1) * p.HV + hv) * KD + d);
        gr[e] = g2.x, gr[e + 1] = g2.y, ge[e] = e2.x, ge[e + 1] = e2.y;
      } else {
        gr[e] = gr[e + 1] = s.gsc[rr], ge[e] = ge[e + 1] = s.gsc[L - 1];
      }
    }
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const float2 q2 = qk_pair_value(qb[e / 2], p.q.dt), k2 = qk_pair_value(kb[e / 2], p.k.dt);
      qv[e] = q2.x, qv[e + 1] = q2.y, kv[e] = k2.x, kv[e + 1] = k2.y;
    }
    float dqk[4] = {}, dkk[4] = {};  // dq, dk of the tile, stored in pairs below
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = acc_row(m0, e), dl = acc_col(hb + 8 * nt, e);
      float x1 = 0.0f, x2 = 0.0f, bk = 0.0f;
      if (r < L) {
        const float gam = exp2_approx<kSplit>(gr[e]), ex = exp2_approx<kSplit>(ge[e] - gr[e]), xwn = -a.xw[nt][e], b = s.bet[r];
        const float dq = gam * p.scale * a.doh[nt][e], dki = ex * a.vdh[nt][e];
        dqk[e] = dq, dkk[e] = dki + b * gam * xwn;
        bk = kv[e] * gam * xwn;
        x1 = qv[e] * dq + b * bk, x2 = kv[e] * dki;
      }
      if constexpr (kKDA) s.X1[r * S::kLdE + dl] = x1, s.X2[r * S::kLdE + dl] = x2, s.Bk[r * S::kLdE + dl] = bk;
      else rs[0][e >> 1] += x1, rs[1][e >> 1] += x2, rs[2][e >> 1] += bk;
    }
#pragma unroll
    for (int e = 0; e < 4; e += 2) {  // keys d, d + 1 of row r: one 8-byte store each
      const int r = acc_row(m0, e), d = d0 + acc_col(hb + 8 * nt, e);
      if (r < L) {
        const int64_t o = (int64_t(ck.t0 + r) * p.HV + hv) * KD + d;
        *reinterpret_cast<float2*>(bp.dqv + o) = make_float2(dqk[e], dqk[e + 1]);
        *reinterpret_cast<float2*>(bp.dkv + o) = make_float2(dkk[e], dkk[e + 1]);
      }
    }
  }
  if constexpr (!kKDA) hv_row_sums(s, rs, th);
  if (th.t < S::KW)  // dB_all (gdn: the end gate from the staged gates, no global load)
    s.hdh[th.t] *= exp2f(kKDA ? p.gcum[(int64_t(ck.t0 + L - 1) * p.HV + hv) * KD + d0 + th.t] : s.gsc[L - 1]);
}

// Row r's sum over the half's KW keys of tile X ([64][kLdE]) by the four threads 4 r .. 4 r + 3 of the
// half (a quarter of the keys each, then shuffles): every thread of the half calls it.
template <int KW, int kLdE>
__device__ __forceinline__ float row_sum4(const float* X, int t) {
  constexpr int kQ = KW / 4;
  const int r = t >> 2, q0 = kQ * (t & 3);
  float a = 0.0f;
#pragma unroll
  for (int d = q0; d < q0 + kQ; ++d) a += X[r * kLdE + d];
  a += __shfl_xor_sync(0xffffffffu, a, 1);
  return a + __shfl_xor_sync(0xffffffffu, a, 2);
}

// Gate cumsum backward of the inter terms of one half (kda, gla), first part (every thread of the half;
// four threads per row or key, so that 64 threads do not each walk 64 rows or keys in series): the
// per-key suffix / prefix scans into da and Bk's row sums into red[256 z + 128 + ..]. A block barrier
// follows. (gdn's row sums come from hv_row_sums.)
template <int KD, bool kDelta>
__device__ void hv_gate_rows(const BwdParams& bp, const HvSmem& s, const ChunkInfo& ck, int hv, int d0, const HvThread& th) {
  using S = HvShape<KD, kDelta>;
  const ChunkParams& p = bp.c;
  const int L = ck.len, t = th.t;
  float* red = s.red + 4 * kChunk * th.z;
  const float c = row_sum4<S::KW, S::kLdE>(s.Bk, t);
  {
    // key d = t / 4, rows [16 q, 16 q + 16) for q = t % 4: the quarter's sums, then the other
    // quarters' totals by shuffles (later quarters for the X1 suffix, earlier ones for the X2 prefix)
    const int d = t >> 2, q = t & 3, ra = 16 * q, lane = t & 31;
    const bool own = d < S::KW;
    float A = 0.0f, B = 0.0f;
    if (own)
      for (int r = ra; r < min(ra + 16, L); ++r) A += s.X1[r * S::kLdE + d], B += s.X2[r * S::kLdE + d];
    float suf = 0.0f, pre = own ? s.hdh[d] : 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float Aj = __shfl_sync(0xffffffffu, A, (lane & ~3) + j), Bj = __shfl_sync(0xffffffffu, B, (lane & ~3) + j);
      if (j > q) suf += Aj;
      if (j < q) pre += Bj;
    }
    if (own) {
      for (int r = min(ra + 16, L) - 1; r >= ra; --r) suf += s.X1[r * S::kLdE + d], s.X1[r * S::kLdE + d] = suf;
      for (int r = ra; r < min(ra + 16, L); ++r) {
        bp.da[(int64_t(ck.t0 + r) * p.HV + hv) * KD + d0 + d] = s.X1[r * S::kLdE + d] + pre;
        pre += s.X2[r * S::kLdE + d];
      }
    }
  }
  if ((t & 3) == 0) red[128 + (t >> 2)] = c;
}

// Second part: the partials of row t = th.t of this half (dbeta; gdn's da), vsum = v . dXu of row t (half 0).
template <int KD, bool kKDA, bool kDelta>
__device__ void hv_gate_partials(const BwdParams& bp, const HvSmem& s, const ChunkInfo& ck, int hv, const HvThread& th,
                                 float vsum) {
  using S = HvShape<KD, kDelta>;
  const ChunkParams& p = bp.c;
  const int L = ck.len, t = th.t;
  if (t >= L) return;
  float* pt = bp.part + (int64_t(ck.t0 + t) * p.HV + hv) * kPartSlots;
  float db;
  if constexpr (kKDA) {
    db = s.red[4 * kChunk * th.z + 128 + t];  // rowsum of Bk (hv_gate_rows)
  } else {  // the two key quarters of hv_row_sums: x1 at 0, x2 at 64, bk at 128
    const float* red = s.red + 384 * th.z;
    auto row = [&](int v, int r) { return red[64 * v + r] + red[192 + 64 * v + r]; };
    db = row(2, t);
    float da = 0.0f;
    for (int d = 0; d < S::KW; ++d) da += s.hdh[d];
    for (int r = t; r < L; ++r) da += row(0, r);
    for (int r = 0; r < t; ++r) da += row(1, r);
    pt[kPartDaHv + th.z] = da;
  }
  if (th.z == 0) db += vsum;
  pt[kPartDbetaHv + th.z] = db;
}

// v . dXu of row t = tid (t < 64): the 16 partials of the warps and lanes that own its columns.
__device__ __forceinline__ float reduce_vsum(const HvSmem& s, const float (&vp)[2]) {
  const int W = threadIdx.x >> 5, r0 = 16 * (W & 3) + lane_g(), q = 4 * (W >> 2) + lane_t();
  s.red[r0 * 16 + q] = vp[0], s.red[(r0 + 8) * 16 + q] = vp[1];
  __syncthreads();
  float vsum = 0.0f;
  if (threadIdx.x < kChunk)
    for (int u = 0; u < 16; ++u) vsum += s.red[16 * threadIdx.x + u];
  __syncthreads();
  return vsum;
}

}  // namespace kcp::cuda::hv
