// The CP merge on the GPU (ALGORITHMS.md 5.3, 5.7): folds gathered per-rank transitions into the
// initial state of a sequence that continues across ranks, oldest first, in float32:
//   S = s0 (or 0);  for j = first .. first+count-1:  S = M_j @ S + S_ext_j ;  out = S
// m [P,HV,K,K], s_ext [P,HV,K,V] as all-gathered (e.g. FLA's hm buffer split in two), s0 and out
// [HV,K,V]; all float32, contiguous, on the device. The transitions themselves come from
// Backend::transition_forward (Pipeline::transition_forward).
// Covered by tests/cuda/test_cuda_transition.cpp ("merge").
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace kcp::cuda {

void merge_transitions(const TensorView& m, const TensorView& s_ext, int64_t first, int64_t count,
                       const TensorView& s0, const TensorView& out);

}  // namespace kcp::cuda
