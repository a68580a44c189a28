// Causal depthwise conv1d under context parallelism (ALGORITHMS.md 5.9), the local math from the
// backend (Backend::conv1d_forward / conv1d_backward), the halo moved over a Comm on the backend's
// memory, so it runs on the host (MPI) and on the GPU (staged MPI or NCCL). Each rank holds x, y,
// dy, dx as its part [1, T_local, D]; weight [D,W], bias [D].
//   forward:  one all-gather of every rank's last min(W-1, T_local) tokens; the first local sequence
//             gets h = min(W-1, pre_num_conv_tokens) halo tokens, read from however many earlier ranks
//             hold them (a rank may have fewer than W-1 tokens); other sequences start from zeros
//   backward: the gradient of each rank's halo is all-gathered and added to dx of the ranks that own
//             those tokens (in rank order); dweight and dbias are all-reduced, identical everywhere
// Covered by the conv rows of the cp-sweep (W = 2, 3, 4 over every layout; --backend cuda-chunkwise
// on the GPU).
#pragma once

#include "core/backend.h"
#include "cp/comm.h"
#include "cp/context.h"

namespace kcp::cp {

struct ConvCp {
  const std::vector<int64_t>& cu_seqlens;  // global
  const CpContext& ctx;
  bool silu = true;
  DType compute = DType::f64;
};

void conv1d_cp_forward(Comm& comm, Backend& be, const ConvCp& c, const TensorView& x, const TensorView& weight,
                       const TensorView& bias, const TensorView& y);
// dx [1,T_local,D]; dweight [D,W] and dbias [D] (optional) hold the sums over all ranks.
void conv1d_cp_backward(Comm& comm, Backend& be, const ConvCp& c, const TensorView& x, const TensorView& weight,
                        const TensorView& bias, const TensorView& dy, const TensorView& dx, const TensorView& dweight,
                        const TensorView& dbias);

}  // namespace kcp::cp
