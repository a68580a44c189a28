// The CPU chunkwise twin (reference/chunkwise.h, float64) of every stage result, laid out like the
// CUDA pipeline's buffers (cuda/chunkwise.h StageBuffers): gcum [TT,HV,Kg] in log2 units, beta
// [TT,HV], rstd [TT,H], P and Aqk [NT,HV,64,64], w, kg, qg [TT,HV,K], u, vnew [TT,HV,V], h
// [NT,HV,K,V], o [B,T,HV,V], ht [N,HV,K,V]. Elements the twin does not define (padding of the 64x64
// tiles past a partial chunk) are NaN, so a comparison skips them and an upload writes 0 there.
#pragma once

#include "core/problem.h"
#include "core/tensor.h"

namespace kcp::test {

struct StageTwin {
  Tensor<double> gcum, beta, rstd_q, rstd_k, P, Aqk, w, u, kg, qg, h, vnew, o, ht;
};

// From host inputs and a float64 problem; chunk order as the CUDA chunk table (sequence-major).
StageTwin make_stage_twin(const Problem& p64, const Inputs& host_inputs);

// The backward's stage results of the twin (reference/chunkwise_backward.cpp), laid out like the CUDA
// pipeline's BackwardBuffers: dh [NT,HV,K,V] (the gradient of the state leaving each chunk), dvnew
// [TT,HV,V], dqv, dkv [TT,HV,K] per value head, dbeta [TT,HV] (w.r.t. the effective beta; NaN for gla)
// and da [TT,HV,Kg] (w.r.t. the log decay).
struct BackwardTwin {
  Tensor<double> dh, dvnew, dqv, dkv, dbeta, da;
};
BackwardTwin make_backward_twin(const Problem& p64, const Inputs& host_inputs, const Cotangents& host_cotangents);

}  // namespace kcp::test
