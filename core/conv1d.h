// One causal depthwise conv1d call (ALGORITHMS.md 5.9; the math is in reference/conv1d.h): sizes,
// packed sequences, activation and the CP halo, validated from the tensors by make_conv1d_problem.
//   x, y [B,T,D]   weight [D,W]   bias [D] (optional)   halo [P,D], P <= W-1 (optional): the P tokens
//   before the first sequence of the call, which context parallelism takes from earlier ranks
// Backends run it through Backend::conv1d_forward / conv1d_backward (core/backend.h).
// Covered by tests/reference/test_conv1d.cpp.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace kcp {

struct Conv1dProblem {
  int64_t B = 0, T = 0, D = 0, W = 0;
  std::vector<int64_t> cu_seqlens;  // empty: each batch row is one sequence
  bool silu = true;
  int64_t halo = 0;  // history tokens available before the first sequence (<= W-1)
  DType compute = DType::f64;
};

// Validates shapes and derives sizes; `halo` may be an empty view.
Conv1dProblem make_conv1d_problem(const TensorView& x, const TensorView& weight, const TensorView& bias,
                                  const std::vector<int64_t>& cu_seqlens, bool silu, const TensorView& halo,
                                  DType compute = DType::f64);

struct Conv1dTensors {
  TensorView x, weight, bias, halo;  // bias and halo optional
};
struct Conv1dGrads {  // each optional: an empty view is not computed
  TensorView dx, dweight, dbias, dhalo;
};

}  // namespace kcp
