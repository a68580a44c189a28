// Kernels of the CUDA queue (queue_cuda.cu): strided view copy/add/zero with dtype conversion, and
// the packed-transition algebra (core/transition.h). All take the queue's stream.
//   copy/add: dst[i] (=|+=) src[i] over a rank <= 4 index space, any float dtypes, int64 strides
//   pad:      dst = src zero-extended (dst's extent >= src's on every axis; the rest of dst set to 0)
//   fold:     x = x0 or 0; for each element j of a range (ascending or descending): x = M_j x + S_j
//   scan:     per range, from x = 0: x = M_j x + S_j, out[j] = x; all ranges in one launch (per 64),
//             512-thread blocks (the steps are a dependent chain)
//   compose:  out = (M_l M_e, M_l S_e + S_l)
//   start:    S = M x0 + S; M = 0        identity: M = I, S = 0
// Covered by tests/cuda/test_cuda_transition.cpp.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "core/queue.h"
#include "core/tensor.h"

namespace kcp::cuda {

enum class ViewOp { copy, add, zero };
void launch_view_op(ViewOp op, const TensorView& dst, const TensorView& src, cudaStream_t stream);
void launch_pad_view(const TensorView& dst, const TensorView& src, cudaStream_t stream);

void launch_transition_fold(const TensorView& elems, int64_t first, int64_t count, bool reverse, const TensorView& x0,
                            const TensorView& out, cudaStream_t stream);
void launch_transition_scan(const TensorView& elems, const std::vector<TransitionRange>& ranges, const TensorView& out,
                            cudaStream_t stream);
void launch_transition_compose(const TensorView& later, const TensorView& earlier, const TensorView& out,
                               cudaStream_t stream);
void launch_transition_start(const TensorView& t, const TensorView& x0, cudaStream_t stream);
void launch_transition_identity(const TensorView& t, cudaStream_t stream);

}  // namespace kcp::cuda
