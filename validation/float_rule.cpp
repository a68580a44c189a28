// float_rule_bar() and the conditioning of the gate gradients (see float_rule.h). With m[t] the
// magnitude behind dg[t] (the oracle's sum of |terms|), the shared parameters sum per-token terms
// that follow reference/gates.h: ddt_bias sums dg; dA_log sums da * a, which is dg * softplus(x) /
// softplus'(x) for the softplus gate and dg * x for the lower-bound gate with A_log (x = g + dt_bias);
// their magnitudes are the same expressions with m in place of dg.
#include "validation/float_rule.h"

#include <algorithm>
#include <cmath>

#include "reference/gates.h"
#include "reference/recurrent.h"
#include "validation/tolerance.h"

namespace kcp::val {

double float_rule_bar(double base_err, double cond) {
  return tol::kFloatRuleFactor * base_err + tol::kFloatRuleFloor * cond;
}

double float_rule_bar(double base_err, double cond, Device device) {
  // the floor is kFloatRuleFloor * cond: scaling cond scales the floor alone
  return float_rule_bar(base_err, device == Device::cuda ? tol::kSplitTf32FloorFactor * cond : cond);
}

double device_result_bar(std::string_view tensor, DType input, DType stored, double base_err, double cond) {
  if (input == DType::f32 || input == DType::f64) return std::max(tol::kFloatVsDouble, float_rule_bar(base_err, cond));
  const bool gate_beta = tensor == "dg" || tensor == "dbeta" || tensor == "dA_log" || tensor == "ddt_bias";
  if (tensor == "o" || tensor == "final_state") return stored == DType::f32 ? tol::kCudaTf32 : tol::kFlaChunkOutput;
  return gate_beta ? tol::kFlaChunkGateBeta : tol::kFlaChunkGrad;
}

double layer_float_rule_bar(double base_err, double cond) {
  return tol::kFloatRuleFactor * base_err + tol::kLayerFloatRuleFloor * cond;
}

double GradConditioning::of(std::string_view name) const {
  if (name == "dg") return dg;
  if (name == "dA_log") return dA_log;
  if (name == "ddt_bias") return ddt_bias;
  return 1.0;
}

namespace {
// || magnitudes || / || signed ||, or 1 when there is nothing to judge.
double ratio(const std::vector<double>& mag, const std::vector<double>& sum) {
  double a = 0, s = 0;
  for (size_t i = 0; i < sum.size(); ++i) a += mag[i] * mag[i], s += sum[i] * sum[i];
  return s > 0 ? std::max(1.0, std::sqrt(a / s)) : 1.0;
}
}  // namespace

GradConditioning grad_conditioning(const Problem& p, const Inputs& in, const Cotangents& dc, const TensorView& dg_oracle) {
  GradConditioning c;
  if (dg_oracle.empty()) return c;
  const Tensor<double> mag = ref::recurrent_dg_magnitude(p, in, dc), d = to_tensor<double>(dg_oracle);
  c.dg = ratio(mag.vec(), d.vec());
  if (!p.flags.use_gate_in_kernel) return c;
  const int64_t Kg = p.per_channel_gate() ? p.K : 1;
  const Tensor<double> g = to_tensor<double>(in.g);
  const Tensor<double> bias = in.dt_bias.empty() ? Tensor<double>() : to_tensor<double>(in.dt_bias);
  const bool lb = p.gate_formula() == GateFormula::lower_bound;
  std::vector<double> a_mag(size_t(p.HV), 0), a_sum(size_t(p.HV), 0);
  std::vector<double> b_mag(size_t(p.HV * Kg), 0), b_sum(size_t(p.HV * Kg), 0);
  for (int64_t bt = 0; bt < p.B * p.T; ++bt)
    for (int64_t hv = 0; hv < p.HV; ++hv)
      for (int64_t i = 0; i < Kg; ++i) {
        const int64_t e = (bt * p.HV + hv) * Kg + i, j = hv * Kg + i;
        const double x = g.data()[e] + (bias.numel() ? bias.data()[j] : 0.0), dx = d.data()[e], m = mag.data()[e];
        const double h = lb ? x : ref::softplus(x) / ref::softplus_grad(x);
        a_mag[size_t(hv)] += std::abs(m * h), a_sum[size_t(hv)] += dx * h;
        b_mag[size_t(j)] += m, b_sum[size_t(j)] += dx;
      }
  if (!in.A_log.empty()) c.dA_log = ratio(a_mag, a_sum), c.dA_log_sum = a_sum;
  if (!in.dt_bias.empty()) c.ddt_bias = ratio(b_mag, b_sum), c.ddt_bias_sum = b_sum;
  return c;
}

}  // namespace kcp::val
