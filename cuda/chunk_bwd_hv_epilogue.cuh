// Kernel hv's epilogue (chunk_bwd_hv.cu): after the slab loop, per half, from the accumulators of
// the h products (doh = do h^T, xw = -dXu h^T, vdh = vnew dh^T, [L,KW]), per (row r, key d),
// gamma = 2^b_r[d], e = 2^(b_end[d] - b_r[d]):
//   dq = gamma scale doh;  dk = e vdh + beta gamma xw  (-> dqv, dkv; the intra parts are added later)
//   x1 = q dq + beta bk,  x2 = k e vdh,  bk = k gamma xw
//   da_t[d] = sum_{r>=t} x1_r + sum_{r<t} x2_r + 2^b_end rowsum(h dh)
//   dbeta partial = sum_d bk (+ v . dXu)
// gdn sums x1, x2 over the keys, kda and gla scan them per key over the rows: both straight from the
// accumulator layout by shuffles (hv_row_sums; hv_key_scans within a warp's 16 rows, then the four row
// blocks' totals through shared memory, hv_key_da), bk summed per row for dbeta. No tiles: one pass
// and one barrier fewer than tiles summed afterwards (gdn hv 1.92 -> 1.85 ms at T = 32768,
// docs/BENCHMARKS.md).
// q, k (and kda's gates) come from the rows staged in shared memory with the item's first loads where
// kHvQkStaged (16-bit inputs), else from global memory, a tile's loads issued before its conversions.
// Covered by tests/cuda/test_cuda_backward.cpp (stage "chunk" against the CPU twin, and end to end).
#pragma once

#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_bwd_hv_stage.cuh"
#include "cuda/chunk_bwd_hv_tiles.cuh"
#include "cuda/chunk_bwd_tiles.cuh"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda::hv {

template <int NTW>
struct HvAcc {
  float doh[NTW][4], xw[NTW][4], vdh[NTW][4], X[4][4];
};

// Layout of the row sums in s.red, written by hv_row_sums and read by hv_gate_partials: per half z
// (kRowSumsHalf apart) two key quarters w / 4 (kRowSumsQuarter apart), each x1, x2, bk [64] at 64 v.
constexpr int kRowSumsQuarter = 3 * kChunk, kRowSumsHalf = 2 * kRowSumsQuarter;
static_assert(2 * kRowSumsHalf <= HvShape<kChunk, true>::kRed, "the row sums of both halves fit in the reductions area");

// Row sums of x1, x2, bk (gdn) or bk alone (v0 = 2: kda, gla) for rows g, g + 8 of warp w's tile, over
// its KW / 2 keys (quad shuffles), into the layout above: the two key quarters of a row are added by
// hv_gate_partials.
template <int v0>
__device__ __forceinline__ void hv_row_sums(const HvSmem& s, float (&rs)[3][2], const HvThread& th) {
#pragma unroll
  for (int v = v0; v < 3; ++v)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      rs[v][i] += __shfl_xor_sync(0xffffffffu, rs[v][i], 1);
      rs[v][i] += __shfl_xor_sync(0xffffffffu, rs[v][i], 2);
    }
  if (lane_t() == 0) {
    float* red = s.red + kRowSumsHalf * th.z + kRowSumsQuarter * (th.w >> 2) + 16 * (th.w & 3) + lane_g();
#pragma unroll
    for (int v = v0; v < 3; ++v) red[kChunk * v] = rs[v][0], red[kChunk * v + 8] = rs[v][1];
  }
}

// kda, gla: per key (column) of warp w's tile, x1's suffix sums (inclusive) and x2's prefix sums
// (exclusive) over the warp's 16 rows, in place of x1, x2; g-lanes are 4 apart (lane = 4 g + t), rows
// g + 8 follow rows g. Nothing is subtracted (exclusive sums are the inclusive ones of the row before).
template <int NTW>
struct KeyScans {
  float s1[NTW][4], p2[NTW][4];  // accumulator positions: rows g (e < 2), g + 8; columns 2 t + (e & 1)
};
__device__ __forceinline__ float suffix_g(float x, int g) {  // inclusive, over rows g .. 7 of the lane's column
#pragma unroll
  for (int off = 1; off < 8; off *= 2) {
    const float y = __shfl_down_sync(0xffffffffu, x, 4 * off);
    if (g + off < 8) x += y;
  }
  return x;
}
__device__ __forceinline__ float prefix_g(float x, int g) {  // inclusive, over rows 0 .. g
#pragma unroll
  for (int off = 1; off < 8; off *= 2) {
    const float y = __shfl_up_sync(0xffffffffu, x, 4 * off);
    if (g >= off) x += y;
  }
  return x;
}
// The scans, and the warp's column totals (x1 over its 16 rows, x2 likewise) into s.X1 / s.X2 as
// [4 row blocks][KW] for hv_key_da (after a barrier).
template <int NTW, int KW>
__device__ __forceinline__ void hv_key_scans(const HvSmem& s, KeyScans<NTW>& ks, const HvThread& th) {
  const int g = lane_g(), t = lane_t(), rb = th.w & 3, hb = (th.w >> 2) * (KW / 2);
#pragma unroll
  for (int nt = 0; nt < NTW; ++nt)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const float a1 = suffix_g(ks.s1[nt][2 + c], g);                      // rows g + 8 .. 15
      const float a0 = suffix_g(ks.s1[nt][c], g) + __shfl_sync(0xffffffffu, a1, t);  // + rows 8 .. 15
      const float i0 = prefix_g(ks.p2[nt][c], g);                          // rows 0 .. g
      const float u0 = __shfl_sync(0xffffffffu, i0, 28 + t);               // rows 0 .. 7
      const float i1 = prefix_g(ks.p2[nt][2 + c], g) + u0;                 // rows 0 .. g + 8
      const float e0 = __shfl_up_sync(0xffffffffu, i0, 4), e1 = __shfl_up_sync(0xffffffffu, i1, 4);
      const float tot1 = __shfl_sync(0xffffffffu, a0, t), tot2 = __shfl_sync(0xffffffffu, i1, 28 + t);
      ks.s1[nt][c] = a0, ks.s1[nt][2 + c] = a1;
      ks.p2[nt][c] = g > 0 ? e0 : 0.0f, ks.p2[nt][2 + c] = g > 0 ? e1 : u0;
      if (g == 0) {
        const int dl = hb + 8 * nt + 2 * t + c;
        s.X1[rb * KW + dl] = tot1, s.X2[rb * KW + dl] = tot2;
      }
    }
}

// kda, gla, after the barrier that follows hv_key_scans: da[r][d] = sum_{r' >= r} x1 + 2^b_end
// rowsum(h dh)[d] + sum_{r' < r} x2, the other row blocks' totals added (later blocks' x1, earlier
// blocks' x2), stored as pairs of adjacent keys.
template <int KD, int NTW, int KW>
__device__ __forceinline__ void hv_key_da(const BwdParams& bp, const HvSmem& s, const KeyScans<NTW>& ks,
                                          const ChunkInfo& ck, int hv, int d0, const HvThread& th) {
  const ChunkParams& p = bp.c;
  const int rb = th.w & 3, m0 = 16 * rb, hb = (th.w >> 2) * (KW / 2);
#pragma unroll
  for (int nt = 0; nt < NTW; ++nt) {
    float off[2];  // per column: later blocks' x1 + hdh + earlier blocks' x2
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int dl = hb + 8 * nt + 2 * lane_t() + c;
      float later = 0.0f, earlier = 0.0f;
      for (int b = rb + 1; b < 4; ++b) later += s.X1[b * KW + dl];
      for (int b = 0; b < rb; ++b) earlier += s.X2[b * KW + dl];
      off[c] = later + s.hdh[dl] + earlier;
    }
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int r = acc_row(m0, e), d = d0 + acc_col(hb + 8 * nt, e);
      if (r < ck.len)
        *reinterpret_cast<float2*>(bp.da + (int64_t(ck.t0 + r) * p.HV + hv) * KD + d) =
            make_float2(ks.s1[nt][e] + off[0] + ks.p2[nt][e], ks.s1[nt][e + 1] + off[1] + ks.p2[nt][e + 1]);
    }
  }
}

// q and k at this thread's accumulator positions of the tile at (m0, n0) (keys n0 + 2t, + 1 of rows g,
// g + 8): from the staged rows (kStaged) or from global memory, both rows' loads issued before either
// conversion (one round trip a tile; rows past the chunk read its last row, whose values go unused).
template <int KD, bool kStaged>
__device__ __forceinline__ void tile_qk(const ChunkParams& p, const HvSmem& s, const ChunkInfo& ck, int hv, int m0, int n0,
                                        float (&qv)[4], float (&kv)[4]) {
  QkPairBits qb[2], kb[2];
#pragma unroll
  for (int e = 0; e < 4; e += 2) {
    const int r = acc_row(m0, e), d = acc_col(n0, e);
    if constexpr (kStaged) {
      const float2 q2 = staged_qk_pair<KD>(s.qk, 0, r, d, p.q.dt, p.l2norm), k2 = staged_qk_pair<KD>(s.qk, 1, r, d, p.k.dt, p.l2norm);
      qv[e] = q2.x, qv[e + 1] = q2.y, kv[e] = k2.x, kv[e + 1] = k2.y;
    } else {
      const int64_t tt = ck.t0 + min(r, ck.len - 1);
      qb[e / 2] = qk_pair_load(q_rows(p), p.H, tt, hv / p.G, d), kb[e / 2] = qk_pair_load(k_rows(p), p.H, tt, hv / p.G, d);
    }
  }
  if constexpr (!kStaged) {  // braces: nvcc 13 can take what follows an unbraced "if constexpr #pragma" into it
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const float2 q2 = qk_pair_value(qb[e / 2], p.q.dt), k2 = qk_pair_value(kb[e / 2], p.k.dt);
      qv[e] = q2.x, qv[e + 1] = q2.y, kv[e] = k2.x, kv[e + 1] = k2.y;
    }
  }
}

// Epilogue of the h products of one half: dqv, dkv, and the per-element gate / dbeta terms: summed per
// row (gdn, hv_row_sums) or scanned per key (kda, gla: ks, hv_key_scans), bk summed per row.
template <int KD, bool kKDA, bool kDelta, bool kSplit>
__device__ void hv_epilogue(const BwdParams& bp, const HvSmem& s, const HvAcc<HvShape<KD, kDelta>::NTW>& a,
                            const ChunkInfo& ck, int hv, int d0, const HvThread& th,
                            KeyScans<HvShape<KD, kDelta>::NTW>& ks) {
  using S = HvShape<KD, kDelta>;
  const ChunkParams& p = bp.c;
  const int m0 = 16 * (th.w & 3), hb = (th.w >> 2) * (S::KW / 2), L = ck.len;
  float rs[3][2] = {};  // row sums of x1, x2 (gdn), bk
#pragma unroll
  for (int nt = 0; nt < S::NTW; ++nt) {
    float qv[4], kv[4], gr[4], ge[4];  // all loads of this tile first (no store may alias them)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {  // elements e, e + 1: keys d, d + 1 (d even) of one row
      const int rr = min(acc_row(m0, e), L - 1);
      if constexpr (kKDA) {  // gcum rows are K floats: pairs 8-byte aligned
        const int d = d0 + acc_col(hb + 8 * nt, e);
        float2 g2, e2;
        if constexpr (kHvQkStaged<kDelta, kSplit>) {
          const float* gs = staged_gates<KD>(s.qk);
          g2 = *reinterpret_cast<const float2*>(gs + rr * S::ldgc + d), e2 = *reinterpret_cast<const float2*>(gs + (L - 1) * S::ldgc + d);
        } else {
          g2 = *reinterpret_cast<const float2*>(p.gcum + (int64_t(ck.t0 + rr) * p.HV + hv) * KD + d);
          e2 = *reinterpret_cast<const float2*>(p.gcum + (int64_t(ck.t0 + L - 1) * p.HV + hv) * KD + d);
        }
        gr[e] = g2.x, gr[e + 1] = g2.y, ge[e] = e2.x, ge[e + 1] = e2.y;
      } else {
        gr[e] = gr[e + 1] = s.gsc[rr], ge[e] = ge[e + 1] = s.gsc[L - 1];
      }
    }
    tile_qk<KD, kHvQkStaged<kDelta, kSplit>>(p, s, ck, hv, m0, d0 + hb + 8 * nt, qv, kv);
    float dqk[4] = {}, dkk[4] = {};  // dq, dk of the tile, stored in pairs below
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = acc_row(m0, e);
      float x1 = 0.0f, x2 = 0.0f, bk = 0.0f;
      if (r < L) {
        const float gam = exp2_approx<kSplit>(gr[e]), ex = exp2_approx<kSplit>(ge[e] - gr[e]);
        const float dq = gam * p.scale * a.doh[nt][e], dki = ex * a.vdh[nt][e];
        if constexpr (kDelta) {
          const float xwn = -a.xw[nt][e], b = s.bet[r];
          dqk[e] = dq, dkk[e] = dki + b * gam * xwn;
          bk = kv[e] * gam * xwn;
          x1 = qv[e] * dq + b * bk;
        } else {  // gla: beta_e = 0 and no xw = -dXu h^T: no beta terms, no dbeta partials (nothing sums them)
          dqk[e] = dq, dkk[e] = dki, x1 = qv[e] * dq;
        }
        x2 = kv[e] * dki;
      }
      if constexpr (kKDA) ks.s1[nt][e] = x1, ks.p2[nt][e] = x2;
      else rs[0][e >> 1] += x1, rs[1][e >> 1] += x2;
      if constexpr (kDelta) rs[2][e >> 1] += bk;
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
  if constexpr (kDelta) hv_row_sums<kKDA ? 2 : 0>(s, rs, th);  // gla: no row sums (gdn, kda: x1, x2 or bk)
  if constexpr (kKDA) hv_key_scans<S::NTW, S::KW>(s, ks, th);
  if (th.t < S::KW) {  // dB_all (gdn, and kda where staged: the end gate from shared memory)
    float ge;
    if constexpr (!kKDA) ge = s.gsc[L - 1];
    else if constexpr (kHvQkStaged<kDelta, kSplit>) ge = staged_gates<KD>(s.qk)[(L - 1) * S::ldgc + d0 + th.t];
    else ge = p.gcum[(int64_t(ck.t0 + L - 1) * p.HV + hv) * KD + d0 + th.t];
    s.hdh[th.t] *= exp2f(ge);
  }
}

// After the epilogue's barrier: the partials of row t = th.t of this half (dbeta; gdn's da), vsum = v . dXu
// of row t (half 0).
template <int KD, bool kKDA, bool kDelta>
__device__ void hv_gate_partials(const BwdParams& bp, const HvSmem& s, const ChunkInfo& ck, int hv, const HvThread& th,
                                 float vsum) {
  using S = HvShape<KD, kDelta>;
  const ChunkParams& p = bp.c;
  const int L = ck.len, t = th.t;
  if (t >= L) return;
  float* pt = bp.part + (int64_t(ck.t0 + t) * p.HV + hv) * kPartSlots;
  const float* red = s.red + kRowSumsHalf * th.z;  // the two key quarters of hv_row_sums: x1, x2, bk
  auto row = [&](int v, int r) { return red[kChunk * v + r] + red[kRowSumsQuarter + kChunk * v + r]; };
  float db = row(2, t);
  if constexpr (!kKDA) {
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
