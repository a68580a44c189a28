// Stage "state recurrence + output" for kda's forward with 16-bit inputs (chunk_state_kda.cu):
// the state held transposed in one warpgroup's wgmma accumulators, 64 value columns per block, fed
// back into the next chunk's products as their register operand. Reads w, u, qg (WY stage), kg
// transposed per chunk (ChunkParams::kg_t, which the WY stage writes instead of kg) and Aqk.
#pragma once

#include <cuda_runtime.h>

#include "cuda/chunk_params.cuh"

namespace kcp::cuda {

// The block's value columns.
constexpr int kKdaChainBV = 64;

// Where 2^(b_end) of key i sits in ChunkParams::kg_decay's row of K: key t + 4 m (t = i mod 4) in
// segment t (K/4 floats), whose 16-byte pieces are rotated by t: m's piece m / 4 at slot
// (m / 4 + t) mod (K / 16). The chain's thread t (lane mod 4: those are its keys) then reads its
// factors four per 16-byte load, the four segments in different banks.
__host__ __device__ constexpr int kda_decay_pos(int i, int K) {
  const int t = i % 4, m = i / 4;
  return t * (K / 4) + ((m / 4 + t) % (K / 16)) * 4 + m % 4;
}

// Whether the transposed chain can serve a kda forward: kda (not gla), 16-bit q, k, v (unsplit
// products), K = 64 or 128, V a multiple of 64. The caller adds what the chain does not serve: the
// transition (M columns).
inline bool kda_chain_shape(const ChunkParams& p, int input_dtype) {
  return p.kda && !p.gla && input_dtype != kF32 && (p.K == 64 || p.K == 128) && p.V % kKdaChainBV == 0;
}

// The chain's blocks: V / 64 per sequence and value head (what the windows' and the kept forward's rules
// weigh against the multiprocessors).
inline int64_t kda_chain_blocks(int V, int64_t N, int HV) { return int64_t(V / kKdaChainBV) * N * HV; }

// Grid (V / 64, N * HV), 128 threads. sp: the forward (init zero or given, o, final_state), with h and
// vnew (both, for a backward) or neither.
void launch_chunk_state_kda(const StateParams& sp, cudaStream_t stream);
// The windowed forward's signal (StateParams::ready): chunks [c_begin, c_end) ready for the chain.
void launch_signal_ready(unsigned long long* ready, int c_begin, int c_end, unsigned epoch, cudaStream_t stream);

}  // namespace kcp::cuda
