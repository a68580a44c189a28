// The "cuda-chunkwise" backend: the chunkwise forward of gdn and kda on a Hopper GPU behind the
// common Backend interface (device() = cuda; every view must live in its memory, staged through
// alloc/upload/download). Plain C++ header: no CUDA types.
//   forward:             o in the dtype of the o view, final_state in its view's dtype (float32 in
//                        practice); inputs q, k, v in float32, float16 or bfloat16 (one dtype),
//                        gates, beta, states in any float dtype. Intermediates are float32.
//   transition_forward:  (S_ext, M) of one sequence in float32 (the CP primitive).
//   backward, transition_backward: NOT IMPLEMENTED (a later issue); they throw
//                        kcp::Error("cuda-chunkwise: backward is not implemented yet").
//                        supports(p) cannot say this, since it is asked about a problem and not
//                        about a call: it describes the forward and the forward transition only.
// supports(): gdn and kda (not gla), chunk_size 64, K in {32, 64, 128}, V a multiple of 32,
// compute = float32 (products on TF32 tensor cores; 3xTF32 when the inputs are float32).
// Covered by tests/cuda/test_cuda_backend.cpp and the other suites in tests/cuda/.
#pragma once

#include <functional>
#include <memory>

#include "core/backend.h"

namespace kcp::cuda {

std::unique_ptr<Backend> make_cuda_backend();

// Number of CUDA devices; 0 when there is no device or no driver (never throws).
int device_count();

// Milliseconds between CUDA events recorded on the default stream before and after body().
double elapsed_ms(const std::function<void()>& body);

}  // namespace kcp::cuda
