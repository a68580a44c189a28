// The "cuda-chunkwise" backend: the chunkwise forward and backward of gdn, kda and gla on a Hopper
// GPU, the CP transition and the causal conv1d, behind the common Backend interface. Its queue() is one CUDA
// device and stream (cuda/queue_cuda.h): every view passed in must live in that device's memory
// (staged through queue().alloc/copy), and all work is asynchronous on that stream.
//   forward:             o in the dtype of the o view, final_state in its view's dtype (float32 in
//                        practice); inputs q, k, v in float32, float16 or bfloat16 (one dtype),
//                        gates, beta, states in any float dtype. Intermediates are float32.
//   transition_forward:  (S_ext, M) of a range of sequences in one pass, float32 (the CP primitive).
//   conv1d:              forward and backward, W <= 8, float32 or float64 arithmetic.
//   backward, transition_backward: gdn, kda and gla (supports_backward() = supports(); gla runs kda's
//                        backward stages without the delta rule: dv = dvnew, no dbeta, M^T diagonal).
// supports(): gdn, kda and gla, chunk_size 64, K in {32, 64, 128}, V a multiple of 32,
// compute = float32 (products on TF32 tensor cores; 3xTF32 when the inputs are float32). The registry's
// "cuda-chunkwise" adds, through zero padding (pad_rule() below), K <= 128, any V, chunk_size 16 and 32.
// Plain C++ header: no CUDA types. Covered by tests/cuda/test_cuda_backend.cpp and the suites in tests/cuda/.
#pragma once

#include <memory>

#include "core/backend.h"
#include "core/pad_plan.h"
#include "cuda/queue_cuda.h"

namespace kcp::cuda {

// What the backend does beyond its queue.
struct CudaBackendOptions {
  // Keep the forward's intermediates for a backward that follows on the same inputs (issue 11's
  // "recompute or keep"; cuda/chunkwise.h Pipeline::set_keep_forward): the forward then costs what the
  // backward's recompute costs and that backward skips it. Off: every backward recomputes, as FLA's.
  bool keep_forward = false;
};

// A backend on opt.device (default: the current device) and opt.stream (default: its own stream).
std::unique_ptr<Backend> make_cuda_backend(const CudaQueueOptions& opt = {}, const CudaBackendOptions& bopt = {});

// What the kernels are instantiated for, as the shape adapter's rule (core/padded_backend.h): K in
// kKeyDims (smaller K zero-padded up), V padded to a multiple of kValueTile, chunk_size 16 and 32
// computed with 64-token chunks. The registry's "cuda-chunkwise" is make_cuda_backend() wrapped by the
// segmented forward and then by PaddedBackend with this rule (validation/registry.cpp).
PadRule pad_rule();

}  // namespace kcp::cuda
