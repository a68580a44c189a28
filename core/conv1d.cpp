// make_conv1d_problem: validation of a conv1d call (see conv1d.h).
#include "core/conv1d.h"

namespace kcp {

Conv1dProblem make_conv1d_problem(const TensorView& x, const TensorView& weight, const TensorView& bias,
                                  const std::vector<int64_t>& cu_seqlens, bool silu, const TensorView& halo,
                                  DType compute) {
  KCP_CHECK(x.rank() == 3, "x: expected shape [B,T,D], got ", shape_str(x.shape));
  Conv1dProblem p;
  p.B = x.dim(0), p.T = x.dim(1), p.D = x.dim(2);
  KCP_CHECK(weight.rank() == 2 && weight.dim(0) == p.D && weight.dim(1) >= 1,
            "weight: expected shape [D,W] with D = ", p.D, ", got ", shape_str(weight.shape));
  p.W = weight.dim(1);
  KCP_CHECK(bias.empty() || bias.shape == Shape{p.D}, "bias: expected shape [D] = [", p.D, "], got ",
            shape_str(bias.shape));
  p.cu_seqlens = cu_seqlens;
  p.silu = silu;
  p.compute = compute;
  if (!cu_seqlens.empty()) {
    KCP_CHECK(p.B == 1, "cu_seqlens: packed sequences need B = 1, got B = ", p.B);
    KCP_CHECK(cu_seqlens.size() >= 2 && cu_seqlens.front() == 0 && cu_seqlens.back() == p.T,
              "cu_seqlens: must run from 0 to T = ", p.T);
    for (size_t i = 1; i < cu_seqlens.size(); ++i)
      KCP_CHECK(cu_seqlens[i] >= cu_seqlens[i - 1], "cu_seqlens: must be nondecreasing at entry ", i);
  }
  if (!halo.empty()) {
    KCP_CHECK(halo.rank() == 2 && halo.dim(1) == p.D && halo.dim(0) <= p.W - 1,
              "halo: expected shape [P,D] with P <= W-1 = ", p.W - 1, " and D = ", p.D, ", got ",
              shape_str(halo.shape));
    p.halo = halo.dim(0);
  }
  KCP_CHECK(compute == DType::f64 || compute == DType::f32, "compute: must be float64 or float32");
  return p;
}

}  // namespace kcp
