// wgmma_probe (wgmma_probe.h): lays out A and B in shared memory as the folded state kernel does
// (wg::blocked_offset, wg::sw128_offset, wg::desc with the same LBO/SBO and start-address steps),
// runs the product on one warpgroup and writes D through the accumulator map. Covered by
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

constexpr int probe_k(int layout) { return layout == 3 ? 128 : (layout == 0 || layout == 1) ? 32 : 64; }

// A(m, k) into shared memory in the layout's form.
template <int layout>
__device__ void put_a(char* sa, int m, int k, float x) {
  constexpr int KD = probe_k(layout);
  if constexpr (layout == 0) *reinterpret_cast<T16*>(sa + wg::blocked_offset<T16>(m, k, KD / 8)) = __float2bfloat16(x);
  if constexpr (layout == 1) *reinterpret_cast<T16*>(sa + wg::blocked_offset<T16>(k, m, 64 / 8)) = __float2bfloat16(x);
  if constexpr (layout == 2) *reinterpret_cast<float*>(sa + wg::blocked_offset<float>(m, k, 16)) = x;
  if constexpr (layout == 3) *reinterpret_cast<T16*>(sa + wg::sw128_offset<T16>(m, k, 64)) = __float2bfloat16(x);
  if constexpr (layout == 4) *reinterpret_cast<T16*>(sa + wg::sw128_offset<T16>(k, m, KD)) = __float2bfloat16(x);
  if constexpr (layout == 5) *reinterpret_cast<float*>(sa + wg::sw128_offset<float>(m, k, 64)) = x;
}

// The product with the kernel's descriptors (see chunk_state_fold.cu).
template <int N, int layout>
__device__ void product(float (&acc)[N / 2], const char* sa, const char* sb) {
  constexpr int KD = probe_k(layout);
  constexpr uint32_t kLboB = (N / 8) * 128;
#pragma unroll
  for (int ks = 0; ks < KD / (layout == 2 || layout == 5 ? 8 : 16); ++ks) {
    if constexpr (layout == 0)
      wg::mma16<T16, N, 0, 1>(acc, wg::desc(sa + 256 * ks, 128, (KD / 8) * 128), wg::desc(sb + 2 * ks * kLboB, kLboB, 128), ks > 0);
    if constexpr (layout == 1)
      wg::mma16<T16, N, 1, 1>(acc, wg::desc(sa + 2 * ks * 8 * 128, 8 * 128, 128), wg::desc(sb + 2 * ks * kLboB, kLboB, 128), ks > 0);
    if constexpr (layout == 2)
      wg::mma_tf32<N>(acc, wg::desc(sa + 256 * ks, 128, 16 * 128), wg::desc(sb + 256 * ks, 128, 16 * 128), ks > 0);
    if constexpr (layout == 3)
      wg::mma16<T16, N, 0, 1>(acc, wg::desc(sa + (ks / 4) * 8192 + (ks % 4) * 32, 16, 1024, true),
                              wg::desc(sb + 2 * ks * kLboB, kLboB, 128), ks > 0);
    if constexpr (layout == 4)
      wg::mma16<T16, N, 1, 1>(acc, wg::desc(sa + 2 * ks * 1024, 8192, 1024, true), wg::desc(sb + 2 * ks * kLboB, kLboB, 128),
                              ks > 0);
    if constexpr (layout == 5)
      wg::mma_tf32<N>(acc, wg::desc(sa + (ks / 4) * 8192 + (ks % 4) * 32, 16, 1024, true), wg::desc(sb + 256 * ks, 128, 16 * 128),
                      ks > 0);
  }
}

template <int N, int layout>
__global__ void __launch_bounds__(128, 1) wgmma_probe_kernel(const float* a, const float* b, float* d) {
  __shared__ __align__(1024) char sa[64 * 128 * 2];
  __shared__ __align__(128) char sb[128 * N * 2];
  constexpr int KD = probe_k(layout);
  constexpr bool kTf = layout == 2 || layout == 5;
  for (int idx = threadIdx.x; idx < 64 * KD; idx += 128) put_a<layout>(sa, idx / KD, idx % KD, a[idx]);  // A(m,k)
  for (int idx = threadIdx.x; idx < KD * N; idx += 128) {  // B(k, n) = b[k*N + n]
    const int k = idx / N, n = idx % N;
    if constexpr (kTf) *reinterpret_cast<float*>(sb + wg::blocked_offset<float>(n, k, 16)) = b[idx];
    else *reinterpret_cast<T16*>(sb + wg::blocked_offset<T16>(k, n, N / 8)) = __float2bfloat16(b[idx]);
  }
  wg::fence_proxy_async();
  __syncthreads();
  float acc[N / 2];
  wg::pin(acc);
  wg::fence();
  product<N, layout>(acc, sa, sb);
  wg::commit();
  wg::wait<0>();
  wg::pin(acc);
#pragma unroll
  for (int x = 0; x < N / 2; ++x) d[wg::acc_row(x) * N + wg::acc_col(x)] = acc[x];
}

template <int N>
void launch(WgmmaLayout layout, const float* a, const float* b, float* d) {
  switch (layout) {
    case WgmmaLayout::kKMajorA16: wgmma_probe_kernel<N, 0><<<1, 128>>>(a, b, d); break;
    case WgmmaLayout::kMMajorA16: wgmma_probe_kernel<N, 1><<<1, 128>>>(a, b, d); break;
    case WgmmaLayout::kTf32: wgmma_probe_kernel<N, 2><<<1, 128>>>(a, b, d); break;
    case WgmmaLayout::kKMajorA16Sw: wgmma_probe_kernel<N, 3><<<1, 128>>>(a, b, d); break;
    case WgmmaLayout::kMMajorA16Sw: wgmma_probe_kernel<N, 4><<<1, 128>>>(a, b, d); break;
    case WgmmaLayout::kTf32Sw: wgmma_probe_kernel<N, 5><<<1, 128>>>(a, b, d); break;
  }
}

}  // namespace

int wgmma_probe_k(WgmmaLayout layout) { return probe_k(int(layout)); }

std::vector<float> wgmma_probe(WgmmaLayout layout, const std::vector<float>& a, const std::vector<float>& b, int N) {
  const int KD = wgmma_probe_k(layout);
  KCP_CHECK((N == 16 || N == 32) && a.size() == size_t(64 * KD) && b.size() == size_t(KD * N),
            "wgmma_probe: expected a [64,", KD, "], b [", KD, ",N], N = 16 or 32");
  float *da = nullptr, *db = nullptr, *dd = nullptr;
  KCP_CUDA_CHECK(cudaMalloc(&da, a.size() * 4));
  KCP_CUDA_CHECK(cudaMalloc(&db, b.size() * 4));
  KCP_CUDA_CHECK(cudaMalloc(&dd, size_t(64 * N) * 4));
  std::vector<float> d(size_t(64 * N));
  KCP_CUDA_CHECK(cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice));
  KCP_CUDA_CHECK(cudaMemcpy(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice));
  if (N == 16) launch<16>(layout, da, db, dd);
  else launch<32>(layout, da, db, dd);
  KCP_CUDA_LAUNCH_CHECK();
  KCP_CUDA_CHECK(cudaMemcpy(d.data(), dd, d.size() * 4, cudaMemcpyDeviceToHost));
  cudaFree(da), cudaFree(db), cudaFree(dd);
  return d;
}

}  // namespace kcp::cuda
