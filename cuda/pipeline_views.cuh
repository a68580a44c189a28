// The pipeline's arguments as the kernels see them: cuda-chunkwise's checks of device views, row
// alignment and mergeable batch and time, with the argument's name in every error. Used by
// chunkwise_impl.cuh; covered by tests/cuda/test_cuda_backend.cpp, test_cuda_forward.cpp and
// test_cuda_shapes.cpp (the errors they name).
#pragma once

#include <cstdint>

#include "core/backend.h"
#include "cuda/chunk_params.cuh"

namespace kcp::cuda {

inline int dtype_code(const TensorView& t, const char* name) {
  switch (t.dtype) {
    case DType::f32: return kF32;
    case DType::f16: return kF16;
    case DType::bf16: return kBF16;
    case DType::f64: return kF64;
    default: throw Error(detail::concat("cuda-chunkwise: ", name, " must be a float tensor, got ", dtype_name(t.dtype)));
  }
}

inline void expect_device(const TensorView& t, const char* name) {
  KCP_CHECK(t.device == Device::cuda, "cuda-chunkwise: ", name, " must be a CUDA device view (use the backend's alloc/upload)");
}

// [B,T,X(,D)] with B and T merged into one token index.
template <class View>
inline View rows_view(const TensorView& t, const char* name) {
  expect_device(t, name);
  KCP_CHECK(t.dim(0) == 1 || t.stride[0] == t.dim(1) * t.stride[1], "cuda-chunkwise: ", name,
            ": batch and time must be mergeable (stride[0] == T*stride[1]), got strides ", shape_str(t.stride));
  KCP_CHECK(t.rank() == 3 || t.stride[3] == 1, "cuda-chunkwise: ", name, ": the last dimension must be contiguous");
  View v;
  v.p = t.data, v.st = t.stride[1], v.sx = t.stride[2], v.dt = dtype_code(t, name);
  return v;
}

// q, k and v rows are copied 16 bytes at a time (cp.async).
inline void expect_aligned_rows(const TensorView& t, const char* name) {
  const int64_t es = dtype_size(t.dtype);
  const bool ok = reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && (t.stride[1] * es) % 16 == 0 && (t.stride[2] * es) % 16 == 0;
  KCP_CHECK(ok, "cuda-chunkwise: ", name, ": rows must start on 16-byte boundaries (pointer and strides)");
}

inline StateView state_view(const TensorView& t, bool v_first, const char* name) {
  expect_device(t, name);
  StateView s;
  s.p = t.data, s.dt = dtype_code(t, name);
  if (t.rank() == 3) {  // transition buffers [HV,K,V]
    s.sn = 0, s.shv = t.stride[0], s.si = t.stride[1], s.sj = t.stride[2];
  } else {
    s.sn = t.stride[0], s.shv = t.stride[1];
    s.si = v_first ? t.stride[3] : t.stride[2], s.sj = v_first ? t.stride[2] : t.stride[3];
  }
  return s;
}

inline ScalarView scalar_view(const TensorView& t, const char* name) {
  ScalarView s;
  if (t.empty()) return s;
  expect_device(t, name);
  s.p = t.data, s.s = t.stride[0], s.dt = dtype_code(t, name);
  return s;
}

}  // namespace kcp::cuda
