// StageTimer: KCP_CUDA_STAGE_TIMES=1 makes a forward or backward print the milliseconds of each of
// its stages to stderr (diagnostics only: the events synchronize the device, so never set it while
// timing whole calls). Used by cuda/chunkwise.cu and cuda/chunkwise_backward.cu.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "cuda/cuda_check.cuh"

namespace kcp::cuda {

struct StageTimer {
  explicit StageTimer(cudaStream_t s) : stream(s) {}
  cudaStream_t stream = nullptr;
  bool on = std::getenv("KCP_CUDA_STAGE_TIMES") != nullptr;
  std::vector<cudaEvent_t> ev;
  void mark() {
    if (!on) return;
    ev.emplace_back();
    KCP_CUDA_CHECK(cudaEventCreate(&ev.back()));
    KCP_CUDA_CHECK(cudaEventRecord(ev.back(), stream));
  }
  // names[i] labels the interval between the i-th and the (i+1)-th mark.
  void report(const char* what, const char* const* names) {
    if (!on) return;
    KCP_CUDA_CHECK(cudaEventSynchronize(ev.back()));
    std::fprintf(stderr, "cuda-chunkwise %s stages (ms):", what);
    for (size_t i = 1; i < ev.size(); ++i) {
      float ms = 0;
      KCP_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[i - 1], ev[i]));
      std::fprintf(stderr, " %s %.3f", names[i - 1], ms);
    }
    std::fprintf(stderr, "\n");
    for (cudaEvent_t e : ev) cudaEventDestroy(e);
  }
};

}  // namespace kcp::cuda
