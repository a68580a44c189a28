// Warp-level tensor-core products for the chunk kernels: mma.sync m16n8k8 with TF32 operands and
// float32 accumulation, fragment loads from shared-memory tiles, and cp.async copies.
//   Fragment layout (PTX ISA, lane = 4*g + t): A[16x8] a0=(g,t) a1=(g+8,t) a2=(g,t+4) a3=(g+8,t+4);
//   B[8x8] b0=(k=t,n=g) b1=(k=t+4,n=g); C[16x8] c_e = (g + 8*(e/2), 2t + e%2).
// Precision: a plain product rounds each operand to TF32 (11 significant bits, unit roundoff 2^-11),
// which is exact for bf16/fp16 inputs. With kSplit ("3xTF32") each operand x is split into
// hi = tf32(x) and lo = tf32(x - hi), and a*b ~ a_hi*b_hi + a_hi*b_lo + a_lo*b_hi: about 21
// significant bits per operand, float32-like; used whenever the inputs are float32.
// Padding rules (4-byte words, conflict-free fragment loads): row-major A (g*ld + t) wants
// ld = 4 mod 32; transposed A and k-major B (t*ld + g) want ld = 8 mod 32 (ld_row / ld_col below).
// Covered by tests/cuda/test_cuda_stages.cpp (every product of every stage).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/device_math.cuh"

namespace kcp::cuda {

// Byte sizes of shared-memory regions, rounded up so the next region starts 16-byte aligned.
constexpr size_t align16(size_t b) { return (b + 15) / 16 * 16; }

// Products split into 3xTF32 exactly when the inputs are float32 (16-bit inputs are exact in TF32).
template <class Tin> constexpr bool kSplitProducts = sizeof(Tin) == 4;


// Leading dimensions (in elements) of shared tiles with n columns of type T, for the two patterns.
template <class T> constexpr int ld_row(int n) { return sizeof(T) == 4 ? n + 4 : n + 8; }
template <class T> constexpr int ld_col(int n) { return n + 8; }

// Round to nearest even (low 13 bits zero; NaN and infinity kept). `cvt.rn` is one F2FP instruction
// on sm_90; `cvt.rna` (ties away) is emulated there with five (FSETP, IADD, LOP3, FSETP, IADD), on
// every operand element of every unsplit product and twice per split one. Covered by
// tests/cuda/test_cuda_tf32.cpp.
__device__ __forceinline__ uint32_t tf32_bits(float x) {
  uint32_t r;
  asm("cvt.rn.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float tf32_round(float x) { return __uint_as_float(tf32_bits(x)); }
// Intermediates that only ever enter products are stored already rounded to TF32 when the products
// are not split (the rounding the tensor core would apply anyway), so loads need no conversion.
template <bool kSplit> __device__ __forceinline__ float operand_store(float x) { return kSplit ? x : tf32_round(x); }

template <int N, bool kSplit>
struct Frag {
  uint32_t hi[N];
  uint32_t lo[kSplit ? N : 1];
  __device__ __forceinline__ void set(int i, float x) {
    hi[i] = tf32_bits(x);
    if constexpr (kSplit) lo[i] = tf32_bits(x - __uint_as_float(hi[i]));
  }
  // x already holds a TF32 value (a 16-bit input, or a value stored rounded): no conversion needed
  // unless the product is split.
  __device__ __forceinline__ void set_exact(int i, float x) {
    if constexpr (kSplit) set(i, x);
    else hi[i] = __float_as_uint(x);
  }
  // Fragments loaded raw by ldmatrix: round (or split) in place.
  __device__ __forceinline__ void finish(bool exact) {
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (kSplit || !exact) set(i, __uint_as_float(hi[i]));
  }
};
template <bool S> using FragA = Frag<4, S>;
template <bool S> using FragB = Frag<2, S>;

__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// c += a * b (small correction terms first, so they are not lost against the large one).
template <bool S>
__device__ __forceinline__ void mma(float (&c)[4], const FragA<S>& a, const FragB<S>& b) {
  if constexpr (S) {
    mma_tf32(c, a.lo, b.hi);
    mma_tf32(c, a.hi, b.lo);
  }
  mma_tf32(c, a.hi, b.hi);
}

__device__ __forceinline__ int lane_g() { return (threadIdx.x & 31) >> 2; }
__device__ __forceinline__ int lane_t() { return threadIdx.x & 3; }

// A[16x8] at (m0,k0) from any element function f(m, k); kExact: f returns TF32 values already.
template <bool S, bool kExact = false, class F>
__device__ __forceinline__ FragA<S> load_a(F&& f, int m0, int k0) {
  const int g = lane_g(), t = lane_t();
  FragA<S> a;
  const float v[4] = {f(m0 + g, k0 + t), f(m0 + g + 8, k0 + t), f(m0 + g, k0 + t + 4), f(m0 + g + 8, k0 + t + 4)};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (kExact) a.set_exact(i, v[i]);
    else a.set(i, v[i]);
  }
  return a;
}
// B[8x8] at (k0,n0) from any element function f(k, n); kExact: f returns TF32 values already.
template <bool S, bool kExact = false, class F>
__device__ __forceinline__ FragB<S> load_b(F&& f, int k0, int n0) {
  const int g = lane_g(), t = lane_t();
  FragB<S> b;
  const float v[2] = {f(k0 + t, n0 + g), f(k0 + t + 4, n0 + g)};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if constexpr (kExact) b.set_exact(i, v[i]);
    else b.set(i, v[i]);
  }
  return b;
}

// A(m,k) = s[m*ld + k] (row-major tile).
template <bool S, bool kExact = false, class T>
__device__ __forceinline__ FragA<S> load_a_row(const T* s, int ld, int m0, int k0) {
  return load_a<S, kExact>([&](int m, int k) { return to_float(s[m * ld + k]); }, m0, k0);
}
// A(m,k) = s[k*ld + m] (the tile holds A transposed).
template <bool S, bool kExact = false, class T>
__device__ __forceinline__ FragA<S> load_a_col(const T* s, int ld, int m0, int k0) {
  return load_a<S, kExact>([&](int m, int k) { return to_float(s[k * ld + m]); }, m0, k0);
}
// B(k,n) = s[k*ld + n] (k-major tile).
template <bool S, class T>
__device__ __forceinline__ FragB<S> load_b_kn(const T* s, int ld, int k0, int n0) {
  return load_b<S>([&](int k, int n) { return to_float(s[k * ld + n]); }, k0, n0);
}
// B(k,n) = s[n*ld + k] (n-major tile, e.g. K^T from row-major K).
template <bool S, class T>
__device__ __forceinline__ FragB<S> load_b_nk(const T* s, int ld, int k0, int n0) {
  return load_b<S>([&](int k, int n) { return to_float(s[n * ld + k]); }, k0, n0);
}

// ldmatrix on 32-bit data: an 8x8 b16 matrix is an 8-row x 4-word tile, and lane 4g+t receives
// word t of row g, which is exactly the TF32 fragment element (g, t). Row addresses must be 16-byte
// aligned; ld = 4 mod 32 words keeps the 8 rows of each matrix on distinct banks.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const float* row_addr) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row_addr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const float* row_addr) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row_addr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}
// A[16x8] at (m0,k0) of a float tile whose element (r, c) is at(r, c) (16-byte aligned groups of
// four columns; rows of one group on distinct banks). `exact`: values are already TF32.
template <bool S, class At>
__device__ __forceinline__ FragA<S> ldm_a_at(At at, int m0, int k0, bool exact) {
  const int l = threadIdx.x & 31;
  FragA<S> a;
  const int r = m0 + (l & 7) + ((l >> 3) & 1) * 8, c = k0 + (l >> 4) * 4;
  ldmatrix_x4(a.hi, at(r, c));
  a.finish(exact);
  return a;
}
// ... of a row-major float tile (ld = 4 mod 32).
template <bool S>
__device__ __forceinline__ FragA<S> ldm_a_row(const float* s, int ld, int m0, int k0, bool exact) {
  return ldm_a_at<S>([s, ld](int r, int c) { return s + r * ld + c; }, m0, k0, exact);
}
// B fragments of two adjacent n-tiles (n0, n0+8) at k0 from a float tile stored n-major, BT[n][k] =
// B(k,n) at at(n, k) (as ldm_a_at).
template <bool S, class At>
__device__ __forceinline__ void ldm_b_nk2_at(FragB<S>& b0, FragB<S>& b1, At at, int k0, int n0, bool exact) {
  const int l = threadIdx.x & 31;
  uint32_t r[4];
  const int n = n0 + (l & 7) + (l >> 4) * 8, k = k0 + ((l >> 3) & 1) * 4;
  ldmatrix_x4(r, at(n, k));
  b0.hi[0] = r[0], b0.hi[1] = r[1], b1.hi[0] = r[2], b1.hi[1] = r[3];
  b0.finish(exact), b1.finish(exact);
}
// ... of a row-major BT (ld = 4 mod 32).
template <bool S>
__device__ __forceinline__ void ldm_b_nk2(FragB<S>& b0, FragB<S>& b1, const float* s, int ld, int k0, int n0, bool exact) {
  ldm_b_nk2_at<S>(b0, b1, [s, ld](int n, int k) { return s + n * ld + k; }, k0, n0, exact);
}
template <bool S>
__device__ __forceinline__ FragB<S> ldm_b_nk(const float* s, int ld, int k0, int n0, bool exact) {
  const int l = threadIdx.x & 31;
  FragB<S> b;
  ldmatrix_x2(b.hi, s + (n0 + (l & 7)) * ld + k0 + ((l >> 3) & 1) * 4);
  b.finish(exact);
  return b;
}

// The A fragment from one x2 ldmatrix of a 16-bit tile in the permuted k order: each 16-bit value
// widened to float bits (exact, hence exact in TF32); position t from the low halves, t+2 (of each
// register pair) from the high halves.
template <class T>
__device__ __forceinline__ FragA<false> frag_a_from_x2(const uint32_t (&r)[2]) {
  auto widen = [](uint32_t bits16) {
    if constexpr (std::is_same_v<T, __half>) return __float_as_uint(__half2float(__ushort_as_half((unsigned short)bits16)));
    else return bits16 << 16;
  };
  FragA<false> f;
  f.hi[0] = widen(r[0] & 0xffffu), f.hi[2] = widen(r[0] >> 16);
  f.hi[1] = widen(r[1] & 0xffffu), f.hi[3] = widen(r[1] >> 16);
  return f;
}

// A[16x8] at (m0,k0) with A(m,k) = s[k*ld + m] from a 16-bit tile (k^T out of row-major k) by one
// ldmatrix.trans, with the k positions permuted: fragment position t holds k0+2t and position t+4
// holds k0+2t+1. Only valid with B fragments stored under the same permutation (perm_pos below).
template <class T>
__device__ __forceinline__ FragA<false> ldm_a_col16_perm(const T* s, int ld, int m0, int k0) {
  static_assert(sizeof(T) == 2, "16-bit tiles only");
  const int l = threadIdx.x & 31;
  uint32_t r[2];
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(s + (k0 + (l & 7)) * ld + m0 + ((l >> 3) & 1) * 8));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
  return frag_a_from_x2<T>(r);
}
// A[16x8] at (m0,k0) of a row-major 16-bit tile with the same permuted k order: fragment position t
// holds column k0+2t and t+4 holds k0+2t+1 (one ldmatrix, no transpose). The _lane form takes the
// lane's row (ldm_row16_lane) once, for loops over k0 whose addresses are then one add apart.
template <class T>
__device__ __forceinline__ const T* ldm_row16_lane(const T* s, int ld, int m0) {
  const int l = threadIdx.x & 31;
  return s + (m0 + (l & 7) + ((l >> 3) & 1) * 8) * ld;
}
template <class T>
__device__ __forceinline__ FragA<false> ldm_a_row16_perm_lane(const T* lane_row, int k0) {
  static_assert(sizeof(T) == 2, "16-bit tiles only");
  uint32_t r[2];
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(lane_row + k0));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
  return frag_a_from_x2<T>(r);
}
template <class T>
__device__ __forceinline__ FragA<false> ldm_a_row16_perm(const T* s, int ld, int m0, int k0) {
  return ldm_a_row16_perm_lane(ldm_row16_lane(s, ld, m0), k0);
}

// acc += X Y for one warp's rows [mw, mw + 16) and NTW 8-column n-tiles from column c0: X [16+][KD]
// row-major floats (ld = 4 mod 32, by ldmatrix; kExact: already TF32, or split), Y [KD][ldy] k-major
// floats already TF32 (round_own_rows_tf32) unless split. gla's output and dvnew passes.
template <bool S, bool kExact, int KD, int NTW>
__device__ __forceinline__ void rows_times_tile(const float* X, int ldx, const float* Y, int ldy, int mw, int c0,
                                                float (&acc)[NTW][4]) {
#pragma unroll 4
  for (int k0 = 0; k0 < KD; k0 += 8) {
    const FragA<S> fa = ldm_a_row<S>(X, ldx, mw, k0, kExact);
#pragma unroll
    for (int nt = 0; nt < NTW; ++nt)
      mma(acc[nt], fa, load_b<S, true>([&](int k, int n) { return Y[k * ldy + n]; }, k0, c0 + 8 * nt));
  }
}

// Raw 16-bit ldmatrix, four 8x8 matrices: lane l gives the address of row l%8 of matrix l/8 (16-byte
// aligned); lane 4g+t receives elements (row g; columns 2t, 2t+1) of each, lower address low.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* row_addr) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row_addr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
// The same with .trans: lane 4g+t receives elements (rows 2t, 2t+1; column g) of each matrix, the
// lower row in the low half: for a [k][n] tile, the B fragment (b0, b1) of an m16n8k8 product in
// the k order where position t holds row 2t and t+4 holds row 2t+1 (chunk_state_gla.cu).
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* row_addr) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row_addr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
// Two matrices (lanes 0-15 give the row addresses), the same layout.
__device__ __forceinline__ void ldsm_x2_trans(uint32_t (&r)[2], const void* row_addr) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row_addr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}
// c += a b, m16n8k16 with 16-bit operands (T = __half or __nv_bfloat16) and float32 accumulation:
// products of 16-bit values are exact in float32, so on 16-bit inputs this equals the TF32 product.
template <class T>
__device__ __forceinline__ void mma_16bit(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The two 16-bit values of a packed pair as float bits (exact, hence exact TF32 operands).
template <class T>
__device__ __forceinline__ uint32_t widen_lo(uint32_t w) {
  if constexpr (std::is_same_v<T, __half>) return __float_as_uint(__half2float(__ushort_as_half((unsigned short)(w & 0xffffu))));
  else return w << 16;
}
template <class T>
__device__ __forceinline__ uint32_t widen_hi(uint32_t w) {
  if constexpr (std::is_same_v<T, __half>) return __float_as_uint(__half2float(__ushort_as_half((unsigned short)(w >> 16))));
  else return w & 0xffff0000u;
}

// Storage position inside an 8-row k block that makes plain B fragments match ldm_a_col16_perm.
__device__ __forceinline__ int perm_pos(int k) { return (k & ~7) + ((k & 7) >> 1) + ((k & 1) << 2); }

// Row and column of accumulator element e of the C fragment at (m0, n0).
__device__ __forceinline__ int acc_row(int m0, int e) { return m0 + lane_g() + 8 * (e >> 1); }
__device__ __forceinline__ int acc_col(int n0, int e) { return n0 + 2 * lane_t() + (e & 1); }

// cp.async: 16 bytes (or 4), zero-filled when !valid (src is then never read, but must be mapped).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(s), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }

// The 16-byte segments of kRows rows x kBytes that thread tid (default threadIdx.x) of kThreads takes:
// f(row, segment) for each, in a fixed order (unrolled: the addresses are one add apart).
template <int kRows, int kBytes, int kThreads, class F>
__device__ __forceinline__ void for_own_segments(F&& f, int tid) {
  constexpr int segs = kBytes / 16, n = (kRows * segs + kThreads - 1) / kThreads;
#pragma unroll
  for (int i = 0; i < n; ++i) {
    const int idx = tid + i * kThreads, r = idx / segs, sg = idx % segs;
    if (n * kThreads > kRows * segs && idx >= kRows * segs) break;
    f(r, sg);
  }
}

// 16-byte cp.async copies of kRows rows x kBytes by kThreads threads, row r from src + r * stride
// (elements) to dst + r * ld; rows >= L are zero-filled. Each thread's (row, segment) pairs are
// fixed (for_own_segments); where the segments of a row divide the threads, a thread copies one
// segment column of rows r0, r0 + kThreads/segs, ... (the same pairs), so its addresses are computed
// once and stepped by a constant: in gla's chain the general form's copies, each address computed
// anew, were 186 of its 403 warp instructions per chunk step (ncu, eleventh session).
// kFull: the caller knows L >= kRows (no row test, no zero-fill address select: a full chunk).
// tid: the copying thread's index among the kThreads (a loader warpgroup's threads count from 0).
template <int kRows, int kBytes, int kThreads, bool kFull = false, class T>
__device__ __forceinline__ void copy_rows_async(T* dst, int ld, int L, const T* src, int stride, int tid) {
  constexpr int segs = kBytes / 16, per = 16 / int(sizeof(T));
  if constexpr (kThreads % segs == 0 && (kRows * segs) % kThreads == 0) {
    constexpr int rpp = kThreads / segs;  // rows per pass
    const int r0 = tid / segs, sg = tid % segs;
    const T* s0 = src + sg * per;  // row 0: the address of a zero-filled copy (never read)
    const T* s = s0 + r0 * stride;
    dst += r0 * ld + sg * per;
#pragma unroll
    for (int i = 0; i < kRows / rpp; ++i) {
      const bool valid = kFull || r0 + i * rpp < L;
      cp_async16(dst + i * rpp * ld, valid ? s : s0, valid);
      s += rpp * stride;
    }
  } else {
    for_own_segments<kRows, kBytes, kThreads>(
        [&](int r, int sg) {
          const bool valid = kFull || r < L;
          cp_async16(dst + r * ld + sg * per, src + (valid ? r * stride : 0) + sg * per, valid);
        },
        tid);
  }
}
template <int kRows, int kBytes, int kThreads, bool kFull = false, class T>
__device__ __forceinline__ void copy_rows_async(T* dst, int ld, int L, const T* src, int stride) {
  copy_rows_async<kRows, kBytes, kThreads, kFull>(dst, ld, L, src, stride, int(threadIdx.x));
}

// After this thread's cp.async wait: the float segments it copied with copy_rows_async (same kRows,
// kBytes, kThreads) rounded to TF32 in place, so every fragment load of them needs no conversion.
template <int kRows, int kBytes, int kThreads>
__device__ __forceinline__ void round_own_rows_tf32(float* dst, int ld) {
  for_own_segments<kRows, kBytes, kThreads>(
      [&](int r, int sg) {
        float4* x = reinterpret_cast<float4*>(dst + r * ld + 4 * sg);
        const float4 v = *x;
        *x = make_float4(tf32_round(v.x), tf32_round(v.y), tf32_round(v.z), tf32_round(v.w));
      },
      int(threadIdx.x));
}
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

}  // namespace kcp::cuda
