// One warpgroup MMA per operand layout of cuda/wgmma.cuh, for tests (no CUDA headers here). A is the
// variable part; B is always the thread-written interleaved tile (N-major 16-bit, K-major TF32):
//   kKMajorA16     D[64,N] = A[64,32]  B: 16-bit A K-major, interleaved
//   kMMajorA16     D[64,N] = A[64,32]  B: 16-bit A M-major (tile rows k), interleaved
//   kTf32          D[64,N] = A[64,64]  B: TF32 A K-major, interleaved
//   kKMajorA16Sw   D[64,N] = A[64,128] B: 16-bit A K-major, 128-byte swizzle, two 128-byte regions  (k @ S)
//   kMMajorA16Sw   D[64,N] = A[64,64]  B: 16-bit A M-major, 128-byte swizzle (tile rows k)          (k^T @ Vt)
//   kTf32Sw        D[64,N] = A[64,64]  B: TF32 A K-major, 128-byte swizzle, two regions             (P @ Y)
// a and b are row-major [M,K] and [K,N] host arrays (values exact in bfloat16); N is 16 or 32.
// Returns D row-major. Covered by tests/cuda/test_cuda_wgmma.cpp.
#pragma once

#include <vector>

namespace kcp::cuda {

enum class WgmmaLayout { kKMajorA16, kMMajorA16, kTf32, kKMajorA16Sw, kMMajorA16Sw, kTf32Sw };

// K of each layout's product.
int wgmma_probe_k(WgmmaLayout layout);
std::vector<float> wgmma_probe(WgmmaLayout layout, const std::vector<float>& a, const std::vector<float>& b, int N);

}  // namespace kcp::cuda
