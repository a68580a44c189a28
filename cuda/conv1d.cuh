// Launchers of the GPU conv1d (conv1d.cu), called by the cuda-chunkwise backend with its stream,
// a device copy of cu_seqlens (null for a dense batch) and, for the backward, a [B*T, D] scratch
// buffer in the compute precision (dz).
#pragma once

#include <cstdint>

#include "core/conv1d.h"

namespace kcp::cuda {

void conv1d_launch_forward(const Conv1dProblem& p, const Conv1dTensors& t, const TensorView& y, void* stream,
                           const int64_t* d_cu);
void conv1d_launch_backward(const Conv1dProblem& p, const Conv1dTensors& t, const TensorView& dy,
                            const Conv1dGrads& g, void* stream, const int64_t* d_cu, void* dz);

}  // namespace kcp::cuda
