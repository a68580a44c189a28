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

#include "cuda/device_math.cuh"

namespace kcp::cuda {

// Products split into 3xTF32 exactly when the inputs are float32 (16-bit inputs are exact in TF32).
template <class Tin> constexpr bool kSplitProducts = sizeof(Tin) == 4;

// Leading dimensions (in elements) of shared tiles with n columns of type T, for the two patterns.
template <class T> constexpr int ld_row(int n) { return sizeof(T) == 4 ? n + 4 : n + 8; }
template <class T> constexpr int ld_col(int n) { return n + 8; }

__device__ __forceinline__ uint32_t tf32_bits(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

template <int N, bool kSplit>
struct Frag {
  uint32_t hi[N];
  uint32_t lo[kSplit ? N : 1];
  __device__ __forceinline__ void set(int i, float x) {
    hi[i] = tf32_bits(x);
    if constexpr (kSplit) lo[i] = tf32_bits(x - __uint_as_float(hi[i]));
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

// A[16x8] at (m0,k0) from any element function f(m, k).
template <bool S, class F>
__device__ __forceinline__ FragA<S> load_a(F&& f, int m0, int k0) {
  const int g = lane_g(), t = lane_t();
  FragA<S> a;
  a.set(0, f(m0 + g, k0 + t));
  a.set(1, f(m0 + g + 8, k0 + t));
  a.set(2, f(m0 + g, k0 + t + 4));
  a.set(3, f(m0 + g + 8, k0 + t + 4));
  return a;
}
// B[8x8] at (k0,n0) from any element function f(k, n).
template <bool S, class F>
__device__ __forceinline__ FragB<S> load_b(F&& f, int k0, int n0) {
  const int g = lane_g(), t = lane_t();
  FragB<S> b;
  b.set(0, f(k0 + t, n0 + g));
  b.set(1, f(k0 + t + 4, n0 + g));
  return b;
}

// A(m,k) = s[m*ld + k] (row-major tile).
template <bool S, class T>
__device__ __forceinline__ FragA<S> load_a_row(const T* s, int ld, int m0, int k0) {
  return load_a<S>([&](int m, int k) { return to_float(s[m * ld + k]); }, m0, k0);
}
// A(m,k) = s[k*ld + m] (the tile holds A transposed).
template <bool S, class T>
__device__ __forceinline__ FragA<S> load_a_col(const T* s, int ld, int m0, int k0) {
  return load_a<S>([&](int m, int k) { return to_float(s[k * ld + m]); }, m0, k0);
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
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

}  // namespace kcp::cuda
