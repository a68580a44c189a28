// Stage "gate cumsum" (ALGORITHMS.md 4.2) with the fused pre-processing of 2.1-2.2.
#pragma once

#include <cuda_runtime.h>

#include "cuda/chunk_params.cuh"

namespace kcp::cuda {

// One block per (chunk, value head): beta_e, gcum and (with l2norm) rstd_q, rstd_k.
void launch_chunk_cumsum(const ChunkParams& p, int input_dtype, cudaStream_t stream);

}  // namespace kcp::cuda
