// The float32 rule's conditioning of the gate gradients: the per-token terms summed into dA_log and
// ddt_bias add up to the oracle's own gradients (so the condition number is that of the sum the
// backends compute), the magnitude behind each dg element bounds |dg|, and every condition number is >= 1.
#include <doctest/doctest.h>

#include <cmath>

#include "reference/backend_cpu.h"
#include "reference/recurrent.h"
#include "validation/float_rule.h"
#include "validation/run_case.h"
#include "validation/tolerance.h"

using namespace kcp;

TEST_CASE("grad_conditioning's terms sum to the oracle's dA_log and ddt_bias") {
  for (Variant v : {Variant::gdn, Variant::kda}) {
    for (bool lb : {false, true}) {
      if (v == Variant::gdn && lb) continue;
      val::CaseSpec s;
      s.variant = v, s.seqlens = {17, 4, 30}, s.H = 1, s.HV = 2, s.K = 6, s.V = 4, s.seed = val::seed_from_env(7);
      s.flags.use_gate_in_kernel = true;
      if (lb) s.flags.lower_bound = -2.0;
      SUBCASE(s.name().c_str()) {
        const auto c = val::make_case(s);
        auto be = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
        const auto r = val::run_case<double>(*be, c, true);
        const val::GradConditioning pc = val::grad_conditioning(c.problem(), c.inputs(), c.cotangents(), r.grads.dg.view());
        REQUIRE(pc.dA_log_sum.size() == size_t(r.grads.dA_log.numel()));
        REQUIRE(pc.ddt_bias_sum.size() == size_t(r.grads.ddt_bias.numel()));
        for (size_t i = 0; i < pc.dA_log_sum.size(); ++i)
          CHECK(pc.dA_log_sum[i] == doctest::Approx(r.grads.dA_log.data()[i]).epsilon(val::tol::kIdentityF64));
        for (size_t i = 0; i < pc.ddt_bias_sum.size(); ++i)
          CHECK(pc.ddt_bias_sum[i] == doctest::Approx(r.grads.ddt_bias.data()[i]).epsilon(val::tol::kIdentityF64));
        CHECK(pc.dA_log >= 1.0);
        CHECK(pc.ddt_bias >= 1.0);
        CHECK(pc.dg >= 1.0);
        CHECK(pc.of("dq") == 1.0);
        // the magnitude behind each dg element bounds it: |sum of terms| <= sum of |terms|
        const Tensor<double> mag = ref::recurrent_dg_magnitude(c.problem(), c.inputs(), c.cotangents());
        REQUIRE(mag.shape() == r.grads.dg.shape());
        int64_t below = 0;
        for (int64_t i = 0; i < mag.numel(); ++i) below += mag.data()[i] < std::abs(r.grads.dg.data()[i]) * (1 - 1e-12);
        CHECK(below == 0);
      }
    }
  }
  CHECK(val::float_rule_bar(1e-7) == doctest::Approx(val::tol::kFloatRuleFactor * 1e-7 + val::tol::kFloatRuleFloor));
  CHECK(val::float_rule_bar(1e-7, 10) == doctest::Approx(val::tol::kFloatRuleFactor * 1e-7 + 10 * val::tol::kFloatRuleFloor));
  CHECK(val::layer_float_rule_bar(1e-7, 10) ==
        doctest::Approx(val::tol::kFloatRuleFactor * 1e-7 + 10 * val::tol::kLayerFloatRuleFloor));
  // host kernels: the plain rule; CUDA kernels (3xTF32 products): the floor scaled, the factor not
  CHECK(val::float_rule_bar(1e-7, 10, Device::host) == val::float_rule_bar(1e-7, 10));
  CHECK(val::float_rule_bar(1e-7, 10, Device::cuda) ==
        doctest::Approx(val::tol::kFloatRuleFactor * 1e-7 +
                        10 * val::tol::kSplitTf32FloorFactor * val::tol::kFloatRuleFloor));
}
