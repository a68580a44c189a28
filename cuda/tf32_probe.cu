// tf32_probe (tf32_probe.h): one thread per value runs tile_mma.cuh's Frag::set, the conversion
// every unsplit product operand and every split pair goes through. Covered by
// tests/cuda/test_cuda_tf32.cpp.
#include "cuda/tf32_probe.h"

#include "core/error.h"
#include "cuda/cuda_check.cuh"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda {
namespace {

__global__ void tf32_probe_kernel(const float* x, uint32_t* hi, uint32_t* lo, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  Frag<1, true> f;
  f.set(0, x[i]);
  hi[i] = f.hi[0], lo[i] = f.lo[0];
}

}  // namespace

std::pair<std::vector<uint32_t>, std::vector<uint32_t>> tf32_probe(const std::vector<float>& x) {
  const int n = int(x.size());
  KCP_CHECK(n > 0, "tf32_probe: expected at least one value");
  float* dx = nullptr;
  uint32_t *dh = nullptr, *dl = nullptr;
  KCP_CUDA_CHECK(cudaMalloc(&dx, x.size() * 4));
  KCP_CUDA_CHECK(cudaMalloc(&dh, x.size() * 4));
  KCP_CUDA_CHECK(cudaMalloc(&dl, x.size() * 4));
  KCP_CUDA_CHECK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  tf32_probe_kernel<<<(n + 255) / 256, 256>>>(dx, dh, dl, n);
  KCP_CUDA_LAUNCH_CHECK();
  std::pair<std::vector<uint32_t>, std::vector<uint32_t>> r{std::vector<uint32_t>(x.size()), std::vector<uint32_t>(x.size())};
  KCP_CUDA_CHECK(cudaMemcpy(r.first.data(), dh, x.size() * 4, cudaMemcpyDeviceToHost));
  KCP_CUDA_CHECK(cudaMemcpy(r.second.data(), dl, x.size() * 4, cudaMemcpyDeviceToHost));
  cudaFree(dx), cudaFree(dh), cudaFree(dl);
  return r;
}

}  // namespace kcp::cuda
