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
// The same for one sequence (N = 1) of 16-bit inputs, its chain walked as two halves at once
// (chunk_state_gla_halves.cu): sp.mid, s_mid, f_local and decay set by the caller ([HV,K,V], [HV,K,V]
// and [NT+1,HV,K] float32), sp.h set. Runs the halves (the second writing D_c), the output with its correction
// (or, without sp.o, the correction in h), and final_state = f_local + D_NT s_mid.
void launch_gla_state_halves(const StateParams& sp, int input_dtype, cudaStream_t stream);
// final_state = f_local + D_NT s_mid (sp.decay's row NT), in final_state's dtype and strides: the
// forward's final state, or (sp from the dh chain) the backward's dh0.
void launch_gla_halves_final(const StateParams& sp, cudaStream_t stream);
// The backward's dh chain for gla (chunk_bwd_dh_gla.cu builds sp): the same chain walked from the last
// chunk to the first with sp.c.kg = qg and sp.c.v = do (do_dtype), dh[c] = scale S into sp.h before
// chunk c's update S = Gamma_end S + qg^T do, the start dht (sp.h0, kInitGiven) or 0, dh0 into
// sp.final_state: the recurrence dh <- Gamma_end dh + scale qg^T do of chunk_bwd_dh_gla.cu's scan, with
// B_c formed inside the chain instead of read from memory. Products split iff do is float32 (qg must
// then be the forward's split-path qg; with 16-bit do, the TF32-rounded one).
void launch_gla_dh_chain(const StateParams& sp, int do_dtype, cudaStream_t stream);
// The transition's M into sp.final_state [N, HV, K, K]: diagonal, M[i, i] = prod over the chunks of
// 2^(b_end[i]) (what the chain from I without v computes), grid (N*HV) of 1024 threads.
void launch_gla_transition_m(const StateParams& sp, cudaStream_t stream);
// The output alone from sp.h (the stage tests): o = scale qg h[c] + Aqk v.
void launch_gla_output(const StateParams& sp, int input_dtype, cudaStream_t stream);

}  // namespace kcp::cuda
