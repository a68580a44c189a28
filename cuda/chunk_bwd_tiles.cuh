// Shared pieces of the backward chunk kernels (chunk_bwd_hv.cu, chunk_bwd_wy.cu, chunk_bwd_intra.cu):
// the thread layout, vector loads from shared memory, and the copies of one chunk's rows into
// shared tiles. 256 threads = 16 x 16: ty = tid / 16, tx = tid % 16. A 64x64 output is owned
// "strided": thread (ty, tx) holds rows ty + 16 i and columns tx + 16 j (i, j < 4), so that the
// 16-row blocks of a chunk map to i and j and every operand row a warp reads is either one of two
// (broadcast) or one of 16 consecutive rows (no bank conflicts with a row stride of 4 mod 32 words
// for float4 reads, 2 mod 32 for float2 reads).
// Gate factors (b: the chunk-local gate cumsum in log2 units, decreasing along the chunk; per
// channel for kda): for rows r in 16-row block i and s in block j < i,
//   2^(b_r - b_s) = F_r * c_ij * E_s,  F_r = 2^(b_r - b_{16i}),  c_ij = 2^(b_{16i} - b_{a_j}),
//   E_s = 2^(b_{a_j} - b_s),  a_j = min(16j + 15, L - 1)  (the last row of block j),
// three factors <= 1: no overflow, and one of them underflows only where the product is below
// 2^-126 anyway (the forward's anchored kkt, chunk_kkt.cu, uses the same idea). Pairs inside one
// block are computed with their exact exponent.
// Covered by tests/cuda/test_cuda_backward.cpp.
#pragma once

#include "cuda/chunk_params.cuh"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda {

constexpr int kBwdThreads = 256;
constexpr int kLdC = 68;  // [64][64] float tiles: rows 16-byte aligned, 4 mod 32 words
constexpr int kLdS = 36;  // [64][32] slabs read as float4 / float2 along a row
constexpr int kSlab = 32;  // columns of a streamed V or K slab
constexpr int kPairs = 6;  // block pairs (i, j), j < i < 4

__device__ __forceinline__ int bwd_ty() { return int(threadIdx.x) >> 4; }
__device__ __forceinline__ int bwd_tx() { return int(threadIdx.x) & 15; }
// Index of the block pair (i, j), j < i: (1,0) (2,0) (2,1) (3,0) (3,1) (3,2).
__host__ __device__ constexpr int pair_index(int i, int j) { return i * (i - 1) / 2 + j; }
__host__ __device__ constexpr int pair_row(int p) { return p < 1 ? 1 : p < 3 ? 2 : 3; }
__host__ __device__ constexpr int pair_col(int p) { return p - pair_index(pair_row(p), 0); }

__device__ __forceinline__ float4 lds4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float2 lds2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float dot4(float4 a, float4 b, float c) {
  c = fmaf(a.x, b.x, c);
  c = fmaf(a.y, b.y, c);
  c = fmaf(a.z, b.z, c);
  return fmaf(a.w, b.w, c);
}
__device__ __forceinline__ float dot2(float2 a, float2 b, float c) { return fmaf(a.y, b.y, fmaf(a.x, b.x, c)); }

// Rows [0, 64) x columns [c0, c0 + ncols) of a float32 row-major array (row r at g + r * ldg) into
// s[r * lds + c] by cp.async (rows >= L zero-filled): issued only, complete after cp_async_wait_all().
// 16-byte aligned: s, g, and lds, ldg, c0, ncols multiples of 4.
__device__ __forceinline__ void copy_rows_async(float* s, int lds, const float* g, int64_t ldg, int L, int c0, int ncols) {
  const int per = ncols / 4;
  for (int idx = threadIdx.x; idx < kChunk * per; idx += kBwdThreads) {
    const int r = idx / per, c = 4 * (idx % per);
    cp_async16(s + r * lds + c, g + (r < L ? r : 0) * ldg + c0 + c, r < L);
  }
}

__device__ __forceinline__ void cp_async_wait_all() {
  cp_async_commit();
  cp_async_wait<0>();
}

// The same from a [B,T,X,D] view of any dtype: rows t0 + r of head x, columns [c0, c0 + ncols)
// (ncols <= kMaxCols), all loads of a thread issued before its stores; complete on return.
template <int kMaxCols>
__device__ __forceinline__ void load_rows_any(float* s, int lds, const RowsView& v, int64_t t0, int x, int L, int c0,
                                              int ncols) {
  constexpr int kMax = kChunk * kMaxCols / kBwdThreads;
  float val[kMax];
#pragma unroll
  for (int u = 0; u < kMax; ++u) {
    const int idx = threadIdx.x + u * kBwdThreads, r = idx / ncols, c = idx % ncols;
    val[u] = (v.p && idx < kChunk * ncols && r < L) ? load_any(v.p, v.dt, row_off(v, t0 + r, x) + c0 + c) : 0.0f;
  }
#pragma unroll
  for (int u = 0; u < kMax; ++u) {
    const int idx = threadIdx.x + u * kBwdThreads;
    if (idx < kChunk * ncols) s[(idx / ncols) * lds + idx % ncols] = val[u];
  }
}

// The chunk's gate cumsum by cp.async: gdn into gs[64] (one per row), kda columns [c0, c0 + ncols)
// into gs[r * lds + c]; rows >= L repeat row L - 1 (finite exponents, factors 1 past the end).
// Complete after cp_async_wait_all().
template <bool kKDA>
__device__ __forceinline__ void copy_gates_async(float* gs, int lds, const ChunkParams& p, const ChunkInfo& ck, int hv, int c0,
                                                 int ncols) {
  if constexpr (kKDA) {
    const int per = ncols / 4;
    for (int idx = threadIdx.x; idx < kChunk * per; idx += kBwdThreads) {
      const int r = idx / per, c = 4 * (idx % per);
      cp_async16(gs + r * lds + c, p.gcum + (int64_t(ck.t0 + min(r, ck.len - 1)) * p.HV + hv) * p.K + c0 + c, true);
    }
  } else {
    for (int r = threadIdx.x; r < kChunk; r += kBwdThreads)
      cp_async4(gs + r, p.gcum + int64_t(ck.t0 + min(r, ck.len - 1)) * p.HV + hv, true);
  }
}

// Gate of row r, column c of a tile loaded by copy_gates_async.
template <bool kKDA>
__device__ __forceinline__ float gate_of(const float* gs, int lds, int r, int c) { return kKDA ? gs[r * lds + c] : gs[r]; }

// Scaled copies of one 32-column slab for the anchored products (see the top of this file):
// kF = k F, kE = k E, qF = q F (q may be null), and c[p * 32 + c] for the six block pairs.
// k, q, gs are [64][kLdS] slabs (gdn: gs[64]); L is the chunk's length.
template <bool kKDA>
__device__ __forceinline__ void build_scaled(const float* gs, const float* k, const float* q, float* kF, float* kE,
                                             float* qF, float* ct, int L) {
  for (int idx = threadIdx.x; idx < kChunk * kSlab; idx += kBwdThreads) {
    const int r = idx / kSlab, c = idx % kSlab, o = r * kLdS + c;
    const float g = gate_of<kKDA>(gs, kLdS, r, c);
    const float F = exp2f(g - gate_of<kKDA>(gs, kLdS, r & ~15, c));
    const float E = exp2f(gate_of<kKDA>(gs, kLdS, min(r | 15, L - 1), c) - g);
    kF[o] = k[o] * F, kE[o] = k[o] * E;
    if (q) qF[o] = q[o] * F;
  }
  for (int idx = threadIdx.x; idx < kPairs * kSlab; idx += kBwdThreads) {
    const int pr = idx / kSlab, c = idx % kSlab, i = pair_row(pr), j = pair_col(pr);
    ct[idx] = exp2f(gate_of<kKDA>(gs, kLdS, 16 * i, c) - gate_of<kKDA>(gs, kLdS, min(16 * j + 15, L - 1), c));
  }
}

}  // namespace kcp::cuda
