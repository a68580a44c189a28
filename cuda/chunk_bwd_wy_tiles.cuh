// The WY backward's device code (backward stage "chunk", kernel 2 of 3; CPU twin chunk_wy_backward's
// dP, dL, and chunk_intra_backward's dbeta term), shared by kernel wy (chunk_bwd_wy.cu: kda) and gdn's
// fused wy + intra kernel (chunk_bwd_intra_gdn.cu). Per (chunk, value head), 64x64 tiles in shared
// memory, 256 threads:
//   G   = strict_lower(gated gram of k):  G_rs = sum_d k_r[d] k_s[d] 2^(b_r[d] - b_s[d])
//         (gdn: (k_r . k_s) 2^(b_r - b_s), formed here; kda: read, kkt formed it)
//   dP  = strict_lower(W1 (I + Lmat)^T),  Lmat = Diag(beta) G,  W1 = dvnew vnew^T (kernel hv)
//   T   = P^T dP;   dL = -strict_lower(T P^T)   (P unit lower triangular, from kkt)
//   dbeta_e = sum_s dL_rs G_rs                  (kernel hv's partials are added by the sum kernel)
// gdn's gram (raw dots k k^T, the decay applied after) and dP, T and dL as 64x64 products on tensor
// cores (3xTF32 where bwd_split_products says so, else one TF32 product, as the forward's kkt forms
// the same dots); kda's gram is the one kkt formed (ChunkParams::Gk: kept by the forward, or written
// by the backward's recompute).
// Covered by tests/cuda/test_cuda_backward.cpp (stage "chunk" against the CPU twin, and end to end).
#pragma once

#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_bwd_tiles.cuh"

namespace kcp::cuda::wy {

// Four 64x64 tiles (W1 then T, G, dP, P) and a 32-key slab of k in P's place during the gram: 74.5 KB,
// three blocks per multiprocessor (T = P^T dP reads P down its columns, tile_nn, so no P^T tile).
struct WySmem {
  float *W, *G, *X, *P, *k, *bet, *gsc, *red;
  static constexpr int kTile = kChunk * kLdC, kSl = kChunk * kLdS;
  static constexpr int kRegion = kSl > kTile ? kSl : kTile;
  static constexpr int floats = 3 * kTile + kRegion + 128 + kChunk * 17;
  __device__ explicit WySmem(float* s) {
    W = s, G = s + kTile, X = s + 2 * kTile, s += 3 * kTile;
    P = s;  // after the gram
    k = s;  // gdn: a 32-key slab of k during the gram
    s += kRegion;
    bet = s, gsc = bet + 64, red = gsc + 64;
  }
};

// c += A B^T on 64x64 tiles (rows of kLdC floats, 4 mod 32: ldmatrix fragments without bank
// conflicts), on tensor cores (3xTF32 when S): warp w owns rows 16 (w % 4) and the 8-column tiles
// 4 (w / 4) + j; acc[j][e] is element e of tile j (tile_mma.cuh: acc_row, acc_col). kExactA / kExactB:
// that tile holds TF32 values already (no conversion in the fragments unless S). kBRows = false: c += A B
// instead, B read down its columns (B(k, n) = B[k][n]: scalar loads, which ldmatrix cannot give for
// 32-bit words), so that no transposed copy of B is needed (tile_nn).
template <bool S, bool kExactA, bool kExactB, bool kBRows = true>
__device__ __forceinline__ void tile_nt(float (&acc)[4][4], const float* A, const float* B) {
  const int w = threadIdx.x >> 5, m0 = 16 * (w & 3), n0 = 32 * (w >> 2);
#pragma unroll 2
  for (int k0 = 0; k0 < kChunk; k0 += 8) {
    const FragA<S> a = ldm_a_row<S>(A, kLdC, m0, k0, kExactA);
#pragma unroll
    for (int j = 0; j < 4; j += 2) {
      FragB<S> b[2];
      if constexpr (kBRows) {
        ldm_b_nk2<S>(b[0], b[1], B, kLdC, k0, n0 + 8 * j, kExactB);
      } else {
#pragma unroll
        for (int u = 0; u < 2; ++u)
          b[u] = load_b<S, kExactB>([B](int k, int n) { return B[k * kLdC + n]; }, k0, n0 + 8 * (j + u));
      }
      mma<S>(acc[j], a, b[0]);
      mma<S>(acc[j + 1], a, b[1]);
    }
  }
}
template <bool S, bool kExactA, bool kExactB>
__device__ __forceinline__ void tile_nn(float (&acc)[4][4], const float* A, const float* B) {
  tile_nt<S, kExactA, kExactB, false>(acc, A, B);
}
// Row and column of element e of tile j of tile_nt's accumulators.
__device__ __forceinline__ int nt_row(int e) { return acc_row(16 * ((threadIdx.x >> 5) & 3), e); }
__device__ __forceinline__ int nt_col(int j, int e) { return acc_col(32 * (threadIdx.x >> 7) + 8 * j, e); }

// One 32-key slab of gdn's raw gram k k^T on tensor cores, in tile_nt's layout (tiles wholly above
// the diagonal skipped: the strict lower triangle is all that is kept). kExact: the slab holds TF32
// values already (16-bit k without the fused norm's rstd, unsplit: intra_qk_exact), no conversion.
template <bool S, bool kExact>
__device__ __forceinline__ void gram_slab_gdn(float (&acc)[4][4], const WySmem& s) {
  const int w = threadIdx.x >> 5, m0 = 16 * (w & 3), n0 = 32 * (w >> 2);
#pragma unroll
  for (int k0 = 0; k0 < kSlab; k0 += 8) {
    const FragA<S> a = ldm_a_row<S>(s.k, kLdS, m0, k0, kExact);  // kLdS = 4 mod 32
#pragma unroll
    for (int j = 0; j < 4; j += 2) {
      if (n0 + 8 * j >= m0 + 16) continue;
      FragB<S> b[2];
      ldm_b_nk2<S>(b[0], b[1], s.k, kLdS, k0, n0 + 8 * j, kExact);  // B(k, n) = k_n[k]
      mma<S>(acc[j], a, b[0]);
      mma<S>(acc[j + 1], a, b[1]);
    }
  }
}

// gdn's gram over 32-key slabs (the next slab's k loads in flight during this slab's products), the
// decay 2^(b_r - b_c) applied at the end, into s.G (strict lower); the raw products stay in acc (zero
// on entry). The slabs come through registers, so the caller's cp.async copies (the gates, W1, P and
// the fused kernel's dA: ~50 KB a block) stay in flight during the products and are waited for at
// the end, where the decay first reads the gates.
template <int KD, bool kSplit, bool kExact>
__device__ void wy_gram_gdn(const BwdParams& bp, const WySmem& s, const ChunkInfo& ck, int hv, float (&acc)[4][4]) {
  const ChunkParams& p = bp.c;
  const int L = ck.len, h = hv / p.G;
  const bool vec = qk_rows_vec16(p);
  QkSlab next;
  next.load(p, ck.t0, h, L, 0, false, vec);
  for (int d0 = 0; d0 < KD; d0 += kSlab) {
    __syncthreads();
    next.store(nullptr, s.k, kLdS, p, ck.t0, h, L, d0);
    if (d0 + kSlab < KD) next.load(p, ck.t0, h, L, d0 + kSlab, false, vec);
    __syncthreads();
    gram_slab_gdn<kSplit, kExact>(acc, s);
  }
  cp_async_wait_all();
  __syncthreads();
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = nt_row(e), c = nt_col(j, e);
      s.G[r * kLdC + c] = c < r ? acc[j][e] * exp2f(s.gsc[r] - s.gsc[c]) : 0.0f;
    }
}

// kda's gram as kkt formed it (ChunkParams::Gk: anchored products on tensor cores, or exact
// exponents where a block's gate spread forbids the anchor); the entries kkt never wrote (c >= r,
// rows >= L) are zero here.
__device__ inline void load_gram_kda(const ChunkParams& p, const WySmem& s, int64_t blk, int L) {
  copy_rows_async(s.G, kLdC, p.Gk + blk * kChunk * kChunk, kChunk, L, 0, kChunk);
  cp_async_wait_all();
  __syncthreads();
  for (int idx = threadIdx.x; idx < kChunk * kChunk; idx += kBwdThreads) {
    const int r = idx / kChunk, c = idx % kChunk;
    if (c >= r) s.G[r * kLdC + c] = 0.0f;
  }
}

// The WY backward of one (chunk, value head) block: dbeta_e written, dL = -strict_lower(T P'^T) (rows
// < L) left in dl, tile_nt's layout; gdn's raw gram k k^T (before its decay: kernel intra's k k^T
// over the same keys, in the same order) left in gram. s.bet and s.gsc are filled here. kQk (gdn): k's
// slabs hold TF32 values (intra_qk_exact), so the gram's fragments load unconverted.
template <int KD, bool kKDA, bool kSplit, bool kQk = false>
__device__ void wy_backward(const BwdParams& bp, const WySmem& s, const ChunkInfo& ck, int hv, int64_t blk,
                            float (&gram)[4][4], float (&dl)[4][4]) {
  const ChunkParams& p = bp.c;
  const int L = ck.len;
  for (int r = threadIdx.x; r < kChunk; r += kBwdThreads) s.bet[r] = r < L ? p.beta_e[int64_t(ck.t0 + r) * p.HV + hv] : 0.0f;
  if constexpr (!kKDA) copy_gates_async<false>(s.gsc, 0, p, ck, hv, 0, 1);  // waited for after the gram's products
  copy_rows_async(s.W, kLdC, bp.Wc + blk * kChunk * kChunk, kChunk, kChunk, 0, kChunk);  // W1, and raw P into X (both free until dP)
  copy_rows_async(s.X, kLdC, p.P + blk * kChunk * kChunk, kChunk, kChunk, 0, kChunk);
  if constexpr (kKDA) load_gram_kda(p, s, blk, L);
  else wy_gram_gdn<KD, kSplit, kQk>(bp, s, ck, hv, gram);
  __syncthreads();  // the slabs are consumed: P' takes their place
  for (int idx = threadIdx.x; idx < kChunk * kChunk; idx += kBwdThreads) {
    const int a = idx / kChunk, b = idx % kChunk;
    s.P[a * kLdC + b] = a == b ? 1.0f : (a > b ? s.X[a * kLdC + b] : 0.0f);
  }
  __syncthreads();
  float acc[4][4] = {};
  // P' (kkt stores P rounded when the products are not split) and this kernel's dP and T (only ever
  // product operands: stored rounded) need no conversion; W1 and G are also read as values.
  tile_nt<kSplit, false, false>(acc, s.W, s.G);  // sum_t W1_rt G_st
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {  // dP, stored transposed
      const int r = nt_row(e), c = nt_col(j, e);
      s.X[c * kLdC + r] = c < r ? operand_store<kSplit>(s.W[r * kLdC + c] + s.bet[c] * acc[j][e]) : 0.0f;
      acc[j][e] = 0.0f;
    }
  __syncthreads();
  tile_nn<kSplit, true, true>(acc, s.X, s.P);  // element (s, r): sum_m dP_ms P'_mr = T_rs
  __syncthreads();
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s.W[nt_col(j, e) * kLdC + nt_row(e)] = operand_store<kSplit>(acc[j][e]), acc[j][e] = 0.0f;
  __syncthreads();
  tile_nt<kSplit, true, true>(acc, s.W, s.P);  // (T P'^T)_rs = sum_m T_rm P'_sm
  float db[2] = {};  // rows nt_row(0), nt_row(2)
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = nt_row(e), c = nt_col(j, e);
      dl[j][e] = (c < r && r < L) ? -acc[j][e] : 0.0f;
      db[e >> 1] = fmaf(dl[j][e], s.G[r * kLdC + c], db[e >> 1]);
    }
  {  // 8 partials per row: the two warps of a row block, lanes t
    const int q = 4 * (threadIdx.x >> 7) + lane_t();
    s.red[nt_row(0) * 17 + q] = db[0], s.red[nt_row(2) * 17 + q] = db[1];
  }
  __syncthreads();
  if (threadIdx.x < L) {
    float x = 0.0f;
    for (int u = 0; u < 8; ++u) x += s.red[threadIdx.x * 17 + u];
    bp.dbeta_e[int64_t(ck.t0 + threadIdx.x) * p.HV + hv] = x;
  }
}

}  // namespace kcp::cuda::wy
