// Stage "state recurrence + output" for gdn with 16-bit q, k, v, with the WY products folded in
// (chunk_state_fold.cu): reads P, Aqk (kkt stage), the gate cumsum, beta, rstd and the raw inputs;
// w and u are never formed.
#pragma once

#include <cuda_runtime.h>

#include "cuda/chunk_params.cuh"

namespace kcp::cuda {

// Whether the folded kernel serves a problem: gdn with float16/bfloat16 q, k, v (products unsplit).
inline bool state_fold_applies(const ChunkParams& p, int input_dtype) { return !p.kda && input_dtype != kF32; }

// Grid (V/(16 G), N*HV), 128 G threads. `groups` = G in {1, 2} (16-column groups per block), 0 picks
// it from the device: 1 when the blocks of G = 1 fit on the multiprocessors at once, else 2.
void launch_chunk_state_fold(const StateParams& sp, int input_dtype, int groups, cudaStream_t stream);

}  // namespace kcp::cuda
