// Stages "state recurrence" and "output" of gla (chunk_state_gla.cu): the recurrence split over key
// rows as well as state columns (no delta rule couples the rows), the output afterwards from the
// stored states, in parallel over the chunks.
#pragma once

#include <cuda_runtime.h>

#include "cuda/chunk_params.cuh"

namespace kcp::cuda {

// The chain, grid (N*HV, K/32, Vw/32) of 64 threads, S from v (u = v) starting at 0 or h0: h[c] into
// sp.h (when set), final_state (when set). Then, when sp.o is set, the output, grid (NT * V/BVo, HV)
// of 256 threads, reading sp.h (which must be set then).
void launch_gla_state(const StateParams& sp, int input_dtype, cudaStream_t stream);
// The transition's M into sp.final_state [N, HV, K, K]: diagonal, M[i, i] = prod over the chunks of
// 2^(b_end[i]) (what the chain from I without v computes), grid (N*HV) of 1024 threads.
void launch_gla_transition_m(const StateParams& sp, cudaStream_t stream);
// The output alone from sp.h (the stage tests): o = scale qg h[c] + Aqk v.
void launch_gla_output(const StateParams& sp, int input_dtype, cudaStream_t stream);

}  // namespace kcp::cuda
