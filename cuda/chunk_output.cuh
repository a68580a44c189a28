// Stage "output" on its own (ALGORITHMS.md 4.8); the forward uses the copy fused into the state
// kernel, this one lets the stage tests check the output from given h and vnew.
#pragma once

#include <cuda_runtime.h>

#include "cuda/chunk_params.cuh"

namespace kcp::cuda {

// Grid (NT, HV, V/32): o rows of one chunk, value head and 32-column tile.
void launch_chunk_output(const OutputParams& op, int input_dtype, cudaStream_t stream);

}  // namespace kcp::cuda
