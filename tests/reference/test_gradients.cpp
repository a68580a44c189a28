// Finite-difference checks of the float64 token recurrence's backward, for every variant and every
// flag combination (l2norm x beta mode x gate formula), on small packed and batched shapes with GVA,
// initial and final states. Bar: tolerance.h kFdRel for every input.
#include <doctest/doctest.h>

#include <cstdio>

#include "reference/fd_support.h"
#include "validation/tolerance.h"

using namespace kcp;

namespace {

enum class BetaMode { plain, sigmoid, neg_eigval };
enum class GateMode { log_decay, softplus, softplus_no_dt_bias, lower_bound, lower_bound_no_A_log };

std::vector<val::CaseSpec> all_flag_cases(uint64_t seed) {
  std::vector<val::CaseSpec> out;
  int layout = 0;
  for (Variant var : {Variant::gdn, Variant::kda, Variant::gla}) {
    const bool delta = var != Variant::gla;
    for (bool l2 : {false, true})
      for (BetaMode bm : {BetaMode::plain, BetaMode::sigmoid, BetaMode::neg_eigval}) {
        if (!delta && bm != BetaMode::plain) continue;
        for (GateMode gm : {GateMode::log_decay, GateMode::softplus, GateMode::softplus_no_dt_bias,
                            GateMode::lower_bound, GateMode::lower_bound_no_A_log}) {
          const bool lb = gm == GateMode::lower_bound || gm == GateMode::lower_bound_no_A_log;
          if (var == Variant::gdn && lb) continue;  // the lower-bound gate is per-channel only
          val::CaseSpec s;
          s.variant = var;
          s.K = 4, s.V = 3, s.chunk_size = 4;  // C = 4: several checkpoint segments per sequence
          // alternate layouts: packed with GVA, batched, packed with one q/k head per value head
          switch (layout++ % 3) {
            case 0: s.seqlens = {5, 1, 9}, s.H = 1, s.HV = 2; break;
            case 1: s.B = 2, s.T = 7, s.H = 2, s.HV = 2; break;
            default: s.seqlens = {0, 11, 3}, s.H = 1, s.HV = 3, s.flags.state_v_first = true; break;
          }
          s.flags.use_qk_l2norm_in_kernel = l2;
          s.flags.use_beta_sigmoid_in_kernel = bm != BetaMode::plain;
          s.flags.allow_neg_eigval = bm == BetaMode::neg_eigval;
          s.flags.use_gate_in_kernel = gm != GateMode::log_decay;
          if (lb) s.flags.lower_bound = -3.0;
          s.dt_bias = gm != GateMode::softplus_no_dt_bias;
          s.A_log = gm != GateMode::lower_bound_no_A_log;
          s.seed = seed + out.size();
          out.push_back(s);
        }
      }
  }
  return out;
}

}  // namespace

TEST_CASE("recurrent backward matches central finite differences for every flag combination") {
  const uint64_t seed = val::seed_from_env(100);
  for (const val::CaseSpec& s : all_flag_cases(seed)) {
    SUBCASE(s.name().c_str()) {
      const auto results = test::fd_check(val::make_case(s));
      for (const auto& r : results) {
        INFO(s.name(), " input ", r.input, ": rel err ", r.rel_err, " (|grad| = ", r.norm, ")");
        CHECK(r.norm > 0);  // every input must influence L, or the check proves nothing
        CHECK(r.rel_err < val::tol::kFdRel);
      }
    }
  }
}
