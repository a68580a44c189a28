// Stage "kkt + solve_tril" (ALGORITHMS.md 4.4-4.5): Lmat, Aqk and P = (I + Lmat)^-1 per chunk.
#pragma once

#include <cuda_runtime.h>

#include "cuda/chunk_params.cuh"

namespace kcp::cuda {

// One block per (chunk, value head); writes p.Aqk and p.P ([NT,HV,64,64], float32). with_w (gdn with
// 16-bit inputs, where w is wanted without u): also p.w, the WY stage's w bit for bit, so that stage
// need not run (ChunkParams::kkt_writes_w).
void launch_chunk_kkt(const ChunkParams& p, int input_dtype, cudaStream_t stream, bool with_w = false);

}  // namespace kcp::cuda
