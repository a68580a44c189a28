// The float32 rule, written once: a float32 result passes when
//   err(candidate, float64 oracle) <= kFloatRuleFactor * err(float32 recurrence, oracle) + kFloatRuleFloor * cond
// with rel_l2 errors. cond = 1 for most tensors. The gate gradients are sums whose terms cancel:
// dg[t] sums K*V (gdn) or V (kda, gla) products of the state and its gradient, and dA_log / ddt_bias
// sum dg over every token. Float32 rounding of such a sum is relative to the magnitude summed, not
// to the (possibly cancelled) result, so their floor scales with the condition number
//   cond = || sum |terms| || / || sum terms ||
// taken from the float64 oracle (reference/recurrent.h recurrent_dg_magnitude).
// Covered by tests/validation/test_float_rule.cpp.
#pragma once

#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/problem.h"

namespace kcp::val {

double float_rule_bar(double base_err, double cond = 1.0);
// The rule for a result computed by the backend kernels of `device`: on the CUDA device (cuda-chunkwise)
// float32 products are 3xTF32, so the floor is tol::kSplitTf32FloorFactor times the host's (reason
// there); host backends compute in float32 itself.
double float_rule_bar(double base_err, double cond, Device device);
// The same rule for a whole layer (CP sweep layer rows): floor tol::kLayerFloatRuleFloor (its reason there).
double layer_float_rule_bar(double base_err, double cond = 1.0);

// The bar for one result of a float32 GPU backend (cuda-chunkwise) against the float64 oracle on
// rel_l2, as the CUDA tests apply it (tests/cuda, tolerance.h "cuda-chunkwise"): float32 inputs:
// kFloatVsDouble, or the float32 rule against the float32 recurrence (`base_err`, `cond`) where that
// is looser; 16-bit inputs: kCudaTf32 for a result stored in float32 (o, final_state), FLA's chunk
// bars for o stored in 16 bits (kFlaChunkOutput) and for gradients (kFlaChunkGrad; kFlaChunkGateBeta
// for dg, dbeta, dA_log, ddt_bias).
double device_result_bar(std::string_view tensor, DType input, DType stored, double base_err, double cond = 1.0);

struct GradConditioning {
  double dg = 1, dA_log = 1, ddt_bias = 1;
  std::vector<double> dA_log_sum, ddt_bias_sum;  // the signed sums (equal the oracle's gradients)
  double of(std::string_view tensor_name) const;  // dg, dA_log, ddt_bias, else 1
};
// dg_oracle: the float64 oracle's gradient w.r.t. the gate as passed, for the same call.
GradConditioning grad_conditioning(const Problem& p, const Inputs& in, const Cotangents& dc,
                                   const TensorView& dg_oracle);

}  // namespace kcp::val
