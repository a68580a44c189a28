// Backward stage "chunk", kernel 3 of 3 for kda and gla (a gate per key; gdn: chunk_bwd_intra_gdn.cu):
// the intra-chunk products through dAqk and dL (CPU twin chunk_intra_backward) and the intra part of
// the gate gradient (chunk_intra's da). One block per (chunk,
// HV, K/32 slab), 256 threads, 32 keys [d0, d0 + 32) per block; dA (kernel 1) and dL (kernel 2) as
// 64x64 tiles, q, k, gates as [64][32] slabs, D_rs = 2^(b_r - b_s):
//   dq_r += sum_{s<=r} dA_rs k_s D_rs
//   dk_r += beta_r sum_{s<r} dL_rs k_s D_rs + sum_{t>=r} (dA_tr q_t + dL_tr beta_t k_t) D_tr
//   da_t += sum_{r>=t>s} Z_rs,  Z_rs = (dA_rs q_r + dL_rs beta_r k_r) k_s D_rs   (per key)
// Pairs in different 16-row blocks run as products of the scaled slabs (chunk_bwd_tiles.cuh:
// D_rs = F_r c_ij E_s), by row blocks ("right", output row r) and column blocks ("left", output
// row s); pairs inside a block by the same anchored factors where the block's gate spread allows
// (diag_rows, diag_gate: one thread per (block, key) in each half of the block, no exp2 per pair),
// else with exact exponents (intra_diag, half 0). The gate sum
// over the rectangle r >= t > s splits into: the pairs inside t's block (a running sum), row
// sums of the off-block pairs of the rows r >= t of t's block, column sums of the off-block pairs
// of the columns s < t of t's block, and whole later-by-earlier block pairs. All terms are
// added, none subtracted (no cancellation, as the CPU twin). float32 FMA throughout; the gate factors
// by exp2_approx (one ex2 with 16-bit inputs, exp2f with float32 ones: device_math.cuh).
// gla (kDelta = false, ChunkParams::gla): no WY backward, kernel 2 does not run: dL = 0 and
// beta_e = 0, so every dL term is left out (no dL tile, half the off-block products).
// As the last writer of dq, dk and da it writes them in the outputs' dtypes when BwdParams::direct_qk /
// direct_dg say so (no norm, G = 1; log-decay gate; the outputs asked for), else the float32
// workspace for finish.
// gla's chunks whose gates allow one anchor per chunk are done before, by chunk_bwd_intra_gla.cu's
// kernel (tensor-core products); this kernel skips them (BwdParams::gla_intra_anchored).
// Covered by tests/cuda/test_cuda_backward.cpp (stage "chunk" against the CPU twin, and end to end).
#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_bwd_tiles.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"

namespace kcp::cuda {
namespace {

constexpr int kLdO = 33;  // [64][32] per-key result tiles

struct IntraSmem {
  float *dA, *dL, *q, *k, *g, *qF, *kF, *kE, *RO, *CO, *DQ, *DK, *ST, *Qs, *ct, *bet;
  static constexpr int kTile = kChunk * kLdC, kSl = kChunk * kLdS, kOut = kChunk * kLdO;
  static constexpr int floats = 2 * kTile + 6 * kSl + 2 * kOut + 2 * 16 * kSlab + kPairs * kSlab + 64;
  __device__ explicit IntraSmem(float* s) {
    dA = s, dL = s + kTile, s += 2 * kTile;
    q = s, k = s + kSl, g = s + 2 * kSl, qF = s + 3 * kSl, kF = s + 4 * kSl, kE = s + 5 * kSl;
    RO = qF, CO = qF + kOut, DQ = qF + 2 * kOut;  // after the off-block products (3 kOut <= 3 kSl)
    s += 6 * kSl;
    DK = s, ST = s + kOut, s += 2 * kOut;
    Qs = s, ct = s + 2 * 16 * kSlab, bet = ct + kPairs * kSlab;
  }
};

// Off-block "right" products, rows r = ty + 16 i (i = 1..3), keys 2 tx, 2 tx + 1:
// oq = F_r sum_{j<i} c_ij sum_{s in j} dA_rs kE_s, ol likewise with dL.
template <bool kDelta, bool S>
__device__ void intra_right(const IntraSmem& s, float2 (&oq)[4], float2 (&ol)[4]) {
  const int ty = bwd_ty(), c2 = 2 * bwd_tx();
  float2 aq[4] = {}, al[4] = {};
#pragma unroll
  for (int j = 0; j < 3; ++j) {
    float2 tq[4] = {}, tl[4] = {};
#pragma unroll
    for (int s0 = 16 * j; s0 < 16 * j + 16; s0 += 4) {
      float2 b[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) b[u] = lds2(s.kE + (s0 + u) * kLdS + c2);
#pragma unroll
      for (int i = j + 1; i < 4; ++i) {
        const float4 a = lds4(s.dA + (ty + 16 * i) * kLdC + s0);
        tq[i].x = fmaf(a.x, b[0].x, fmaf(a.y, b[1].x, fmaf(a.z, b[2].x, fmaf(a.w, b[3].x, tq[i].x))));
        tq[i].y = fmaf(a.x, b[0].y, fmaf(a.y, b[1].y, fmaf(a.z, b[2].y, fmaf(a.w, b[3].y, tq[i].y))));
        if constexpr (kDelta) {  // gla: dL = 0
          const float4 l = lds4(s.dL + (ty + 16 * i) * kLdC + s0);
          tl[i].x = fmaf(l.x, b[0].x, fmaf(l.y, b[1].x, fmaf(l.z, b[2].x, fmaf(l.w, b[3].x, tl[i].x))));
          tl[i].y = fmaf(l.x, b[0].y, fmaf(l.y, b[1].y, fmaf(l.z, b[2].y, fmaf(l.w, b[3].y, tl[i].y))));
        }
      }
    }
#pragma unroll
    for (int i = j + 1; i < 4; ++i) {
      const float2 c = lds2(s.ct + pair_index(i, j) * kSlab + c2);
      aq[i].x = fmaf(c.x, tq[i].x, aq[i].x), aq[i].y = fmaf(c.y, tq[i].y, aq[i].y);
      if constexpr (kDelta) al[i].x = fmaf(c.x, tl[i].x, al[i].x), al[i].y = fmaf(c.y, tl[i].y, al[i].y);
    }
  }
  oq[0] = ol[0] = make_float2(0.0f, 0.0f);
#pragma unroll
  for (int i = 1; i < 4; ++i) {
    const int r = ty + 16 * i;
    const float fx = exp2_approx<S>(gate_of<true>(s.g, kLdS, r, c2) - gate_of<true>(s.g, kLdS, 16 * i, c2));
    const float fy = exp2_approx<S>(gate_of<true>(s.g, kLdS, r, c2 + 1) - gate_of<true>(s.g, kLdS, 16 * i, c2 + 1));
    oq[i] = make_float2(fx * aq[i].x, fy * aq[i].y), ol[i] = make_float2(fx * al[i].x, fy * al[i].y);
  }
}

// Off-block "left" products, rows s = ty + 16 j (j = 0..2): E_s sum_{i>j} c_ij sum_{r in i}
// (dA_rs qF_r + beta_r dL_rs kF_r); the later-by-earlier block sums for the gate into Qs.
template <bool kDelta, bool S>
__device__ void intra_left(const IntraSmem& s, int L, float2 (&ot)[4]) {
  const int ty = bwd_ty(), c2 = 2 * bwd_tx();
  float2 E[3], kk[3], acc[3] = {};
#pragma unroll
  for (int j = 0; j < 3; ++j) {
    const int r = ty + 16 * j, a = min(16 * j + 15, L - 1);
    E[j].x = exp2_approx<S>(gate_of<true>(s.g, kLdS, a, c2) - gate_of<true>(s.g, kLdS, r, c2));
    E[j].y = exp2_approx<S>(gate_of<true>(s.g, kLdS, a, c2 + 1) - gate_of<true>(s.g, kLdS, r, c2 + 1));
    kk[j] = lds2(s.k + r * kLdS + c2);
  }
#pragma unroll
  for (int i = 3; i >= 1; --i) {
    float2 t[3] = {};
    for (int r = 16 * i; r < 16 * i + 16; ++r) {
      const float2 bq = lds2(s.qF + r * kLdS + c2), bk = lds2(s.kF + r * kLdS + c2);
      const float be = s.bet[r];
#pragma unroll
      for (int j = 0; j < i; ++j) {
        const float a = s.dA[r * kLdC + ty + 16 * j];
        if constexpr (kDelta) {
          const float l = s.dL[r * kLdC + ty + 16 * j] * be;
          t[j].x = fmaf(a, bq.x, fmaf(l, bk.x, t[j].x));
          t[j].y = fmaf(a, bq.y, fmaf(l, bk.y, t[j].y));
        } else {  // gla: dL = 0
          t[j].x = fmaf(a, bq.x, t[j].x), t[j].y = fmaf(a, bq.y, t[j].y);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < i; ++j) {
      const float2 c = lds2(s.ct + pair_index(i, j) * kSlab + c2);
      acc[j].x = fmaf(c.x, t[j].x, acc[j].x), acc[j].y = fmaf(c.y, t[j].y, acc[j].y);
    }
    if (i >= 2) {  // Q_{i-1}: pairs of blocks > i-1 by blocks < i-1, so far summed
      float2 q = make_float2(0.0f, 0.0f);
#pragma unroll
      for (int j = 0; j < i - 1; ++j)
        q.x = fmaf(kk[j].x * E[j].x, acc[j].x, q.x), q.y = fmaf(kk[j].y * E[j].y, acc[j].y, q.y);
      *reinterpret_cast<float2*>(s.Qs + ((i - 2) * 16 + ty) * kSlab + c2) = q;
    }
  }
#pragma unroll
  for (int j = 0; j < 3; ++j) ot[j] = make_float2(E[j].x * acc[j].x, E[j].y * acc[j].y);
  ot[3] = make_float2(0.0f, 0.0f);
}

// Pairs inside block m for key dl: DQ, DK (with beta), and the running gate sums ST.
template <bool kDelta, bool S>
__device__ void intra_diag(const IntraSmem& s, int L, int m, int dl) {
  const int r0 = 16 * m, r1 = min(r0 + 16, L);
  for (int r = r0; r < r1; ++r) s.DK[r * kLdO + dl] = 0.0f, s.ST[r * kLdO + dl] = 0.0f;
  for (int r = r0; r < r1; ++r) {
    const float qr = s.q[r * kLdS + dl], kr = s.k[r * kLdS + dl], gr = gate_of<true>(s.g, kLdS, r, dl), br = s.bet[r];
    float dq = 0.0f, dkl = 0.0f, run = 0.0f;
    for (int c = r0; c < r; ++c) {
      const float D = exp2_approx<S>(gr - gate_of<true>(s.g, kLdS, c, dl)), kc = s.k[c * kLdS + dl];
      const float a = s.dA[r * kLdC + c], l = kDelta ? s.dL[r * kLdC + c] : 0.0f;  // gla: dL = 0, beta = 0
      dq = fmaf(a * kc, D, dq);
      if constexpr (kDelta) dkl = fmaf(l * kc, D, dkl);
      const float mrs = (kDelta ? fmaf(a, qr, br * l * kr) : a * qr) * D;
      s.DK[c * kLdO + dl] += mrs;
      run = fmaf(mrs, kc, run);
      s.ST[(c + 1) * kLdO + dl] += run;
    }
    const float a = s.dA[r * kLdC + r];
    s.DQ[r * kLdO + dl] = fmaf(a, kr, dq);
    s.DK[r * kLdO + dl] += kDelta ? fmaf(a, qr, br * dkl) : a * qr;
  }
}

// The anchored form of the pairs inside block m (rows r0 = 16 m ..), where every key's gate range
// over the block's rows is <= 64 in log2 units (block_gate_spread, kkt's and wy's rule): D_rc =
// F_r cd E_c with F_r = 2^(g_r - g_r0) <= 1, E_c = 2^(g_a - g_c) <= 1, cd = 2^(g_r0 - g_a) >= 1 (a the
// block's last row), so a pair costs no exp2 and the block's two halves split the work:
//   half 0 (diag_rows): DQ_r = dA_rr k_r + F_r cd sum_{c<r} dA_rc kE_c,
//                       DK_r = dA_rr q_r + beta_r F_r cd sum_{c<r} dL_rc kE_c + E_r sum_{t>r} Y_tr,
//   half 1 (diag_gate): ST_t = sum_{r>=t>c} Y_rc kE_c,   Y_rc = dA_rc qf_r + dL_rc kfb_r,
// with kE_c = k_c E_c, qf_r = q_r F_r cd, kfb_r = beta_r k_r F_r cd (all added, as intra_diag).
// Warp m of each half owns block m, lane dl key dl; the test is warp-uniform.

// Block m's anchors for key dl and kE_c of its rows.
template <bool S>
struct DiagAnchor {
  float g0, ga, cd, ke[16];
  __device__ DiagAnchor(const IntraSmem& s, int L, int r0, int dl) {
    g0 = gate_of<true>(s.g, kLdS, r0, dl), ga = gate_of<true>(s.g, kLdS, min(r0 + 15, L - 1), dl);
    cd = exp2_approx<S>(g0 - ga);
#pragma unroll
    for (int v = 0; v < 16; ++v) ke[v] = s.k[(r0 + v) * kLdS + dl] * exp2_approx<S>(ga - gate_of<true>(s.g, kLdS, r0 + v, dl));
  }
  // F_r cd of row r
  __device__ float fc(const IntraSmem& s, int r, int dl) const { return exp2_approx<S>(gate_of<true>(s.g, kLdS, r, dl) - g0) * cd; }
};

template <bool kDelta, bool S>
__device__ void diag_rows(const IntraSmem& s, int L, int m, int dl) {
  const int r0 = 16 * m;
  const DiagAnchor<S> an(s, L, r0, dl);
  float dkc[16] = {};  // sum over later rows t of Y_tc, column c = r0 + v
#pragma unroll
  for (int u = 0; u < 16; ++u) {
    const int r = r0 + u;
    if (r >= L) continue;
    const float qr = s.q[r * kLdS + dl], kr = s.k[r * kLdS + dl], br = s.bet[r], fc = an.fc(s, r, dl);
    const float qf = qr * fc, kfb = br * kr * fc;
    float dq = 0.0f, dkl = 0.0f;
#pragma unroll
    for (int v = 0; v < u; ++v) {
      const float a = s.dA[r * kLdC + r0 + v];
      dq = fmaf(a, an.ke[v], dq);
      if constexpr (kDelta) {  // gla: dL = 0, beta = 0
        const float l = s.dL[r * kLdC + r0 + v];
        dkl = fmaf(l, an.ke[v], dkl);
        dkc[v] = fmaf(a, qf, fmaf(l, kfb, dkc[v]));
      } else {
        dkc[v] = fmaf(a, qf, dkc[v]);
      }
    }
    const float a = s.dA[r * kLdC + r];
    s.DQ[r * kLdO + dl] = fmaf(a, kr, fc * dq);
    s.DK[r * kLdO + dl] = kDelta ? fmaf(a, qr, br * (fc * dkl)) : a * qr;
  }
#pragma unroll
  for (int v = 0; v < 15; ++v) {  // the column terms (row r0 + 15 has no later row in the block)
    const int c = r0 + v;
    if (c < L) s.DK[c * kLdO + dl] += exp2_approx<S>(an.ga - gate_of<true>(s.g, kLdS, c, dl)) * dkc[v];
  }
}

template <bool kDelta, bool S>
__device__ void diag_gate(const IntraSmem& s, int L, int m, int dl) {
  const int r0 = 16 * m;
  const DiagAnchor<S> an(s, L, r0, dl);
  float st[16] = {};
#pragma unroll
  for (int u = 1; u < 16; ++u) {
    const int r = r0 + u;
    if (r >= L) continue;
    const float fc = an.fc(s, r, dl), qf = s.q[r * kLdS + dl] * fc, kfb = s.bet[r] * s.k[r * kLdS + dl] * fc;
    float run = 0.0f;
#pragma unroll
    for (int v = 0; v < u; ++v) {
      const float a = s.dA[r * kLdC + r0 + v];
      const float y = kDelta ? fmaf(a, qf, s.dL[r * kLdC + r0 + v] * kfb) : a * qf;
      run = fmaf(y, an.ke[v], run);
      st[v + 1] += run;
    }
  }
#pragma unroll
  for (int v = 0; v < 16; ++v)
    if (r0 + v < L) s.ST[(r0 + v) * kLdO + dl] = st[v];
}

// da over the keys of block m, column dl: ST += (prefix of CO) + Q_m + (suffix of RO), all in block m.
__device__ void intra_gate(const IntraSmem& s, int L, int m, int dl) {
  const int r0 = 16 * m, r1 = min(r0 + 16, L);
  float qm = 0.0f;
  if (m == 1 || m == 2)
    for (int u = 0; u < 16; ++u) qm += s.Qs[((m - 1) * 16 + u) * kSlab + dl];
  float pre = 0.0f;
  for (int t = r0; t < r1; ++t) s.ST[t * kLdO + dl] += pre + qm, pre += s.CO[t * kLdO + dl];
  float suf = 0.0f;
  for (int t = r1 - 1; t >= r0; --t) suf += s.RO[t * kLdO + dl], s.ST[t * kLdO + dl] += suf;
}

// Chunk cx, value head hv, key slab z.
template <bool kDelta, bool S>
__device__ void intra_block(const BwdParams& bp, int cx, int hv, int z, float* smem) {
  const ChunkParams& p = bp.c;
  const ChunkInfo ck = chunk_at(p, cx);
  const int d0 = z * kSlab, L = ck.len, h = hv / p.G, K = p.K;
  const int ty = bwd_ty(), c2 = 2 * bwd_tx();
  const int64_t blk = int64_t(cx) * p.HV + hv;
  IntraSmem s(smem);
  copy_rows_async(s.dA, kLdC, bp.dAc + blk * kChunk * kChunk, kChunk, kChunk, 0, kChunk);
  if constexpr (kDelta) copy_rows_async(s.dL, kLdC, bp.Wc + blk * kChunk * kChunk, kChunk, kChunk, 0, kChunk);
  copy_gates_async<true>(s.g, kLdS, p, ck, hv, d0, kSlab);
  load_qk_slabs(s.q, s.k, kLdS, p, ck.t0, h, L, d0);  // while the copies above are in flight
  for (int r = threadIdx.x; r < kChunk; r += kBwdThreads) s.bet[r] = r < L ? p.beta_e[int64_t(ck.t0 + r) * p.HV + hv] : 0.0f;
  cp_async_wait_all();
  __syncthreads();
  build_scaled<S>(s.g, s.k, s.q, s.kF, s.kE, s.qF, s.ct, L);
  __syncthreads();
  float2 oq[4], ol[4], ot[4];
  intra_right<kDelta, S>(s, oq, ol);
  intra_left<kDelta, S>(s, L, ot);
  __syncthreads();  // the scaled slabs are consumed: RO, CO, DQ take their place
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = ty + 16 * i;
    const float2 qv = lds2(s.q + r * kLdS + c2), kv = lds2(s.k + r * kLdS + c2), kb = make_float2(kv.x * s.bet[r], kv.y * s.bet[r]);
    s.RO[r * kLdO + c2] = fmaf(qv.x, oq[i].x, kb.x * ol[i].x);
    s.RO[r * kLdO + c2 + 1] = fmaf(qv.y, oq[i].y, kb.y * ol[i].y);
    s.CO[r * kLdO + c2] = kv.x * ot[i].x, s.CO[r * kLdO + c2 + 1] = kv.y * ot[i].y;
  }
  float2 gq[4], gk[4];  // read-modify-write of dqv, dkv: loaded here, in flight during the in-block pairs
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = min(ty + 16 * i, L - 1);
    const int64_t o = (int64_t(ck.t0 + r) * p.HV + hv) * K + d0 + c2;
    gq[i] = *reinterpret_cast<const float2*>(bp.dqv + o), gk[i] = *reinterpret_cast<const float2*>(bp.dkv + o);
  }
  __syncthreads();
  // In-block pairs: block m = warp % 4, key dl = lane; anchored (diag_rows on half 0, diag_gate on
  // half 1) where the block's gates allow, else exact exponents on half 0 (intra_diag).
  const int half = threadIdx.x >> 7, m = (threadIdx.x >> 5) & 3, dl = threadIdx.x & 31;
  const int r0 = 16 * m, nr = min(16, L - r0);
  const bool anchored = __all_sync(0xffffffffu, block_gate_spread(s.g, r0, dl) <= kMaxAnchorSpread);
  float x[16];  // read-modify-write of da (half 1, per key): loaded before the in-block pairs
  if (half == 1) {
#pragma unroll
    for (int u = 0; u < 16; ++u)
      x[u] = u < nr ? bp.da[(int64_t(ck.t0 + r0 + u) * p.HV + hv) * K + d0 + dl] : 0.0f;
    if (anchored) diag_gate<kDelta, S>(s, L, m, dl);
  } else if (anchored) {
    diag_rows<kDelta, S>(s, L, m, dl);
  } else {
    intra_diag<kDelta, S>(s, L, m, dl);
  }
  __syncthreads();  // DQ, DK, ST complete
  if (half == 1) {
    intra_gate(s, L, m, dl);
    if (bp.direct_dg) {
      with_element_type(bp.dg.dt, [&](auto tag) {  // one dtype switch, outside the row loop
        using To = typename decltype(tag)::type;
        To* y = static_cast<To*>(bp.dg.p) + row_off(bp.dg, ck.t0 + r0, hv) + d0 + dl;
#pragma unroll
        for (int u = 0; u < 16; ++u)
          if (u < nr) y[u * bp.dg.st] = from_float<To>(x[u] + s.ST[(r0 + u) * kLdO + dl]);
      });
    } else {
#pragma unroll
      for (int u = 0; u < 16; ++u)
        if (u < nr) bp.da[(int64_t(ck.t0 + r0 + u) * p.HV + hv) * K + d0 + dl] = x[u] + s.ST[(r0 + u) * kLdO + dl];
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = ty + 16 * i;
    if (r >= L) continue;
    const int64_t o = (int64_t(ck.t0 + r) * p.HV + hv) * K + d0 + c2;
    const float b = s.bet[r];
    const float2 dq = make_float2(gq[i].x + (s.DQ[r * kLdO + c2] + oq[i].x), gq[i].y + (s.DQ[r * kLdO + c2 + 1] + oq[i].y));
    const float2 dk = make_float2(gk[i].x + (s.DK[r * kLdO + c2] + fmaf(b, ol[i].x, ot[i].x)),
                                  gk[i].y + (s.DK[r * kLdO + c2 + 1] + fmaf(b, ol[i].y, ot[i].y)));
    if (bp.direct_qk) {  // G = 1: value head hv is q/k head hv
      store_pair(bp.dq, ck.t0 + r, hv, d0 + c2, dq), store_pair(bp.dk, ck.t0 + r, hv, d0 + c2, dk);
    } else {
      *reinterpret_cast<float2*>(bp.dqv + o) = dq, *reinterpret_cast<float2*>(bp.dkv + o) = dk;
    }
  }
}

// One block per item blockIdx.x = (chunk * HV + hv) * (K/32) + slab: a chunk's slabs run together
// and share its dA (and dL) tiles through L2.
template <bool kDelta, bool S>
__global__ void __launch_bounds__(kBwdThreads, 2) bwd_intra_kernel(const __grid_constant__ BwdParams bp) {
  extern __shared__ __align__(16) float smem[];
  const int nz = bp.c.K / kSlab, blk = int(blockIdx.x) / nz;
  intra_block<kDelta, S>(bp, blk / bp.c.HV, blk % bp.c.HV, int(blockIdx.x) % nz, smem);
}

// gla after chunk_bwd_intra_gla.cu's kernel: one block per 32 consecutive (chunk, head, slab) items,
// doing those it flagged 0 one after the other (a grid of every item's block, nearly all exiting at
// once, would cost more than the few items left).
template <bool S>
__global__ void __launch_bounds__(kBwdThreads, 2) bwd_intra_items_kernel(const __grid_constant__ BwdParams bp) {
  extern __shared__ __align__(16) float smem[];
  const int nz = bp.c.K / kSlab;
  const int64_t n = int64_t(bp.c.NT) * bp.c.HV * nz, first = int64_t(blockIdx.x) * 32, i = first + (threadIdx.x & 31);
  const unsigned todo = __ballot_sync(0xffffffffu, i < n && !bp.gla_intra_anchored[i]);  // the same in every warp
  for (unsigned m = todo; m; m &= m - 1) {
    const int64_t it = first + __ffs(m) - 1;
    intra_block<false, S>(bp, int(it / (int64_t(bp.c.HV) * nz)), int(it / nz % bp.c.HV), int(it % nz), smem);
    __syncthreads();  // shared memory is the next item's
  }
}

}  // namespace

void launch_bwd_intra(const BwdParams& bp, cudaStream_t stream) {
  const ChunkParams& p = bp.c;
  if (!p.kda && !p.gla) return launch_bwd_intra_gdn(bp, stream);  // a scalar gate: products on tensor cores
  const size_t smem = sizeof(float) * IntraSmem::floats;
  const dim3 grid(unsigned(int64_t(p.NT) * p.HV * (p.K / kSlab)));
  dispatch_bool(bwd_split_products(bp), [&](auto split) {  // exp2_approx unless split
    constexpr bool S = decltype(split)::value;
    if (!p.gla) return launch_kernel(bwd_intra_kernel<true, S>, grid, dim3(kBwdThreads), smem, stream, bp);
    if (!bp.Wc) return launch_kernel(bwd_intra_kernel<false, S>, grid, dim3(kBwdThreads), smem, stream, bp);
    // chunks with one anchor first (chunk_bwd_intra_gla.cu), then the items it left
    BwdParams b = bp;
    b.gla_intra_anchored = reinterpret_cast<int*>(bp.Wc);  // gla has no dL: Wc is free
    launch_bwd_intra_gla_anchored(b, stream);
    const dim3 items(unsigned((int64_t(p.NT) * p.HV * (p.K / kSlab) + 31) / 32));
    launch_kernel(bwd_intra_items_kernel<S>, items, dim3(kBwdThreads), smem, stream, b);
  });
}

}  // namespace kcp::cuda
