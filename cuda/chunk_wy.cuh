// Stage "WY" (ALGORITHMS.md 4.6): w, u from P, and for kda the gated kg, qg.
#pragma once

#include <cuda_runtime.h>

#include "cuda/chunk_params.cuh"

namespace kcp::cuda {

// One block per (64-column slab, chunk, value head); writes p.w, p.u (and p.kg, p.qg for kda),
// float32. with_u = false: the w slabs only (u not written), for callers that never read u.
void launch_chunk_wy(const ChunkParams& p, int input_dtype, cudaStream_t stream, bool with_u = true);

}  // namespace kcp::cuda
