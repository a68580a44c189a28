// The CUDA execution context: one device and one stream (core/queue.h). Every operation is
// asynchronous on the stream and runs with the queue's device current (a device guard per call), so a
// process may hold queues on several devices. Memory comes from cudaMalloc (device) and
// cudaMallocHost (pinned host staging for MPI on device buffers); timing uses events on the stream.
// The view operations and the transition algebra are kernels in cuda/queue_ops.cu, float32 and
// float64; the host queue's loops are their reference (tests/cuda/test_cuda_transition.cpp).
// Plain C++ header: no CUDA types.
#pragma once

#include <memory>

#include "core/queue.h"

namespace kcp::cuda {

struct CudaQueueOptions {
  int device = -1;              // CUDA ordinal; -1: the current device
  void* stream = nullptr;       // a cudaStream_t to borrow (e.g. PyTorch's); null: create one (non-blocking)
};

std::unique_ptr<Queue> make_cuda_queue(const CudaQueueOptions& opt = {});

// Number of CUDA devices; 0 when there is no device or no driver (never throws).
int device_count();

}  // namespace kcp::cuda
