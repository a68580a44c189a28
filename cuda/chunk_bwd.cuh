// The chunkwise backward on the GPU (ALGORITHMS.md 4.9-4.13; CPU twin reference/chunkwise_backward.cpp),
// its parameter block and launchers. The forward intermediates come from the forward's stages run
// again (cumsum, kkt, WY, state with h and vnew kept); then, all float32:
//   prep   (chunk_bwd_finish.cu): qn, kn = q, k with the fused L2 norm applied        [TT,H,K]
//   dhu    (chunk_bwd_dhu.cu):    per (sequence, value head, 32 state columns), chunks last to first:
//          dh[c] = gradient of the state leaving c; dvnew = Aqk^T do + kg dh;
//          dh_in = Diag(gamma_end) dh + scale qg^T do - w^T dvnew; dh0 after chunk 0
//   chunk  (chunk_bwd_chunk.cu):  per (chunk, value head): dq, dk (per value head), dv, dbeta_e, da
//          (gradient w.r.t. the per-token log decay a) from h, dh, vnew, dvnew, P
//   finish (chunk_bwd_finish.cu): dq, dk summed over the value heads of a q/k head and through the
//          L2 norm; dbeta through the sigmoid; dg, dA_log, ddt_bias through the gate formula.
// The same dhu kernel gives the CP transition backward: do = 0, init = I, Vw = K (M^T), and
// init = 0 (dS_ext).
// Covered by tests/cuda/test_cuda_backward.cpp.
#pragma once

#include <cuda_runtime.h>

#include "cuda/chunk_params.cuh"

namespace kcp::cuda {

struct OutScalarView {  // writable [X] (dA_log, ddt_bias)
  void* p = nullptr;
  int64_t s = 0;
  int dt = kF32;
};

__device__ __forceinline__ int64_t row_off(const OutRowsView& v, int64_t tt, int x) { return tt * v.st + int64_t(x) * v.sx; }

struct BwdParams {
  ChunkParams c;
  // forward intermediates (float32 workspace)
  const float* h = nullptr;     // [NT,HV,K,V] state entering each chunk
  const float* vnew = nullptr;  // [TT,HV,V]
  float* qn = nullptr;          // [TT,H,K] q (L2-normalized with the fused norm)
  float* kn = nullptr;          // [TT,H,K]
  // cotangents
  RowsView d_o;                 // [B,T,HV,V]; p null: zero (transition backward)
  StateView dht;                // gradient of the final state; p null: zero
  int init = kInitZero;         // dhu start: kInitZero (dht or 0) or kInitIdentity (M^T)
  int Vw = 0;                   // dhu state columns: V, or K for M^T
  // backward workspace (float32)
  float* dh = nullptr;          // [NT,HV,K,V] gradient of the state leaving each chunk (null: not kept)
  float* dvnew = nullptr;       // [TT,HV,V] (null: not kept)
  float* dqv = nullptr;         // [TT,HV,K] dq per value head (before the group sum and L2 norm)
  float* dkv = nullptr;         // [TT,HV,K]
  float* dbeta_e = nullptr;     // [TT,HV] gradient w.r.t. the effective beta
  float* da = nullptr;          // [TT,HV,Kg] gradient w.r.t. a (natural log decay)
  float* dx = nullptr;          // [TT,HV,Kg] gradient w.r.t. g + dt_bias (fused gate)
  float* dalog = nullptr;       // [TT,HV,Kg] per-element dA_log terms (fused gate)
  // outputs (p null: not computed)
  StateView dh0;                // [N,HV,K,V] (or the transition's dS_ext / M^T)
  OutRowsView dq, dk, dv, dg, dbeta;
  OutScalarView dA_log, ddt_bias;
};

// prep: qn, kn (needs rstd from the cumsum stage with the fused norm).
void launch_bwd_prep(const BwdParams& bp, int input_dtype, cudaStream_t stream);
// dhu: grid (N, HV, Vw/32).
void launch_bwd_dhu(const BwdParams& bp, cudaStream_t stream);
// chunk: grid (NT, HV).
void launch_bwd_chunk(const BwdParams& bp, cudaStream_t stream);
// finish: the fused input transforms backward and the gradients in their dtypes.
void launch_bwd_finish(const BwdParams& bp, cudaStream_t stream);

}  // namespace kcp::cuda
