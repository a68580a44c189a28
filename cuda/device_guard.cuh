// DeviceGuard: makes a CUDA device current for a scope and restores the previous one, so that every
// entry point of the CUDA backend and queue works on its own device whatever the caller selected
// (a process may hold backends on several GPUs; MPI ranks sharing a node pick theirs by local rank).
// The nothrow form is for destructors, where an error cannot be reported.
#pragma once

#include <new>

#include "cuda/cuda_check.cuh"

namespace kcp::cuda {

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    KCP_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) KCP_CUDA_CHECK(cudaSetDevice(device));
  }
  DeviceGuard(int device, std::nothrow_t) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = device;
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    int now = previous_;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace kcp::cuda
