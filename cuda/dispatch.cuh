// Run-time value -> template parameter, in one place, so that the backend's supports() is derived
// from exactly what the launchers instantiate (ggml's lesson; docs/ARCHITECTURE.md):
//   input element type (q, k, v): float, half, bfloat16;  key head size K: 32, 64, 128.
// Any other value throws kcp::Error naming it. Covered by tests/cuda/test_cuda_backend.cpp.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "core/error.h"
#include "cuda/device_math.cuh"
#include "cuda/key_dims.h"

namespace kcp::cuda {

template <class F>
void dispatch_input_type(int code, F&& f) {
  switch (code) {
    case kF32: f(TypeTag<float>{}); return;
    case kF16: f(TypeTag<__half>{}); return;
    case kBF16: f(TypeTag<__nv_bfloat16>{}); return;
    default: throw Error("cuda-chunkwise: q, k, v must be float32, float16 or bfloat16");
  }
}

template <class F>
void dispatch_key_dim(int K, F&& f) {
  static_assert(sizeof(kKeyDims) / sizeof(kKeyDims[0]) == 3, "update the switch below with kKeyDims");
  switch (K) {
    case 32: f(std::integral_constant<int, 32>{}); return;
    case 64: f(std::integral_constant<int, 64>{}); return;
    case 128: f(std::integral_constant<int, 128>{}); return;
    default: throw Error(detail::concat("cuda-chunkwise: K = ", K, " is not instantiated (K = 32, 64, 128)"));
  }
}

// A run-time yes/no as a compile-time one (the backward's split products, chunk_bwd.cuh; kda in
// chunk_output.cu).
template <class F>
void dispatch_bool(bool b, F&& f) {
  if (b) f(std::true_type{});
  else f(std::false_type{});
}

}  // namespace kcp::cuda
