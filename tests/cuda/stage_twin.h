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

}  // namespace kcp::test
