// Warpgroup MMA (wgmma.mma_async, sm_90a) from shared memory: interleaved core matrices (no swizzle)
// for tiles written by threads, 128-byte swizzle (sw128_offset) for tiles copied from global memory.
//   Operand tiles are stored as core matrices: 8 rows x 16 bytes, each 128 contiguous bytes
//   (PTX ISA "shared memory matrix layout", no-swizzle mode). A "blocked tile" with `rows` rows and a
//   contiguous dimension of CG 16-byte groups puts element (r, c) at byte
//       ((r / 8) * CG + c / E) * 128 + (r % 8) * 16 + (c % E) * sizeof(T),     E = 16 / sizeof(T).
//   A descriptor names a start address, LBO (bytes between core matrices adjacent along K) and SBO
//   (along M or N). For a K-major operand the blocked rows are M/N and the contiguous dimension K
//   (LBO = 128, SBO = 128 CG); for an MN-major one (16-bit types only) the rows are K and the
//   contiguous dimension M/N (LBO = 128 CG, SBO = 128).
//   Accumulators (m64nN, float32): thread (warp w of the group, lane 4g+t) holds d[4j + 2h + e] =
//   D(16w + g + 8h, 8j + 2t + e), the mma.sync m16n8 C layout repeated along N.
// Ordering: shared-memory writes by threads (st.shared or cp.async) become visible to wgmma after
// fence.proxy.async in each writer and a barrier; accumulators written by ordinary instructions need
// wgmma.fence before the next wgmma; results are read after commit + wait.
// Covered by tests/cuda/test_cuda_wgmma.cpp (each shared-memory layout against a host product), the
// state stage, and test_cuda_kda_chain.cpp (the register A operand, mma_tf32_ra, end to end).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/device_math.cuh"

namespace kcp::cuda::wg {

// Byte offset of element (r, c) of a blocked tile whose contiguous dimension has `cg` 16-byte groups.
template <class T>
__host__ __device__ constexpr int blocked_offset(int r, int c, int cg) {
  constexpr int E = 16 / int(sizeof(T));
  return ((r >> 3) * cg + c / E) * 128 + (r & 7) * 16 + (c % E) * int(sizeof(T));
}

// 128-byte swizzled tiles (the layout of TMA's SWIZZLE_128B): rows of 128 bytes, 8 rows = 1024 bytes
// per atom (atoms 1024-byte aligned), the 16-byte chunk j of row r stored at chunk j ^ (r % 8). A
// tile of `rows` rows whose contiguous dimension is wider than 128 bytes is a sequence of regions of
// rows x 128 bytes. Element (r, c):
template <class T>
__host__ __device__ constexpr int sw128_offset(int r, int c, int rows) {
  constexpr int E = 16 / int(sizeof(T)), E128 = 128 / int(sizeof(T));
  return (c / E128) * rows * 128 + r * 128 + ((((c % E128) / E) ^ (r & 7)) * 16) + (c % E) * int(sizeof(T));
}

// Descriptor: no swizzle (interleaved core matrices) or 128-byte swizzle. With the swizzle, a K-major
// operand needs no LBO (its K extent stays inside one 128-byte row; stepping along K adds the byte
// offset to the start address) and SBO = 1024 (8 rows); an MN-major one has LBO = the distance
// between 128-byte-wide regions along M/N and SBO = 1024 (8 rows along K).
// (desc_shared: from a shared-space address.)
__device__ __forceinline__ uint64_t desc_shared(uint32_t a, uint32_t lbo, uint32_t sbo, bool swizzle128) {
  return uint64_t((a & 0x3ffffu) >> 4) | (uint64_t((lbo >> 4) & 0x3fffu) << 16) | (uint64_t((sbo >> 4) & 0x3fffu) << 32) |
         (uint64_t(swizzle128) << 62);
}
__device__ __forceinline__ uint64_t desc(const void* smem, uint32_t lbo, uint32_t sbo, bool swizzle128 = false) {
  return desc_shared(static_cast<uint32_t>(__cvta_generic_to_shared(smem)), lbo, sbo, swizzle128);
}

// The same for an address the whole warp shares, read from lane 0 (call with the warp converged, as
// wgmma needs it anyway): ptxas cannot always see that an address is uniform (a thread's warp group,
// a buffer chosen by a loop counter) and then keeps the descriptor in ordinary registers, moved by two
// R2UR before every wgmma that reads it; from a shuffle it keeps it in uniform registers.
__device__ __forceinline__ uint64_t desc_warp(const void* smem, uint32_t lbo, uint32_t sbo, bool swizzle128 = false) {
  return desc_shared(__shfl_sync(0xffffffffu, static_cast<uint32_t>(__cvta_generic_to_shared(smem)), 0), lbo, sbo, swizzle128);
}

// A descriptor advanced by `bytes` (its address field counts 16-byte units; shared addresses stay below
// 2^18, so the 14-bit field never carries into LBO).
__device__ __forceinline__ uint64_t adv(uint64_t d, uint32_t bytes) { return d + (bytes >> 4); }
// Start of K step ks (32 bytes: 16 16-bit or 8 TF32 values) in a 128-byte-swizzled K-major tile of
// `rows` rows: 4 steps per 128-byte row, then the next rows x 128-byte region.
__host__ __device__ constexpr uint32_t sw128_k_step(int ks, int rows) { return (ks / 4) * rows * 128 + (ks % 4) * 32; }

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// Keeps ordinary instructions on accumulators from moving across a wgmma batch (before fence(),
// after wait()): an empty asm that "uses and redefines" each register.
template <int M>
__device__ __forceinline__ void pin(float (&d)[M]) {
#pragma unroll
  for (int i = 0; i < M; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D (+)= A B, m64nNk16, 16-bit A and B from shared memory; kTA / kTB: A M-major / B N-major.
template <class T, int N, int kTA, int kTB>
__device__ __forceinline__ void mma16(float (&d)[N / 2], uint64_t da, uint64_t db, bool accumulate);
// D (+)= A B, m64nNk8, TF32 A and B (K-major) from shared memory.
template <int N>
__device__ __forceinline__ void mma_tf32(float (&d)[N / 2], uint64_t da, uint64_t db, bool accumulate);

#define KCP_WG_D8 "{%0,%1,%2,%3,%4,%5,%6,%7}"
#define KCP_WG_D16 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
#define KCP_WG_OUT8(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define KCP_WG_OUT16(d) KCP_WG_OUT8(d), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
                        "+f"(d[14]), "+f"(d[15])
#define KCP_WG_D32 \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"  \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define KCP_WG_D64 \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"  \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"  \
  "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"  \
  "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
#define KCP_WG_OUT32(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define KCP_WG_OUT64(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

template <class T, int N, int kTA, int kTB>
__device__ __forceinline__ void mma16(float (&d)[N / 2], uint64_t da, uint64_t db, bool accumulate) {
  static_assert(N == 16 || N == 32 || N == 64, "instantiated for N = 16, 32, 64");
  constexpr bool kBF = std::is_same_v<T, __nv_bfloat16>;
  if constexpr (N == 16 && kBF)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 " KCP_WG_D8 ", %8, %9, p, 1, 1, %11, %12;\n}\n"
                 : KCP_WG_OUT8(d) : "l"(da), "l"(db), "r"(int(accumulate)), "n"(kTA), "n"(kTB));
  else if constexpr (N == 16)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 " KCP_WG_D8 ", %8, %9, p, 1, 1, %11, %12;\n}\n"
                 : KCP_WG_OUT8(d) : "l"(da), "l"(db), "r"(int(accumulate)), "n"(kTA), "n"(kTB));
  else if constexpr (N == 32 && kBF)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " KCP_WG_D16 ", %16, %17, p, 1, 1, %19, %20;\n}\n"
                 : KCP_WG_OUT16(d) : "l"(da), "l"(db), "r"(int(accumulate)), "n"(kTA), "n"(kTB));
  else if constexpr (N == 32)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " KCP_WG_D16 ", %16, %17, p, 1, 1, %19, %20;\n}\n"
                 : KCP_WG_OUT16(d) : "l"(da), "l"(db), "r"(int(accumulate)), "n"(kTA), "n"(kTB));
  else if constexpr (kBF)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " KCP_WG_D32 ", %32, %33, p, 1, 1, %35, %36;\n}\n"
                 : KCP_WG_OUT32(d) : "l"(da), "l"(db), "r"(int(accumulate)), "n"(kTA), "n"(kTB));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " KCP_WG_D32 ", %32, %33, p, 1, 1, %35, %36;\n}\n"
                 : KCP_WG_OUT32(d) : "l"(da), "l"(db), "r"(int(accumulate)), "n"(kTA), "n"(kTB));
}

template <int N>
__device__ __forceinline__ void mma_tf32(float (&d)[N / 2], uint64_t da, uint64_t db, bool accumulate) {
  static_assert(N == 16 || N == 32, "instantiated for N = 16, 32");
  if constexpr (N == 16)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 " KCP_WG_D8 ", %8, %9, p, 1, 1;\n}\n"
                 : KCP_WG_OUT8(d) : "l"(da), "l"(db), "r"(int(accumulate)));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 " KCP_WG_D16 ", %16, %17, p, 1, 1;\n}\n"
                 : KCP_WG_OUT16(d) : "l"(da), "l"(db), "r"(int(accumulate)));
}

// D (+)= A B, m64nNk8, TF32, A from registers (a0..a3: this thread's entries (g, t), (g+8, t), (g, t+4),
// (g+8, t+4) of its warp's 16 rows, g = lane / 4, t = lane mod 4; CUTLASS's ALayout_64x8), B K-major
// from shared memory. An accumulator fed back as A: k-block j takes {d[4j], d[4j+2], d[4j+1], d[4j+3]}
// (ra_fragment), which puts accumulator column 8j + 2t + e at k position 8j + t + 4e.
template <int N>
__device__ __forceinline__ void mma_tf32_ra(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db, bool accumulate);

template <int N>
__device__ __forceinline__ void mma_tf32_ra(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db, bool accumulate) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 128, "instantiated for N = 16, 32, 64, 128");
  if constexpr (N == 16)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 " KCP_WG_D8 ", {%8,%9,%10,%11}, %12, p, 1, 1;\n}\n"
                 : KCP_WG_OUT8(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(int(accumulate)));
  else if constexpr (N == 32)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 " KCP_WG_D16 ", {%16,%17,%18,%19}, %20, p, 1, 1;\n}\n"
                 : KCP_WG_OUT16(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(int(accumulate)));
  else if constexpr (N == 64)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 " KCP_WG_D32 ", {%32,%33,%34,%35}, %36, p, 1, 1;\n}\n"
                 : KCP_WG_OUT32(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(int(accumulate)));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 " KCP_WG_D64 ", {%64,%65,%66,%67}, %68, p, 1, 1;\n}\n"
                 : KCP_WG_OUT64(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(int(accumulate)));
}

#undef KCP_WG_OUT64
#undef KCP_WG_OUT32
#undef KCP_WG_OUT16
#undef KCP_WG_OUT8
#undef KCP_WG_D64
#undef KCP_WG_D32
#undef KCP_WG_D16
#undef KCP_WG_D8

// The register A operand of k-block j from accumulator values x (as TF32 bits), in mma_tf32_ra's order.
template <int M>
__device__ __forceinline__ void ra_fragment(const uint32_t (&x)[M], int j, uint32_t (&a)[4]) {
  a[0] = x[4 * j], a[1] = x[4 * j + 2], a[2] = x[4 * j + 1], a[3] = x[4 * j + 3];
}
template <int M>
__device__ __forceinline__ void pin(uint32_t (&d)[M]) {
#pragma unroll
  for (int i = 0; i < M; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// Accumulator coordinates of d[x] (m64nN) for the calling thread: row and column.
__device__ __forceinline__ int acc_row(int x) { return 16 * ((threadIdx.x >> 5) & 3) + ((threadIdx.x & 31) >> 2) + 8 * ((x >> 1) & 1); }
__device__ __forceinline__ int acc_col(int x) { return 8 * (x >> 2) + 2 * (threadIdx.x & 3) + (x & 1); }

// A barrier of the calling warpgroup alone (named barrier 1 + its index; 0 is __syncthreads'), for
// blocks whose other warps (more warpgroups, a loader warpgroup) do not take part: the folded state kernel.
__device__ __forceinline__ void sync_warpgroup() {
  asm volatile("bar.sync %0, 128;" ::"r"(1 + int(threadIdx.x >> 7)) : "memory");
}

// A 16-bit pair split into a high part (the values rounded to T) and a low part (the remainders
// rounded to T): hi + lo carries about 16 significant bits, more than TF32's 11.
template <class T>
__device__ __forceinline__ void split_pair(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    const float2 hf = __bfloat1622float2(h);
    const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - hf.x, x1 - hf.y);
    hi = *reinterpret_cast<const uint32_t*>(&h), lo = *reinterpret_cast<const uint32_t*>(&l);
  } else {
    const __half2 h = __floats2half2_rn(x0, x1);
    const float2 hf = __half22float2(h);
    const __half2 l = __floats2half2_rn(x0 - hf.x, x1 - hf.y);
    hi = *reinterpret_cast<const uint32_t*>(&h), lo = *reinterpret_cast<const uint32_t*>(&l);
  }
}

}  // namespace kcp::cuda::wg
