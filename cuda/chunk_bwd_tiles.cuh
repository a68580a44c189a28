// Shared pieces of the backward chunk kernels (chunk_bwd_hv.cu, chunk_bwd_wy.cu, chunk_bwd_intra.cu):
// the thread layout, vector loads from shared memory, and the copies of one chunk's rows into
// shared tiles. The global loads of a copy are all issued before the first use of any of them (raw
// bits, converted after: load_bits, QkSlab), so a copy costs one memory round trip, not one per
// element (docs/CUDA.md, measured 2026-11-27). 256 threads = 16 x 16: ty = tid / 16, tx = tid % 16. A 64x64 output is owned
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
#include "cuda/tile_store.cuh"

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
// 16-byte aligned: s, g, and lds, ldg, c0, ncols multiples of 4. NT: the block's threads.
template <int NT = kBwdThreads>
__device__ __forceinline__ void copy_rows_async(float* s, int lds, const float* g, int64_t ldg, int L, int c0, int ncols) {
  const int per = ncols / 4;
  for (int idx = threadIdx.x; idx < kChunk * per; idx += NT) {
    const int r = idx / per, c = 4 * (idx % per);
    cp_async16(s + r * lds + c, g + (r < L ? r : 0) * ldg + c0 + c, r < L);
  }
}

__device__ __forceinline__ void cp_async_wait_all() {
  cp_async_commit();
  cp_async_wait<0>();
}

// The same from a [B,T,X,D] view of any dtype: rows t0 + r of head x, columns [c0, c0 + ncols)
// (ncols <= kMaxCols), each row times rscale[(t0 + r) * rstride] when rscale is given (the L2 norm's
// rstd); complete on return. Every load of a thread (raw bits, load_bits) is issued before the first
// conversion, so the call costs one memory round trip, not one per element.
template <int kMaxCols, bool kScale>
__device__ __forceinline__ void load_rows_bits(float* s, int lds, const RowsView& v, int64_t t0, int x, int L, int c0,
                                               int ncols, const float* rscale, int rstride) {
  constexpr int kMax = kChunk * kMaxCols / kBwdThreads;
  uint32_t bits[kMax];
  float sc[kScale ? kMax : 1];
  // element idx = tid + 256 u at (row r, column c), stepped without a division per element
  const int dr = kBwdThreads / ncols, dc = kBwdThreads % ncols, r0 = int(threadIdx.x) / ncols, c0t = int(threadIdx.x) % ncols;
  int r = r0, c = c0t;
#pragma unroll
  for (int u = 0; u < kMax; ++u) {
    const bool in = v.p && r < kChunk && r < L;
    bits[u] = in ? load_bits(v.p, v.dt, row_off(v, t0 + r, x) + c0 + c) : 0u;  // 0 bits: 0.0 in every code
    if constexpr (kScale) sc[u] = in ? rscale[(t0 + r) * rstride] : 0.0f;
    r += dr, c += dc;
    if (c >= ncols) c -= ncols, ++r;
  }
  r = r0, c = c0t;
#pragma unroll
  for (int u = 0; u < kMax; ++u) {
    const float y = bits_to_float(bits[u], v.dt);
    if (r < kChunk) s[r * lds + c] = kScale ? y * sc[kScale ? u : 0] : y;
    r += dr, c += dc;
    if (c >= ncols) c -= ncols, ++r;
  }
}
// The same, one element at a time (each load waits for its data): for rarely taken paths inside
// kernels at their register bound, where load_rows_any's loads in flight would cost spills on the
// common path too (load_qk_slabs's fallback: 120 bytes of spills in gdn's intra kernel, bwd_intra_gdn_kernel,
// since 4a3e477 part of bwd_wy_intra_gdn_kernel).
template <int kMaxCols>
__device__ __forceinline__ void load_rows_lean(float* s, int lds, const RowsView& v, int64_t t0, int x, int L, int c0,
                                               int ncols, const float* rscale, int rstride) {
  for (int idx = threadIdx.x; idx < kChunk * ncols; idx += kBwdThreads) {
    const int r = idx / ncols, c = idx % ncols;
    float y = 0.0f;
    if (v.p && r < L) {
      y = load_any(v.p, v.dt, row_off(v, t0 + r, x) + c0 + c);
      if (rscale) y *= rscale[(t0 + r) * rstride];
    }
    s[r * lds + c] = y;
  }
}

// Keys d, d + 1 of row (tt, x) of an output in its dtype (BwdParams::direct_qk: kernel intra, gdn's
// and kda / gla's, writes dq, dk itself): one store where the pair is aligned for it (store2), else
// element by element (a view at an odd element offset).
__device__ __forceinline__ void store_pair(const OutRowsView& o, int64_t tt, int x, int d, float2 v) {
  with_element_type(o.dt, [&](auto tag) {
    using To = typename decltype(tag)::type;
    To* y = static_cast<To*>(o.p) + row_off(o, tt, x) + d;
    if (reinterpret_cast<uintptr_t>(y) % (2 * sizeof(To)) == 0) store2(y, v.x, v.y);
    else y[0] = from_float<To>(v.x), y[1] = from_float<To>(v.y);
  });
}

// The backward reads q and k as the forward used them: qn = q rstd_q, kn = k rstd_k with the fused
// L2 norm, else q, k; converted on load (no float32 copy of q and k is kept: 2 TT H K floats).
// Its value equals the forward's (the same float32 product of the same rounded input).
struct QkRows {
  RowsView v;  // by value: no address of a kernel parameter is taken
  const float* rstd;  // [TT,H] or null (no fused norm)
};
__device__ __forceinline__ QkRows q_rows(const ChunkParams& p) { return {p.q, p.l2norm ? p.rstd_q : nullptr}; }
__device__ __forceinline__ QkRows k_rows(const ChunkParams& p) { return {p.k, p.l2norm ? p.rstd_k : nullptr}; }
// Two adjacent keys d, d + 1 (d even) of token tt, head h, in two steps so that a caller issues all
// its loads before the first use: qk_pair_load (raw bits, one 4-byte load for aligned bfloat16, and
// the row's rstd), then qk_pair_value.
struct QkPairBits {
  uint32_t a, b;  // packed: both bfloat16 keys in a; else one element's bits each
  float sc;
  bool packed;
};
__device__ __forceinline__ QkPairBits qk_pair_load(const QkRows& x, int H, int64_t tt, int h, int d) {
  const RowsView& v = x.v;
  const int64_t i = row_off(v, tt, h) + d;
  QkPairBits r;
  r.packed = v.dt == kBF16 && (i & 1) == 0;  // the common case; others element by element
  if (r.packed) r.a = *reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(v.p) + i), r.b = 0;
  else r.a = load_bits(v.p, v.dt, i), r.b = load_bits(v.p, v.dt, i + 1);
  r.sc = x.rstd ? x.rstd[tt * H + h] : 1.0f;
  return r;
}
__device__ __forceinline__ float2 qk_pair_value(const QkPairBits& r, int dt) {
  const float2 y = r.packed ? make_float2(__uint_as_float(r.a << 16), __uint_as_float(r.a & 0xffff0000u))
                            : make_float2(bits_to_float(r.a, dt), bits_to_float(r.b, dt));
  return make_float2(y.x * r.sc, y.y * r.sc);  // sc = 1 without the fused norm: exact
}

// N consecutive elements of one row of a float32, bfloat16 or float16 view at element off, loaded as
// raw words by 16-byte loads (one 8-byte load for four 16-bit ones) and converted after, so that a
// caller issues every load before any use: q / k groups (QkGroup) and kernel hv's do / v slabs
// (chunk_bwd_hv_tiles.cuh SlabPrefetch). The caller checks the alignment (rows_vec16, or its own).
// 16-bit words hold two elements, the lower one in the low half.
template <int N>
__device__ __forceinline__ void load_row_words(uint32_t (&w)[N], const void* p, int dt, int64_t off) {
  static_assert(N == 4 || N == 8, "one or two 16-byte loads of float32");
  if (dt == kF32) {
    const uint4* s = reinterpret_cast<const uint4*>(static_cast<const float*>(p) + off);
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const uint4 y = s[i];
      w[4 * i] = y.x, w[4 * i + 1] = y.y, w[4 * i + 2] = y.z, w[4 * i + 3] = y.w;
    }
  } else if constexpr (N == 4) {
    const uint2 y = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p) + off);
    w[0] = y.x, w[1] = y.y;
  } else {
    const uint4 y = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p) + off);
    w[0] = y.x, w[1] = y.y, w[2] = y.z, w[3] = y.w;
  }
}
template <int N>
__device__ __forceinline__ void row_words_values(const uint32_t (&w)[N], int dt, float (&y)[N]) {
  if (dt == kF32) {
#pragma unroll
    for (int e = 0; e < N; ++e) y[e] = __uint_as_float(w[e]);
    return;
  }
#pragma unroll
  for (int e = 0; e < N / 2; ++e) {
    const uint16_t lo = uint16_t(w[e] & 0xffffu), hi = uint16_t(w[e] >> 16);
    if (dt == kBF16) {
      y[2 * e] = __uint_as_float(uint32_t(lo) << 16), y[2 * e + 1] = __uint_as_float(uint32_t(hi) << 16);
    } else {
      y[2 * e] = __half2float(__ushort_as_half(lo)), y[2 * e + 1] = __half2float(__ushort_as_half(hi));
    }
  }
}

// One thread's 8 elements of one row of q or k (load_row_words), times the row's rstd where the norm
// is fused; also load_rows_vec8's groups (no rstd).
struct QkGroup {
  uint32_t raw[8] = {};
  float sc = 1.0f;
};
__device__ __forceinline__ void qk_group_load(QkGroup& g, const QkRows& x, int H, int64_t tt, int h, int d) {
  load_row_words(g.raw, x.v.p, x.v.dt, row_off(x.v, tt, h) + d);
  if (x.rstd) g.sc = x.rstd[tt * H + h];
}
__device__ __forceinline__ void qk_group_store(const QkGroup& g, int dt, float* o) {
  float y[8];
  row_words_values(g.raw, dt, y);
  *reinterpret_cast<float4*>(o) = make_float4(y[0] * g.sc, y[1] * g.sc, y[2] * g.sc, y[3] * g.sc);
  *reinterpret_cast<float4*>(o + 4) = make_float4(y[4] * g.sc, y[5] * g.sc, y[6] * g.sc, y[7] * g.sc);
}

// load_rows_bits's form for float32, bfloat16 and float16 views whose 8-element groups start 16-byte
// aligned (rows_vec8_ok, c0 % 8 == 0): columns [c0, c0 + kCols) of rows [0, 64) (rows >= L zero) as
// QkGroups, one 16-byte load per group (two for float32), every load issued before the first conversion.
__device__ __forceinline__ bool rows_vec8_ok(const RowsView& v) {
  return (v.dt == kF32 || v.dt == kBF16 || v.dt == kF16) && rows_vec16(v, v.dt == kF32 ? 4 : 8);
}
template <int kCols>
__device__ __forceinline__ void load_rows_vec8(float* s, int lds, const RowsView& v, int64_t t0, int x, int L, int c0) {
  constexpr int kGroups = kCols / 8, kPer = kChunk * kGroups / kBwdThreads;
  static_assert(kPer * kBwdThreads == kChunk * kGroups, "whole groups per thread");
  QkGroup g[kPer];  // zero for rows >= L
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int idx = int(threadIdx.x) + u * kBwdThreads, r = idx / kGroups, c = 8 * (idx % kGroups);
    if (r < L) qk_group_load(g[u], QkRows{v, nullptr}, 0, t0 + r, x, c0 + c);
  }
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int idx = int(threadIdx.x) + u * kBwdThreads, r = idx / kGroups, c = 8 * (idx % kGroups);
    qk_group_store(g[u], v.dt, s + r * lds + c);
  }
}

// Rows [0, 64) x columns [c0, c0 + ncols) of a [B,T,X,D] view of any dtype into s (load_rows_bits),
// by 16-byte groups (load_rows_vec8) where the view and the columns allow and no row scale is asked:
// the element form's per-element address arithmetic and dtype switch were ~20% of dhu_local's
// instructions (ncu, gdn, T = 8192).
template <int kMaxCols>
__device__ __forceinline__ void load_rows_any(float* s, int lds, const RowsView& v, int64_t t0, int x, int L, int c0,
                                              int ncols, const float* rscale = nullptr, int rstride = 0) {
  if constexpr (kMaxCols % 32 == 0) {
    if (!rscale && ncols == kMaxCols && c0 % 8 == 0 && rows_vec8_ok(v)) return load_rows_vec8<kMaxCols>(s, lds, v, t0, x, L, c0);
  }
  if (rscale) load_rows_bits<kMaxCols, true>(s, lds, v, t0, x, L, c0, ncols, rscale, rstride);
  else load_rows_bits<kMaxCols, false>(s, lds, v, t0, x, L, c0, ncols, nullptr, 0);
}

// Rows [0, 64) x keys [c0, c0 + kSlab) of q (unless sq is null) and of k of chunk t0, head h
// (QkRows: the fused norm applied) into sq, sk [r * lds + c], rows >= L zero, in two steps so that a
// caller can have the loads of the next slab in flight while it computes on this one: load() issues
// 16-byte loads (one 8-key group of a row per thread and tensor) where the views allow, which the
// forward's expect_aligned_rows guarantees for 16-bit and float32 inputs of one dtype; store()
// converts them into shared memory (or, where the views do not allow, loads element by element).
// c0 % 8 == 0; lds % 4 == 0. load_qk_slabs: both steps at once (one global round trip).
// Whether q and k allow QkSlab's 16-byte loads (one dtype of 16 or 32 bits, aligned rows).
__device__ __forceinline__ bool qk_rows_vec16(const ChunkParams& p) {
  const int dt = p.q.dt, E = dt == kF32 ? 4 : 8;
  return p.k.dt == dt && (dt == kBF16 || dt == kF16 || dt == kF32) && rows_vec16(p.q, E) && rows_vec16(p.k, E);
}
struct QkSlab {
  QkGroup gq, gk;  // zero for rows >= L
  bool vec = false;
  // vec: qk_rows_vec16(p), evaluated once by a caller that loads several slabs; store() then takes a
  // null sk where with_k was false (dhu_local with dhu_reads_raw_k: no kg to form)
  __device__ void load(const ChunkParams& p, int64_t t0, int h, int L, int c0, bool with_q, bool vec_ok, bool with_k = true) {
    static_assert(kBwdThreads == kChunk * kSlab / 8, "one 8-key group of q and of k per thread");
    vec = vec_ok;
    const int r = int(threadIdx.x) >> 2, c = 8 * (int(threadIdx.x) & 3);  // row r, keys c0 + c .. + 7
    gq = QkGroup{}, gk = QkGroup{};
    if (vec && r < L) {
      if (with_q) qk_group_load(gq, q_rows(p), p.H, t0 + r, h, c0 + c);
      if (with_k) qk_group_load(gk, k_rows(p), p.H, t0 + r, h, c0 + c);
    }
  }
  __device__ void store(float* sq, float* sk, int lds, const ChunkParams& p, int64_t t0, int h, int L, int c0) const {
    if (!vec) {
      const QkRows xq = q_rows(p), xk = k_rows(p);
      if (sq) load_rows_lean<kSlab>(sq, lds, p.q, t0, h, L, c0, kSlab, xq.rstd ? xq.rstd + h : nullptr, p.H);
      if (sk) load_rows_lean<kSlab>(sk, lds, p.k, t0, h, L, c0, kSlab, xk.rstd ? xk.rstd + h : nullptr, p.H);
      return;
    }
    const int r = int(threadIdx.x) >> 2, c = 8 * (int(threadIdx.x) & 3);
    if (sq) qk_group_store(gq, p.q.dt, sq + r * lds + c);
    if (sk) qk_group_store(gk, p.q.dt, sk + r * lds + c);
  }
};
__device__ __forceinline__ void load_qk_slabs(float* sq, float* sk, int lds, const ChunkParams& p, int64_t t0, int h,
                                              int L, int c0) {
  QkSlab x;
  x.load(p, t0, h, L, c0, sq != nullptr, qk_rows_vec16(p));
  x.store(sq, sk, lds, p, t0, h, L, c0);
}

// The chunk's gate cumsum by cp.async: gdn into gs[64] (one per row), kda columns [c0, c0 + ncols)
// into gs[r * lds + c]; rows >= L repeat row L - 1 (finite exponents, factors 1 past the end).
// Complete after cp_async_wait_all(). NT: the block's threads.
template <bool kKDA, int NT = kBwdThreads>
__device__ __forceinline__ void copy_gates_async(float* gs, int lds, const ChunkParams& p, const ChunkInfo& ck, int hv, int c0,
                                                 int ncols) {
  if constexpr (kKDA) {
    const int per = ncols / 4;
    for (int idx = threadIdx.x; idx < kChunk * per; idx += NT) {
      const int r = idx / per, c = 4 * (idx % per);
      cp_async16(gs + r * lds + c, p.gcum + (int64_t(ck.t0 + min(r, ck.len - 1)) * p.HV + hv) * p.K + c0 + c, true);
    }
  } else {
    for (int r = threadIdx.x; r < kChunk; r += NT)
      cp_async4(gs + r, p.gcum + int64_t(ck.t0 + min(r, ck.len - 1)) * p.HV + hv, true);
  }
}

// Gate of row r, column c of a tile loaded by copy_gates_async.
template <bool kKDA>
__device__ __forceinline__ float gate_of(const float* gs, int lds, int r, int c) { return kKDA ? gs[r * lds + c] : gs[r]; }

// Scaled copies of one 32-column slab for the anchored products (see the top of this file):
// kF = k F, kE = k E, qF = q F (q may be null), and c[p * 32 + c] for the six block pairs.
// k, q, gs are [64][kLdS] slabs (a gate per key: kda, gla; gdn's kernels need no anchored
// products); L is the chunk's length.
template <bool S>  // exp2_approx<S> (device_math.cuh)
__device__ __forceinline__ void build_scaled(const float* gs, const float* k, const float* q, float* kF, float* kE,
                                             float* qF, float* ct, int L) {
  for (int idx = threadIdx.x; idx < kChunk * kSlab; idx += kBwdThreads) {
    const int r = idx / kSlab, c = idx % kSlab, o = r * kLdS + c;
    const float g = gate_of<true>(gs, kLdS, r, c);
    const float F = exp2_approx<S>(g - gate_of<true>(gs, kLdS, r & ~15, c));
    const float E = exp2_approx<S>(gate_of<true>(gs, kLdS, min(r | 15, L - 1), c) - g);
    kF[o] = k[o] * F, kE[o] = k[o] * E;
    if (q) qF[o] = q[o] * F;
  }
  for (int idx = threadIdx.x; idx < kPairs * kSlab; idx += kBwdThreads) {
    const int pr = idx / kSlab, c = idx % kSlab, i = pair_row(pr), j = pair_col(pr);
    ct[idx] = exp2_approx<S>(gate_of<true>(gs, kLdS, 16 * i, c) - gate_of<true>(gs, kLdS, min(16 * j + 15, L - 1), c));
  }
}

// acc[j] (+)= X^T dO for one warp's 16 rows [m0, m0 + 16) and its n-tiles n0 + 8 j, over the chunk rows
// k < L: X a row-major float tile read transposed (A row m is X's column m), dO row-major; kTri: X is
// lower triangular (X[k][m] = 0 for k < m: Aqk^T), so rows k < m0 add nothing and are skipped. Split
// operands (3xTF32) when S. dhu_local's A_c and B_c (chunk_bwd_dhu_local.cu) and gla's dv pass's A_c
// (chunk_bwd_dh_gla.cu).
template <bool kTri, bool S, int NT>
__device__ __forceinline__ void transposed_product(const float* X, int ldx, const float* dO, int ldd, int L, int m0, int n0,
                                                   float (&acc)[NT][4]) {
  for (int k0 = kTri ? m0 : 0; k0 < L; k0 += 8) {
    const FragA<S> a = load_a<S, true>([&](int m, int k) { return (!kTri || k >= m) && k < L ? X[k * ldx + m] : 0.0f; }, m0, k0);
#pragma unroll
    for (int j = 0; j < NT; ++j) mma<S>(acc[j], a, load_b<S>([&](int k, int n) { return dO[k * ldd + n]; }, k0, n0 + 8 * j));
  }
}

// The anchored factors apply to 16-row block r0 / 16 for key c when the key's gate spread over the
// block's rows is <= kMaxAnchorSpread (chunk_params.cuh): F_r, E_s (<= 1) and cd (>= 1) then stay
// within 2^+-64. Callers vote over the warp's 32 keys (one warp per block); NaN gates fail the test:
// the exact path.
__device__ __forceinline__ float block_gate_spread(const float* gs, int r0, int c) {
  const float g0 = gate_of<true>(gs, kLdS, r0, c);
  float lo = g0, hi = g0;
#pragma unroll
  for (int r = r0 + 1; r < r0 + 16; ++r) {  // rows >= L repeat row L - 1
    const float g = gate_of<true>(gs, kLdS, r, c);
    lo = fminf(lo, g), hi = fmaxf(hi, g);
  }
  return hi - lo;
}

// The diagonal 16-row blocks of the same anchored products (kernel wy's gated gram of k): cd[i * 32 +
// c] = 2^(g_{16 i} - g_{last row of block i}) for key c of the slab, so that for r, s in block i
// D_rs = F_r cd_i E_s; ok[i]: the block's spread allows it for every key of the slab (else the block
// takes its pairs with exact exponents). Threads 0..127 (warp i: block i).
__device__ __forceinline__ void build_diag(const float* gs, float* cd, int* ok, int L) {
  const int t = threadIdx.x;
  if (t >= 4 * kSlab) return;
  const int i = t / kSlab, c = t % kSlab, r0 = 16 * i;
  const float spread = block_gate_spread(gs, r0, c);
  cd[t] = exp2f(gate_of<true>(gs, kLdS, r0, c) - gate_of<true>(gs, kLdS, min(r0 + 15, L - 1), c));
  const bool all = __all_sync(0xffffffffu, spread <= kMaxAnchorSpread);
  if (c == 0) ok[i] = all;
}

}  // namespace kcp::cuda
