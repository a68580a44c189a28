// Stage "state recurrence" (ALGORITHMS.md 4.7), optionally fused with the output stage (4.8).
#pragma once

#include <cuda_runtime.h>

#include "cuda/chunk_params.cuh"

namespace kcp::cuda {

// Grid (Vw/32, N*HV): one block per (sequence, value head, 32-column tile of the state).
// `split`: 3xTF32 products even for 16-bit inputs (the CP transition M); float32 inputs always split.
void launch_chunk_state(const StateParams& sp, int input_dtype, cudaStream_t stream, bool split);
// The blocks of a launch with Vw state columns (16 or 32 columns per block, by the grid's size).
int64_t chunk_state_blocks(const ChunkParams& p, int Vw);

}  // namespace kcp::cuda
