// wgmma_probe (wgmma_probe.h): lays out A and B in shared memory exactly as the folded state kernel
// does (wg::blocked_offset, wg::desc with the same LBO/SBO and start-address steps), runs the
// products on one warpgroup and writes D through the accumulator map. Covered by
// tests/cuda/test_cuda_wgmma.cpp.
#include "cuda/wgmma_probe.h"

#include <cuda_bf16.h>

#include <type_traits>

#include "core/error.h"
#include "cuda/cuda_check.cuh"
#include "cuda/tile_mma.cuh"
#include "cuda/wgmma.cuh"

namespace kcp::cuda {
namespace {

using T16 = __nv_bfloat16;

template <int N, int layout>
__global__ void __launch_bounds__(128, 1) wgmma_probe_kernel(const float* a, const float* b, float* d) {
  __shared__ __align__(128) char sa[64 * 64 * 4];
  __shared__ __align__(128) char sb[64 * N * 4];
  constexpr int KD = layout == 2 ? 64 : 32;
  for (int idx = threadIdx.x; idx < 64 * KD; idx += 128) {  // A(m, k) = a[m*KD + k]
    const int m = idx / KD, k = idx % KD;
    if constexpr (layout == 0) *reinterpret_cast<T16*>(sa + wg::blocked_offset<T16>(m, k, KD / 8)) = __float2bfloat16(a[idx]);
    if constexpr (layout == 1) *reinterpret_cast<T16*>(sa + wg::blocked_offset<T16>(k, m, 64 / 8)) = __float2bfloat16(a[idx]);
    if constexpr (layout == 2) *reinterpret_cast<float*>(sa + wg::blocked_offset<float>(m, k, 16)) = a[idx];
  }
  for (int idx = threadIdx.x; idx < KD * N; idx += 128) {  // B(k, n) = b[k*N + n]
    const int k = idx / N, n = idx % N;
    if constexpr (layout == 2) *reinterpret_cast<float*>(sb + wg::blocked_offset<float>(n, k, 16)) = b[idx];
    else *reinterpret_cast<T16*>(sb + wg::blocked_offset<T16>(k, n, N / 8)) = __float2bfloat16(b[idx]);
  }
  wg::fence_proxy_async();
  __syncthreads();
  float acc[N / 2];
  wg::pin(acc);
  wg::fence();
  constexpr uint32_t kLboB = (N / 8) * 128;
  if constexpr (layout == 0)
#pragma unroll
    for (int kk = 0; kk < 2; ++kk)  // as issue_state_products (K/8 = 4 groups)
      wg::mma16<T16, N, 0, 1>(acc, wg::desc(sa + 256 * kk, 128, 4 * 128), wg::desc(sb + 2 * kk * kLboB, kLboB, 128), kk > 0);
  if constexpr (layout == 1)
#pragma unroll
    for (int ks = 0; ks < 2; ++ks)  // as issue_update (M-major A: 64 / 8 = 8 groups per k row)
      wg::mma16<T16, N, 1, 1>(acc, wg::desc(sa + (2 * ks * 8) * 128, 8 * 128, 128), wg::desc(sb + 2 * ks * kLboB, kLboB, 128),
                              ks > 0);
  if constexpr (layout == 2)
#pragma unroll
    for (int ks = 0; ks < 8; ++ks)  // as tf32_chunk_product
      wg::mma_tf32<N>(acc, wg::desc(sa + 256 * ks, 128, 16 * 128), wg::desc(sb + 256 * ks, 128, 16 * 128), ks > 0);
  wg::commit();
  wg::wait<0>();
  wg::pin(acc);
#pragma unroll
  for (int x = 0; x < N / 2; ++x) d[wg::acc_row(x) * N + wg::acc_col(x)] = acc[x];
}

}  // namespace

std::vector<float> wgmma_probe(WgmmaLayout layout, const std::vector<float>& a, const std::vector<float>& b, int N) {
  const int KD = layout == WgmmaLayout::kTf32 ? 64 : 32;
  KCP_CHECK((N == 16 || N == 32) && a.size() == size_t(64 * KD) && b.size() == size_t(KD * N),
            "wgmma_probe: expected a [64,", KD, "], b [", KD, ",N], N = 16 or 32");
  float *da = nullptr, *db = nullptr, *dd = nullptr;
  KCP_CUDA_CHECK(cudaMalloc(&da, a.size() * 4));
  KCP_CUDA_CHECK(cudaMalloc(&db, b.size() * 4));
  KCP_CUDA_CHECK(cudaMalloc(&dd, size_t(64 * N) * 4));
  std::vector<float> d(size_t(64 * N));
  KCP_CUDA_CHECK(cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice));
  KCP_CUDA_CHECK(cudaMemcpy(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice));
  auto run = [&](auto n) {
    constexpr int NN = decltype(n)::value;
    switch (layout) {
      case WgmmaLayout::kKMajorA16: wgmma_probe_kernel<NN, 0><<<1, 128>>>(da, db, dd); break;
      case WgmmaLayout::kMMajorA16: wgmma_probe_kernel<NN, 1><<<1, 128>>>(da, db, dd); break;
      case WgmmaLayout::kTf32: wgmma_probe_kernel<NN, 2><<<1, 128>>>(da, db, dd); break;
    }
  };
  if (N == 16) run(std::integral_constant<int, 16>{});
  else run(std::integral_constant<int, 32>{});
  KCP_CUDA_LAUNCH_CHECK();
  KCP_CUDA_CHECK(cudaMemcpy(d.data(), dd, d.size() * 4, cudaMemcpyDeviceToHost));
  cudaFree(da), cudaFree(db), cudaFree(dd);
  return d;
}

}  // namespace kcp::cuda
