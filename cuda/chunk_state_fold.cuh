// Stage "state recurrence + output" for gdn with 16-bit q, k, v, with the WY products folded in
// (chunk_state_fold.cu): reads P, Aqk (kkt stage), the gate cumsum, beta, rstd and the raw inputs;
// w and u are never formed.
#pragma once

#include <cuda_runtime.h>

#include "cuda/chunk_params.cuh"
#include "cuda/fold_layout.h"

namespace kcp::cuda {

// Whether the folded kernel serves a problem: gdn with float16/bfloat16 q, k, v (products unsplit).
inline bool state_fold_applies(const ChunkParams& p, int input_dtype) { return !p.kda && input_dtype != kF32; }

// A block's state columns by `layout` (fold_layout.h resolve_fold_layout; groups 0: automatic). Grid
// (Vw / (16 groups warpgroups), N*HV), 256 threads: one warpgroup of columns and a loader warpgroup, or
// two warpgroups of columns (chunk_state_fold_tiles.cuh kBlockThreads). Returns the layout that ran.
FoldLayout launch_chunk_state_fold(const StateParams& sp, int input_dtype, FoldLayout layout, cudaStream_t stream);

}  // namespace kcp::cuda
