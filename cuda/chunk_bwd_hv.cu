// Backward stage "chunk", kernel 1 of 3: the products over the value dimension (CPU twins
// chunk_bwd_dAv's dAqk, chunk_bwd_ht_products, chunk_inter_backward, the dv / dbeta / dk parts of
// chunk_wy_backward and the inter part of chunk_gate_cumsum_backward). Grid (chunks, HV, 2), 256
// threads; block z owns key rows [64 z, 64 z + KW) of h, dh (KW = min(K, 64); with K <= 64 block 1
// owns none). Streaming V in slabs of 32 columns (do, vnew, dvnew, h, dh in shared memory), per chunk:
//   dXu = P^T dvnew                               [L,V]   (P unit lower triangular)
//   dv  = beta dXu,  dbeta += v . dXu             (block 0)
//   doh = do h^T,  xw = -dXu h^T,  vdh = vnew dh^T   [L,KW] (register tiles, float32 FMA)
//   dA  = lower_incl(scale do vnew^T) (block 0),  W1 = dvnew vnew^T (block 1)   [64,64] -> workspace
// Epilogue per (row r, key d), gamma = 2^b_r[d], e = 2^(b_end[d] - b_r[d]):
//   dq = gamma scale doh;  dk = e vdh + beta gamma xw  (-> dqv, dkv; the intra parts are added later)
//   da_t[d] = sum_{r>=t} (q dq + beta k gamma xw)_r + sum_{r<t} (k e vdh)_r + 2^b_end rowsum(h dh)
//   dbeta partial = sum_d k gamma xw (+ v . dXu);  gdn sums da over d: partials in bp.part.
// Covered by tests/cuda/test_cuda_backward.cpp (stage "chunk" against the CPU twin, and end to end).
#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_bwd_tiles.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"

namespace kcp::cuda {
namespace {

constexpr int kLdV = 34;  // [64][32] V slabs read as float2 along a row (2 mod 32 words)

template <int KD>
struct HvShape {
  static constexpr int KW = KD < 64 ? KD : 64;  // key rows per block
  static constexpr int NH = KD / KW;            // blocks that own key rows (1 or 2)
  static constexpr int NJ = KW / 16;            // key columns per thread
  static constexpr int kLdE = KW + 1;           // epilogue tiles [64][KW]
  // floats: P', five V slabs + dXu, scalars; the epilogue tiles reuse the slabs
  static constexpr int slabs = 6 * kChunk * kLdV;
  static constexpr int floats = kChunk * kLdC + (slabs > 3 * kChunk * kLdE ? slabs : 3 * kChunk * kLdE) + 4 * 64 + kBwdThreads;
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
  s += S::floats - kChunk * kLdC - 4 * 64 - kBwdThreads;
  m.bet = s, m.gsc = s + 64, m.hdh = s + 128, m.red = s + 256;
  return m;
}

// dXu for one slab: thread (r = tid / 4) owns 8 columns; dv and v . dXu from block 0.
__device__ float slab_dxu(const BwdParams& bp, const HvSmem& s, const ChunkInfo& ck, int hv, int j0, bool block0) {
  const int r = threadIdx.x >> 2, c0 = (threadIdx.x & 3) * 8, L = ck.len;
  float x[8] = {};
  for (int sr = r; sr < L; ++sr) {
    const float a = s.P[sr * kLdC + r];
#pragma unroll
    for (int u = 0; u < 8; ++u) x[u] = fmaf(a, s.dvn[sr * kLdV + c0 + u], x[u]);
  }
  float vdx = 0.0f;
#pragma unroll
  for (int u = 0; u < 8; ++u) s.dxu[r * kLdV + c0 + u] = x[u];
  if (block0 && r < L) {
    const RowsView& v = bp.c.v;
    for (int u = 0; u < 8; ++u) {
      const int j = j0 + c0 + u;
      if (bp.dv.p) store_any(bp.dv.p, bp.dv.dt, row_off(bp.dv, ck.t0 + r, hv) + j, s.bet[r] * x[u]);
      vdx = fmaf(load_any(v.p, v.dt, row_off(v, ck.t0 + r, hv) + j), x[u], vdx);
    }
  }
  return vdx;
}

struct HvAcc {
  float doh[4][4], xw[4][4], vdh[4][4], X[4][4];
};

// One slab of the products: the three h products (kH) and dA (kX = 0, a = do) or W1 (kX = 1, a = dvnew).
template <int NJ, bool kH, int kX>
__device__ void slab_products(const HvSmem& s, HvAcc& a) {
  const int ty = bwd_ty(), tx = bwd_tx();
#pragma unroll 1
  for (int k = 0; k < kSlab; k += 2) {
    float2 ax[4], bv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) ax[i] = lds2((kX == 0 ? s.dO : s.dvn) + (ty + 16 * i) * kLdV + k);
    if constexpr (kH) {
      float2 axu[4], avn[4], bh[NJ], bdh[NJ];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        axu[i] = lds2(s.dxu + (ty + 16 * i) * kLdV + k);
        avn[i] = lds2(s.vn + (ty + 16 * i) * kLdV + k);
      }
#pragma unroll
      for (int j = 0; j < NJ; ++j) bh[j] = lds2(s.h + (tx + 16 * j) * kLdV + k), bdh[j] = lds2(s.dh + (tx + 16 * j) * kLdV + k);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
          if constexpr (kX == 0) a.doh[i][j] = dot2(ax[i], bh[j], a.doh[i][j]);
          a.xw[i][j] = dot2(axu[i], bh[j], a.xw[i][j]);
          a.vdh[i][j] = dot2(avn[i], bdh[j], a.vdh[i][j]);
        }
      if constexpr (kX == 1) {  // doh needs do, which the W1 block has not loaded into ax
        float2 ado[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) ado[i] = lds2(s.dO + (ty + 16 * i) * kLdV + k);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < NJ; ++j) a.doh[i][j] = dot2(ado[i], bh[j], a.doh[i][j]);
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) bv[j] = lds2(s.vn + (tx + 16 * j) * kLdV + k);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) a.X[i][j] = dot2(ax[i], bv[j], a.X[i][j]);
  }
}

// Epilogue of the h products: dqv, dkv, and the per-element gate / dbeta terms into X1, X2, Bk.
template <int KD, bool kKDA>
__device__ void hv_epilogue(const BwdParams& bp, const HvSmem& s, const HvAcc& a, const ChunkInfo& ck, int hv, int d0) {
  using S = HvShape<KD>;
  const ChunkParams& p = bp.c;
  const int ty = bwd_ty(), tx = bwd_tx(), L = ck.len, h = hv / p.G, Kg = kKDA ? KD : 1;
#pragma unroll
  for (int j = 0; j < S::NJ; ++j) {
    const int dl = tx + 16 * j, d = d0 + dl;
    const float ge = p.gcum[(int64_t(ck.t0 + L - 1) * p.HV + hv) * Kg + (kKDA ? d : 0)];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = ty + 16 * i;
      float x1 = 0.0f, x2 = 0.0f, bk = 0.0f;
      if (r < L) {
        const int64_t tt = ck.t0 + r;
        const float gr = kKDA ? p.gcum[(tt * p.HV + hv) * KD + d] : s.gsc[r];
        const float gam = exp2f(gr), e = exp2f(ge - gr), xwn = -a.xw[i][j], b = s.bet[r];
        const float dq = gam * p.scale * a.doh[i][j], dki = e * a.vdh[i][j];
        const float qv = bp.qn[(tt * p.H + h) * KD + d], kv = bp.kn[(tt * p.H + h) * KD + d];
        bp.dqv[(tt * p.HV + hv) * KD + d] = dq;
        bp.dkv[(tt * p.HV + hv) * KD + d] = dki + b * gam * xwn;
        bk = kv * gam * xwn;
        x1 = qv * dq + b * bk, x2 = kv * dki;
      }
      s.X1[r * S::kLdE + dl] = x1, s.X2[r * S::kLdE + dl] = x2, s.Bk[r * S::kLdE + dl] = bk;
    }
    if (ty == 0) s.hdh[dl] *= exp2f(ge);  // dB_all, owned by (ty 0, tx) = the thread that summed it
  }
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

template <int KD, bool kKDA>
__global__ void __launch_bounds__(kBwdThreads, 2) bwd_hv_kernel(const __grid_constant__ BwdParams bp) {
  using S = HvShape<KD>;
  const ChunkParams& p = bp.c;
  const ChunkInfo ck = p.chunks[blockIdx.x];
  const int hv = blockIdx.y, z = blockIdx.z, L = ck.len, ty = bwd_ty(), tx = bwd_tx();
  const bool has_h = z < S::NH;
  const int d0 = has_h ? z * S::KW : 0;
  const int64_t blk = int64_t(blockIdx.x) * p.HV + hv;
  extern __shared__ __align__(16) float smem[];
  const HvSmem s = carve_hv<KD>(smem);
  const float* Pg = p.P + blk * kChunk * kChunk;
  for (int idx = threadIdx.x; idx < kChunk * kChunk; idx += kBwdThreads) {
    const int a = idx / kChunk, b = idx % kChunk;  // P'[a][b]: unit diagonal, strictly lower P
    s.P[a * kLdC + b] = a == b ? 1.0f : (a > b ? Pg[idx] : 0.0f);
  }
  for (int r = threadIdx.x; r < kChunk; r += kBwdThreads) {
    s.bet[r] = r < L ? p.beta_e[int64_t(ck.t0 + r) * p.HV + hv] : 0.0f;
    s.hdh[r] = 0.0f;
  }
  if constexpr (!kKDA) load_gates<false>(s.gsc, 0, p, ck, hv, 0, 1);
  HvAcc a = {};
  float vdx = 0.0f;
  const float* hS = bp.h + blk * KD * p.V;
  const float* dhS = bp.dh + blk * KD * p.V;
  for (int j0 = 0; j0 < p.V; j0 += kSlab) {
    __syncthreads();  // the previous slab is consumed
    load_rows_any(s.dO, kLdV, bp.d_o, ck.t0, hv, L, j0, kSlab);
    load_rows_f32(s.vn, kLdV, bp.vnew + (int64_t(ck.t0) * p.HV + hv) * p.V, int64_t(p.HV) * p.V, L, j0, kSlab);
    load_rows_f32(s.dvn, kLdV, bp.dvnew + (int64_t(ck.t0) * p.HV + hv) * p.V, int64_t(p.HV) * p.V, L, j0, kSlab);
    if (has_h) {
      load_rows_f32(s.h, kLdV, hS + int64_t(d0) * p.V, p.V, S::KW, j0, kSlab);
      load_rows_f32(s.dh, kLdV, dhS + int64_t(d0) * p.V, p.V, S::KW, j0, kSlab);
    }
    __syncthreads();
    if (has_h) {
      vdx += slab_dxu(bp, s, ck, hv, j0, z == 0);
      if (threadIdx.x < S::KW) {
        float acc = s.hdh[threadIdx.x];
        for (int j = 0; j < kSlab; ++j) acc = fmaf(s.h[threadIdx.x * kLdV + j], s.dh[threadIdx.x * kLdV + j], acc);
        s.hdh[threadIdx.x] = acc;
      }
      __syncthreads();
    }
    if (z == 0) slab_products<S::NJ, true, 0>(s, a);
    else if (has_h) slab_products<S::NJ, true, 1>(s, a);
    else slab_products<S::NJ, false, 1>(s, a);
  }
  // dA (block 0, lower triangle with the diagonal, scaled) or W1 (block 1) to the workspace
  float* X = (z == 0 ? bp.dAc : bp.Wc) + blk * kChunk * kChunk;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = ty + 16 * i, c = tx + 16 * j;
      X[r * kChunk + c] = z == 0 ? (c <= r ? p.scale * a.X[i][j] : 0.0f) : a.X[i][j];
    }
  __syncthreads();  // slabs consumed: the epilogue tiles reuse them
  s.red[threadIdx.x] = vdx;
  __syncthreads();
  float vsum = 0.0f;  // v . dXu of row t = tid: the partials of threads 4t .. 4t+3
  if (threadIdx.x < kChunk)
    for (int u = 0; u < 4; ++u) vsum += s.red[4 * threadIdx.x + u];
  __syncthreads();
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
    constexpr int KD = decltype(kd)::value;
    const size_t smem = sizeof(float) * HvShape<KD>::floats;
    if (p.kda) launch_kernel(bwd_hv_kernel<KD, true>, dim3(p.NT, p.HV, 2), dim3(kBwdThreads), smem, stream, bp);
    else launch_kernel(bwd_hv_kernel<KD, false>, dim3(p.NT, p.HV, 2), dim3(kBwdThreads), smem, stream, bp);
  });
}

}  // namespace kcp::cuda
