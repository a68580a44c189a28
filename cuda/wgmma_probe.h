// One warpgroup MMA per operand layout of cuda/wgmma.cuh, for tests (no CUDA headers here):
//   kKMajorA16   D[64,N] = A[64,32] B[32,N]: 16-bit A K-major (rows m), B N-major (rows k)   (k @ S)
//   kMMajorA16   the same product with A read M-major from a tile whose rows are k        (k^T @ Vt)
//   kTf32        D[64,N] = A[64,64] B[64,N]: TF32 A and B both K-major (B tile rows n)     (P @ Y)
// a and b are row-major [M,K] and [K,N] host arrays (values exact in bfloat16); N is 16 or 32.
// Returns D row-major. Covered by tests/cuda/test_cuda_wgmma.cpp.
#pragma once

#include <vector>

namespace kcp::cuda {

enum class WgmmaLayout { kKMajorA16, kMMajorA16, kTf32 };

std::vector<float> wgmma_probe(WgmmaLayout layout, const std::vector<float>& a, const std::vector<float>& b, int N);

}  // namespace kcp::cuda
