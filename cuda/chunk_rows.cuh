// The per-row scalars of one chunk into shared memory, shared by the kkt and WY stages: the gdn gate
// cumsum (kda's per-channel gates are tiles, loaded by each stage), the effective beta, and the L2
// norm's rstd of k and q (1 without the fused norm). Rows past the chunk's length L repeat the last
// valid gate (so exp2 of differences stays finite) and leave beta/rstd unwritten (cp_async zero fill).
// Also the gated rows the state kernel reads (kda, gla), written by WY (kda) or kkt (gla).
// Covered by tests/cuda/test_cuda_stages.cpp (stage tests of kkt and WY).
#pragma once

#include <cstring>

#include "cuda/chunk_params.cuh"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda {

// kBeta = false: the caller forms bet itself (kda's and gla's kkt, which writes beta_e); kQ = false:
// no rq (the backward's dhu chain, which gates k's rows only).
// tid, nthreads: the copying threads (default: the block's; a loader warpgroup passes its own).
template <bool kKDA, bool kBeta = true, bool kQ = true>
__device__ __forceinline__ void load_chunk_row_scalars(const ChunkParams& p, const ChunkInfo& ck, int hv, int h,
                                                       float* gs, float* bet, float* rk, float* rq, int tid, int nthreads) {
  const int L = ck.len;
  for (int r = tid; r < kChunk; r += nthreads) {
    const int64_t tt = ck.t0 + min(r, L - 1);
    if constexpr (!kKDA) cp_async4(gs + r, p.gcum + tt * p.HV + hv, true);
    if constexpr (kBeta) cp_async4(bet + r, p.beta_e + tt * p.HV + hv, r < L);
    if (p.l2norm) {
      cp_async4(rk + r, p.rstd_k + tt * p.H + h, r < L);
      if constexpr (kQ) cp_async4(rq + r, p.rstd_q + tt * p.H + h, r < L);
    } else {
      if constexpr (kQ) rk[r] = rq[r] = 1.0f;
      else rk[r] = 1.0f;
    }
  }
}

template <bool kKDA, bool kBeta = true, bool kQ = true>
__device__ __forceinline__ void load_chunk_row_scalars(const ChunkParams& p, const ChunkInfo& ck, int hv, int h,
                                                       float* gs, float* bet, float* rk, float* rq) {
  load_chunk_row_scalars<kKDA, kBeta, kQ>(p, ck, hv, h, gs, bet, rk, rq, int(threadIdx.x), int(blockDim.x));
}

// One element (channel gate b, the chunk's last gate b_end) of kg = k rk 2^(b_end - b) and
// qg = q rq 2^b, TF32-rounded unless products are split (S; exp2_approx).
template <bool S>
__device__ __forceinline__ float gated_q(float q, float rq, float b) { return operand_store<S>(q * rq * exp2_approx<S>(b)); }
template <bool S>
__device__ __forceinline__ float2 gated_kq(float k, float q, float rk, float rq, float b, float b_end) {
  return make_float2(operand_store<S>(k * rk * exp2_approx<S>(b_end - b)), gated_q<S>(q, rq, b));
}

// Four consecutive elements of a 16-bit or float32 row in shared memory, as floats (one load; 8- or 16-byte aligned).
template <class Tin>
__device__ __forceinline__ void lds4_float(const Tin* s, float (&x)[4]) {
  if constexpr (sizeof(Tin) == 4) {
    const float4 v = *reinterpret_cast<const float4*>(s);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
  } else {
    const uint2 w = *reinterpret_cast<const uint2*>(s);
    Tin e[4];
    memcpy(e, &w, sizeof(w));
#pragma unroll
    for (int j = 0; j < 4; ++j) x[j] = to_float(e[j]);
  }
}

}  // namespace kcp::cuda
