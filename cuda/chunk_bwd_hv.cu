// Backward stage "chunk", kernel 1 of 3: the products over the value dimension (CPU twins
// chunk_bwd_dAv's dAqk, chunk_bwd_ht_products, chunk_inter_backward, the dv / dbeta / dk parts of
// chunk_wy_backward and the inter part of chunk_gate_cumsum_backward). Grid (chunks, HV, 2), 256
// threads; block z owns key rows [64 z, 64 z + KW) of h, dh (KW = min(K, 64); with K <= 64 block 1
// owns none). Streaming V in slabs of 32 columns (do, vnew, dvnew, h, dh in shared memory), per chunk:
//   dXu = P^T dvnew                               [L,V]   (P unit lower triangular)
//   dv  = beta dXu,  dbeta += v . dXu             (block 0; gla: dv = dXu = dvnew, P = I, u = v)
//   doh = do h^T,  xw = -dXu h^T,  vdh = vnew dh^T   [L,KW]
//   dA  = lower_incl(scale do vnew^T) (block 0),  W1 = dvnew vnew^T (block 1)   [64,64] -> workspace
// gla (kDelta = false): vnew = v is read from v; P = I and beta_e = 0, so dXu = dvnew, dv = dvnew (a copy), and the xw and
// dbeta terms vanish (beta factors): no P, no P^T dvnew, no dXu h^T, no W1 (kernel wy does not run,
// kernel intra takes dL = 0), no dbeta partials; with K <= 64 block 1 (no key rows) is not launched.
// Every product on tensor cores, mma.sync m16n8k8: split operands (3xTF32, tile_mma.cuh) where
// bwd_split_products says so (float32 inputs), else one TF32 product (chunk_bwd.cuh). Warp w owns
// rows 16 (w % 4) and half of the columns.
// Epilogue per (row r, key d), gamma = 2^b_r[d], e = 2^(b_end[d] - b_r[d]):
//   dq = gamma scale doh;  dk = e vdh + beta gamma xw  (-> dqv, dkv; the intra parts are added later)
//   da_t[d] = sum_{r>=t} (q dq + beta k gamma xw)_r + sum_{r<t} (k e vdh)_r + 2^b_end rowsum(h dh)
//   dbeta partial = sum_d k gamma xw (+ v . dXu);  gdn sums da over d: partials in bp.part.
// Covered by tests/cuda/test_cuda_backward.cpp (stage "chunk" against the CPU twin, and end to end).
#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_bwd_tiles.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda {
namespace {

constexpr int kLdV = kLdS;  // [64][32] V slabs: A fragments (rows) and n-major B fragments, 4 mod 32 words

template <int KD>
struct HvShape {
  static constexpr int KW = KD < 64 ? KD : 64;  // key rows per block
  static constexpr int NH = KD / KW;            // blocks that own key rows (1 or 2)
  static constexpr int NTW = KW / 16;           // 8-column tiles of a warp (its half of KW)
  static constexpr int kLdE = KW + 1;           // epilogue tiles [64][KW]
  // floats: P', five V slabs + dXu, scalars; the epilogue tiles reuse the slabs
  static constexpr int slabs = 6 * kChunk * kLdV;
  static constexpr int floats = kChunk * kLdC + (slabs > 3 * kChunk * kLdE ? slabs : 3 * kChunk * kLdE) + 4 * 64 + 8 * kChunk;
};

struct HvSmem {
  float *P, *dO, *vn, *dvn, *h, *dh, *dxu, *X1, *X2, *Bk, *bet, *gsc, *hdh, *red;
};

template <int KD>
__device__ HvSmem carve_hv(float* s) {
  using S = HvShape<KD>;
  HvSmem m;
  m.P = s, s += kChunk * kLdC;
  m.dO = s, m.vn = s + kChunk * kLdV, m.dvn = s + 2 * kChunk * kLdV, m.h = s + 3 * kChunk * kLdV;
  m.dh = s + 4 * kChunk * kLdV, m.dxu = s + 5 * kChunk * kLdV;
  m.X1 = s, m.X2 = s + kChunk * S::kLdE, m.Bk = s + 2 * kChunk * S::kLdE;
  s += S::floats - kChunk * kLdC - 4 * 64 - 8 * kChunk;
  m.bet = s, m.gsc = s + 64, m.hdh = s + 128, m.red = s + 256;
  return m;
}

// dXu = P^T dvnew for one slab (tensor cores; P stored transposed, s.P[r][s] = P'_sr): warp w owns
// rows 16 (w % 4), columns 16 (w / 4) .. + 15. Block 0 also stores dv = beta dXu and adds v . dXu to
// vp (rows g and g + 8 of the warp's tile).
template <bool S>
__device__ void slab_dxu(const BwdParams& bp, const HvSmem& s, const ChunkInfo& ck, int hv, int j0, bool block0, float (&vp)[2]) {
  const int w = threadIdx.x >> 5, m0 = 16 * (w & 3), L = ck.len;
  float c[2][4] = {};
  for (int k0 = m0; k0 < L; k0 += 8) {  // P'_sr = 0 for s < r
    const FragA<S> a = load_a<S>([&](int m, int k) { return s.P[m * kLdC + k]; }, m0, k0);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
      mma<S>(c[nt], a, load_b<S>([&](int k, int n) { return s.dvn[k * kLdV + n]; }, k0, 16 * (w >> 2) + 8 * nt));
  }
  const RowsView& v = bp.c.v;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = acc_row(m0, e), j = acc_col(16 * (w >> 2) + 8 * nt, e);
      s.dxu[r * kLdV + j] = c[nt][e];
      if (block0 && r < L) {
        if (bp.dv.p) store_any(bp.dv.p, bp.dv.dt, row_off(bp.dv, ck.t0 + r, hv) + j0 + j, s.bet[r] * c[nt][e]);
        vp[e >> 1] = fmaf(load_any(v.p, v.dt, row_off(v, ck.t0 + r, hv) + j0 + j), c[nt][e], vp[e >> 1]);
      }
    }
}

template <int NTW>
struct HvAcc {
  float doh[NTW][4], xw[NTW][4], vdh[NTW][4], X[4][4];
};

// One slab of the products (tensor cores, TF32 or 3xTF32 by S): the three h products (kH) and dA (kX = 0,
// a = do) or W1 (kX = 1, a = dvnew). Warp w: rows 16 (w % 4); h columns (w / 4) KW/2 + 8 nt,
// X columns 32 (w / 4) + 8 nt. gla (kDelta = false): no xw = dXu h^T, no W1.
template <int KW, bool kH, int kX, bool kDelta, bool S>
__device__ void slab_products(const HvSmem& s, HvAcc<KW / 16>& a) {
  constexpr int NTW = KW / 16;
  static_assert(NTW % 2 == 0, "B fragments come in pairs of 8-column tiles");
  constexpr bool kXp = kDelta || kX == 0;  // the X product is needed
  const int w = threadIdx.x >> 5, m0 = 16 * (w & 3), hb = (w >> 2) * (KW / 2), xb = 32 * (w >> 2);
  // Fragments by ldmatrix: the slabs are row-major [64][kLdV] (A: rows of do, dvnew, dXu, vnew) and
  // h, dh, vnew are n-major for B (h^T, dh^T, vnew^T), kLdV = 4 mod 32 words: conflict-free.
#pragma unroll 1
  for (int k0 = 0; k0 < kSlab; k0 += 8) {
    FragA<S> ax;
    if constexpr (kXp) ax = ldm_a_row<S>(kX == 0 ? s.dO : s.dvn, kLdV, m0, k0, false);
    if constexpr (kH) {
      FragA<S> ado, axu;
      if constexpr (kX == 0 && kXp) ado = ax;
      else ado = ldm_a_row<S>(s.dO, kLdV, m0, k0, false);
      if constexpr (kDelta) axu = ldm_a_row<S>(s.dxu, kLdV, m0, k0, false);
      const FragA<S> avn = ldm_a_row<S>(s.vn, kLdV, m0, k0, false);
#pragma unroll
      for (int nt = 0; nt < NTW; nt += 2) {
        FragB<S> bh[2], bdh[2];
        ldm_b_nk2<S>(bh[0], bh[1], s.h, kLdV, k0, hb + 8 * nt, false);
        ldm_b_nk2<S>(bdh[0], bdh[1], s.dh, kLdV, k0, hb + 8 * nt, false);
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          mma<S>(a.doh[nt + u], ado, bh[u]);
          if constexpr (kDelta) mma<S>(a.xw[nt + u], axu, bh[u]);
          mma<S>(a.vdh[nt + u], avn, bdh[u]);
        }
      }
    }
    if constexpr (kXp)
#pragma unroll
      for (int nt = 0; nt < 4; nt += 2) {
        FragB<S> b[2];
        ldm_b_nk2<S>(b[0], b[1], s.vn, kLdV, k0, xb + 8 * nt, false);
        mma<S>(a.X[nt], ax, b[0]);
        mma<S>(a.X[nt + 1], ax, b[1]);
      }
  }
}

// gla, block 0: dv = dvnew (P = I, u = v, no beta) for one slab, rows < L; 8 elements per thread,
// the dtype switch outside the element loop (a loop with store_any per element spilled registers).
__device__ void slab_dv_copy(const BwdParams& bp, const HvSmem& s, const ChunkInfo& ck, int hv, int j0) {
  if (!bp.dv.p) return;
  auto store = [&](auto tag) {
    using To = typename decltype(tag)::type;
    To* dv = static_cast<To*>(bp.dv.p) + row_off(bp.dv, ck.t0, hv) + j0;
#pragma unroll
    for (int i = 0; i < kChunk * kSlab / kBwdThreads; ++i) {
      const int idx = int(threadIdx.x) + i * kBwdThreads, r = idx / kSlab, j = idx % kSlab;
      if (r < ck.len) dv[int64_t(r) * bp.dv.st + j] = from_float<To>(s.dvn[r * kLdV + j]);
    }
  };
  with_element_type(bp.dv.dt, store);
}

// Epilogue of the h products: dqv, dkv, and the per-element gate / dbeta terms into X1, X2, Bk.
template <int KD, bool kKDA>
__device__ void hv_epilogue(const BwdParams& bp, const HvSmem& s, const HvAcc<HvShape<KD>::NTW>& a, const ChunkInfo& ck,
                            int hv, int d0) {
  using S = HvShape<KD>;
  const ChunkParams& p = bp.c;
  const int w = threadIdx.x >> 5, m0 = 16 * (w & 3), hb = (w >> 2) * (S::KW / 2), L = ck.len, h = hv / p.G;
  const int Kg = kKDA ? KD : 1;
#pragma unroll
  for (int nt = 0; nt < S::NTW; ++nt) {
    float qv[4], kv[4], gr[4], ge[4];  // all loads of this tile first (no store may alias them)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {  // elements e, e + 1: keys d, d + 1 (d even) of one row
      const int rr = min(acc_row(m0, e), L - 1), d = d0 + acc_col(hb + 8 * nt, e);
      const int64_t tt = ck.t0 + rr;
      const float2 q2 = qk_pair(q_rows(p), p.H, tt, h, d), k2 = qk_pair(k_rows(p), p.H, tt, h, d);
      qv[e] = q2.x, qv[e + 1] = q2.y, kv[e] = k2.x, kv[e + 1] = k2.y;
      if constexpr (kKDA) {  // gcum rows are K floats: pairs 8-byte aligned
        const float2 g2 = *reinterpret_cast<const float2*>(p.gcum + (tt * p.HV + hv) * KD + d);
        const float2 e2 = *reinterpret_cast<const float2*>(p.gcum + (int64_t(ck.t0 + L - 1) * p.HV + hv) * KD + d);
        gr[e] = g2.x, gr[e + 1] = g2.y, ge[e] = e2.x, ge[e + 1] = e2.y;
      } else {
        gr[e] = gr[e + 1] = s.gsc[rr], ge[e] = ge[e + 1] = s.gsc[L - 1];
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = acc_row(m0, e), dl = acc_col(hb + 8 * nt, e), d = d0 + dl;
      float x1 = 0.0f, x2 = 0.0f, bk = 0.0f;
      if (r < L) {
        const int64_t tt = ck.t0 + r;
        const float gam = exp2f(gr[e]), ex = exp2f(ge[e] - gr[e]), xwn = -a.xw[nt][e], b = s.bet[r];
        const float dq = gam * p.scale * a.doh[nt][e], dki = ex * a.vdh[nt][e];
        bp.dqv[(tt * p.HV + hv) * KD + d] = dq;
        bp.dkv[(tt * p.HV + hv) * KD + d] = dki + b * gam * xwn;
        bk = kv[e] * gam * xwn;
        x1 = qv[e] * dq + b * bk, x2 = kv[e] * dki;
      }
      s.X1[r * S::kLdE + dl] = x1, s.X2[r * S::kLdE + dl] = x2, s.Bk[r * S::kLdE + dl] = bk;
    }
  }
  for (int dl = threadIdx.x; dl < S::KW; dl += kBwdThreads)  // dB_all
    s.hdh[dl] *= exp2f(p.gcum[(int64_t(ck.t0 + L - 1) * p.HV + hv) * Kg + (kKDA ? d0 + dl : 0)]);
}

// Gate cumsum backward of the inter terms (per key column; gdn: summed over the keys, into a
// partial) and the dbeta partial (vsum: v . dXu of row t = tid, block 0).
template <int KD, bool kKDA>
__device__ void hv_gate(const BwdParams& bp, const HvSmem& s, const ChunkInfo& ck, int hv, int d0, int z, float vsum) {
  using S = HvShape<KD>;
  const ChunkParams& p = bp.c;
  const int L = ck.len, t = threadIdx.x;
  if constexpr (kKDA) {
    if (t < S::KW) {
      float suf = 0.0f;
      for (int r = L - 1; r >= 0; --r) suf += s.X1[r * S::kLdE + t], s.X1[r * S::kLdE + t] = suf;
      float pre = s.hdh[t];
      for (int r = 0; r < L; ++r) {
        bp.da[(int64_t(ck.t0 + r) * p.HV + hv) * KD + d0 + t] = s.X1[r * S::kLdE + t] + pre;
        pre += s.X2[r * S::kLdE + t];
      }
    }
  } else if (t < kChunk) {  // row sums first (column t of red: X1, X2, Bk sums of row t)
    float a = 0.0f, b = 0.0f, c = 0.0f;
    for (int d = 0; d < S::KW; ++d) a += s.X1[t * S::kLdE + d], b += s.X2[t * S::kLdE + d], c += s.Bk[t * S::kLdE + d];
    s.red[t] = a, s.red[64 + t] = b, s.red[128 + t] = c;
  }
  __syncthreads();
  if (t < L) {
    float db = 0.0f;
    if constexpr (kKDA) {
      for (int d = 0; d < S::KW; ++d) db += s.Bk[t * S::kLdE + d];
    } else {
      db = s.red[128 + t];
      float da = 0.0f;
      for (int d = 0; d < S::KW; ++d) da += s.hdh[d];
      for (int r = t; r < L; ++r) da += s.red[r];
      for (int r = 0; r < t; ++r) da += s.red[64 + r];
      bp.part[(int64_t(ck.t0 + t) * p.HV + hv) * kPartSlots + kPartDaHv + z] = da;
    }
    if (z == 0) db += vsum;
    bp.part[(int64_t(ck.t0 + t) * p.HV + hv) * kPartSlots + kPartDbetaHv + z] = db;
  }
}

template <int KD, bool kKDA, bool kDelta, bool kSplit>
__global__ void __launch_bounds__(kBwdThreads, 2) bwd_hv_kernel(const __grid_constant__ BwdParams bp) {
  using S = HvShape<KD>;
  const ChunkParams& p = bp.c;
  const ChunkInfo ck = p.chunks[blockIdx.x];
  const int hv = blockIdx.y, z = blockIdx.z, L = ck.len, w = threadIdx.x >> 5;
  const bool has_h = z < S::NH;
  const int d0 = has_h ? z * S::KW : 0;
  const int64_t blk = int64_t(blockIdx.x) * p.HV + hv;
  extern __shared__ __align__(16) float smem[];
  const HvSmem s = carve_hv<KD>(smem);
  if constexpr (kDelta)
    copy_rows_async(s.dO, kLdC, p.P + blk * kChunk * kChunk, kChunk, kChunk, 0, kChunk);  // raw P, staged in the slabs
  if constexpr (!kKDA) copy_gates_async<false>(s.gsc, 0, p, ck, hv, 0, 1);
  for (int r = threadIdx.x; r < kChunk; r += kBwdThreads) {
    s.bet[r] = r < L ? p.beta_e[int64_t(ck.t0 + r) * p.HV + hv] : 0.0f;
    s.hdh[r] = 0.0f;
  }
  cp_async_wait_all();
  __syncthreads();
  if constexpr (kDelta)
    for (int idx = threadIdx.x; idx < kChunk * kChunk; idx += kBwdThreads) {
      const int a = idx % kChunk, b = idx / kChunk;  // P'[a][b]: unit diagonal, strictly lower P; stored transposed
      s.P[b * kLdC + a] = a == b ? 1.0f : (a > b ? s.dO[a * kLdC + b] : 0.0f);
    }
  HvAcc<S::NTW> a = {};
  float vp[2] = {};
  const float* hS = bp.h + blk * KD * p.V;
  const float* dhS = bp.dh + blk * KD * p.V;
  for (int j0 = 0; j0 < p.V; j0 += kSlab) {
    __syncthreads();  // the previous slab is consumed
    if constexpr (kDelta)
      copy_rows_async(s.vn, kLdV, bp.vnew + (int64_t(ck.t0) * p.HV + hv) * p.V, int64_t(p.HV) * p.V, L, j0, kSlab);
    else  // gla: vnew = v, read in its dtype (the recompute does not write vnew)
      load_rows_any<kSlab>(s.vn, kLdV, p.v, ck.t0, hv, L, j0, kSlab);
    if (kDelta || z == 0)  // gla: only block 0 reads dvnew (dv)
      copy_rows_async(s.dvn, kLdV, bp.dvnew + (int64_t(ck.t0) * p.HV + hv) * p.V, int64_t(p.HV) * p.V, L, j0, kSlab);
    if (has_h) {
      copy_rows_async(s.h, kLdV, hS + int64_t(d0) * p.V, p.V, S::KW, j0, kSlab);
      copy_rows_async(s.dh, kLdV, dhS + int64_t(d0) * p.V, p.V, S::KW, j0, kSlab);
    }
    load_rows_any<kSlab>(s.dO, kLdV, bp.d_o, ck.t0, hv, L, j0, kSlab);
    cp_async_wait_all();
    __syncthreads();
    if (has_h) {
      if constexpr (kDelta) slab_dxu<kSplit>(bp, s, ck, hv, j0, z == 0, vp);
      else if (z == 0) slab_dv_copy(bp, s, ck, hv, j0);
      if (threadIdx.x < S::KW) {
        float acc = s.hdh[threadIdx.x];
        for (int j = 0; j < kSlab; ++j) acc = fmaf(s.h[threadIdx.x * kLdV + j], s.dh[threadIdx.x * kLdV + j], acc);
        s.hdh[threadIdx.x] = acc;
      }
      __syncthreads();
    }
    if (z == 0) slab_products<S::KW, true, 0, kDelta, kSplit>(s, a);
    else if (has_h) slab_products<S::KW, true, 1, kDelta, kSplit>(s, a);
    else if constexpr (kDelta) slab_products<S::KW, false, 1, kDelta, kSplit>(s, a);
  }
  // dA (block 0, lower triangle with the diagonal, scaled) or W1 (block 1) to the workspace
  float* X = (z == 0 ? bp.dAc : bp.Wc) + blk * kChunk * kChunk;
  if (kDelta || z == 0)  // gla: no W1
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = acc_row(16 * (w & 3), e), c = acc_col(32 * (w >> 2) + 8 * nt, e);
        X[r * kChunk + c] = z == 0 ? (c <= r ? p.scale * a.X[nt][e] : 0.0f) : a.X[nt][e];
      }
  __syncthreads();  // slabs consumed: the epilogue tiles reuse them
  float vsum = 0.0f;  // row t = tid (gla: no dbeta)
  if constexpr (kDelta) {
    {  // v . dXu of row r: 8 partials, lanes t of the two warps owning rows 16 (w % 4) ..
      const int r0 = 16 * (w & 3) + lane_g(), q = 4 * (w >> 2) + lane_t();
      s.red[r0 * 8 + q] = vp[0], s.red[(r0 + 8) * 8 + q] = vp[1];
    }
    __syncthreads();
    if (threadIdx.x < kChunk)
      for (int u = 0; u < 8; ++u) vsum += s.red[8 * threadIdx.x + u];
    __syncthreads();
  }
  if (!has_h) {
    for (int t = threadIdx.x; t < L; t += kBwdThreads) {
      float* pt = bp.part + (int64_t(ck.t0 + t) * p.HV + hv) * kPartSlots;
      pt[kPartDbetaHv + z] = 0.0f;
      if constexpr (!kKDA) pt[kPartDaHv + z] = 0.0f;
    }
    return;
  }
  hv_epilogue<KD, kKDA>(bp, s, a, ck, hv, d0);
  __syncthreads();
  hv_gate<KD, kKDA>(bp, s, ck, hv, d0, z, vsum);
}

}  // namespace

void launch_bwd_hv(const BwdParams& bp, cudaStream_t stream) {
  const ChunkParams& p = bp.c;
  dispatch_key_dim(p.K, [&](auto kd) {
    dispatch_bool(bwd_split_products(bp), [&](auto split) {
      constexpr int KD = decltype(kd)::value;
      constexpr bool kS = decltype(split)::value;
      const size_t smem = sizeof(float) * HvShape<KD>::floats;
      if (p.gla)  // no block without key rows (it would only write W1 and zero partials)
        launch_kernel(bwd_hv_kernel<KD, true, false, kS>, dim3(p.NT, p.HV, HvShape<KD>::NH), dim3(kBwdThreads), smem, stream, bp);
      else if (p.kda) launch_kernel(bwd_hv_kernel<KD, true, true, kS>, dim3(p.NT, p.HV, 2), dim3(kBwdThreads), smem, stream, bp);
      else launch_kernel(bwd_hv_kernel<KD, false, true, kS>, dim3(p.NT, p.HV, 2), dim3(kBwdThreads), smem, stream, bp);
    });
  });
}

}  // namespace kcp::cuda
