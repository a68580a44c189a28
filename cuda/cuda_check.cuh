// KCP_CUDA_CHECK: every CUDA runtime call goes through it; a failure becomes a kcp::Error naming the
// call, the file:line and CUDA's message (the harness reports it like any other bad input).
// KCP_CUDA_LAUNCH_CHECK(): after each kernel launch (catches bad configurations at once).
// Covered by tests/cuda/test_cuda_backend.cpp (bad input and no-device paths).
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

#define KCP_CUDA_CHECK(call)                                                                  \
  do {                                                                                        \
    const cudaError_t kcp_cuda_err_ = (call);                                                 \
    if (kcp_cuda_err_ != cudaSuccess)                                                         \
      throw ::kcp::Error(::kcp::detail::concat("CUDA error at ", __FILE__, ":", __LINE__, ": ", \
                                               #call, ": ", cudaGetErrorString(kcp_cuda_err_))); \
  } while (0)

#define KCP_CUDA_LAUNCH_CHECK() KCP_CUDA_CHECK(cudaGetLastError())

namespace kcp::cuda {

// Launches `kernel` with `smem` bytes of dynamic shared memory and checks the launch. The kernel's
// limit is raised first: past 48 KB a launch fails unless the attribute allows it.
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args&&... args) {
  KCP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<grid, block, smem, stream>>>(static_cast<Args&&>(args)...);
  KCP_CUDA_LAUNCH_CHECK();
}

}  // namespace kcp::cuda
