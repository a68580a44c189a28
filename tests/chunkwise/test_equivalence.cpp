// cpu-chunkwise against the token recurrence (the oracle), end to end through the backend interface:
//   float64: o, final state and every gradient within tolerance.h kExactF64 (norm-wise), over a
//            seeded sweep of variants x flags x chunk sizes x packed lengths {0, 1, C-1, C, C+1,
//            2C-1, odd long} x GVA x state layouts;
//   float32: err(chunkwise f32, recurrence f64) <= kFloatRuleFactor err(recurrence f32) + floor * cond
//            (validation/float_rule.h: cond = 1 except for the gate gradients dg, dA_log, ddt_bias).
// Each case is a SUBCASE named by CaseSpec::name(); rerun one with -sc='<name>'.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>

#include "core/rng.h"
#include "tests/chunkwise/cw_support.h"
#include "validation/float_rule.h"
#include "validation/tolerance.h"

using namespace kcp;

namespace {

enum class BetaMode { plain, sigmoid, neg_eigval };
enum class GateMode { log_decay, softplus, softplus_no_dt_bias, lower_bound, lower_bound_no_A_log };

struct FlagCombo {
  Variant variant;
  bool l2;
  BetaMode beta;
  GateMode gate;
};

std::vector<FlagCombo> flag_combos() {
  std::vector<FlagCombo> out;
  for (Variant var : {Variant::gdn, Variant::kda, Variant::gla})
    for (bool l2 : {false, true})
      for (BetaMode bm : {BetaMode::plain, BetaMode::sigmoid, BetaMode::neg_eigval})
        for (GateMode gm : {GateMode::log_decay, GateMode::softplus, GateMode::softplus_no_dt_bias,
                            GateMode::lower_bound, GateMode::lower_bound_no_A_log}) {
          const bool lb = gm == GateMode::lower_bound || gm == GateMode::lower_bound_no_A_log;
          if (var == Variant::gla && bm != BetaMode::plain) continue;  // no beta
          if (var == Variant::gdn && lb) continue;                       // lower bound is per-channel
          out.push_back({var, l2, bm, gm});
        }
  return out;
}

void apply_flags(const FlagCombo& f, val::CaseSpec& s) {
  s.variant = f.variant;
  s.flags.use_qk_l2norm_in_kernel = f.l2;
  s.flags.use_beta_sigmoid_in_kernel = f.beta != BetaMode::plain;
  s.flags.allow_neg_eigval = f.beta == BetaMode::neg_eigval;
  s.flags.use_gate_in_kernel = f.gate != GateMode::log_decay;
  if (f.gate == GateMode::lower_bound || f.gate == GateMode::lower_bound_no_A_log) s.flags.lower_bound = -3.0;
  s.dt_bias = f.gate != GateMode::softplus_no_dt_bias;
  s.A_log = f.gate != GateMode::lower_bound_no_A_log;
}

// Every flag combination at every chunk size; layout, sizes and state options drawn from the seed.
std::vector<val::CaseSpec> sweep_cases(uint64_t seed) {
  std::vector<val::CaseSpec> out;
  const std::vector<FlagCombo> combos = flag_combos();
  for (int64_t C : {16, 32, 64})
    for (const FlagCombo& f : combos) {
      const uint64_t id = out.size();
      const CounterRng rng{seed, 1000 + id};
      auto pick = [&](uint64_t i, int64_t n) { return int64_t(rng.bits(i) % uint64_t(n)); };
      val::CaseSpec s;
      apply_flags(f, s);
      s.chunk_size = C;
      const int64_t odd_long = 3 * C + 2 * pick(0, C) + 1;
      std::vector<int64_t> lens = {0, 1, C - 1, C, C + 1, 2 * C - 1, odd_long};
      for (size_t i = lens.size(); i > 1; --i) std::swap(lens[i - 1], lens[size_t(pick(10 + i, int64_t(i)))]);
      switch (pick(1, 4)) {  // layouts: packed with GVA (two group sizes), packed plain, dense batch
        case 0: s.seqlens = lens, s.H = 1, s.HV = 2; break;
        case 1: s.seqlens = lens, s.H = 2, s.HV = 6; break;
        case 2: s.seqlens = lens, s.H = 2, s.HV = 2; break;
        default:  // dense batch; T >= C - 1 so that every gradient is nonzero
          s.B = 2, s.T = std::vector<int64_t>{C - 1, C + 1, odd_long}[size_t(pick(2, 3))], s.H = 1, s.HV = 3;
          break;
      }
      s.K = 8 + pick(3, 9), s.V = 8 + pick(4, 9);  // 8..16
      if (id % 12 == 5) s.K = 32, s.V = 64;
      if (id % 12 == 11) s.K = 64, s.V = 32;
      s.flags.state_v_first = pick(5, 2) == 1;
      s.initial_state = pick(6, 4) != 0;
      s.final_state = pick(7, 4) != 0;
      s.seed = seed + id;
      out.push_back(s);
    }
  return out;
}

// Worst errors over all subcases run, printed once at exit (doctest re-enters a TEST_CASE per SUBCASE).
struct Report {
  double f64_worst = 0, f32_worst_ratio = 0, f32_worst_rel = 0, f32_worst_use = 0, f32_worst_strict = 0;
  std::string f64_where, f32_where, f32_use_where, f32_strict_where;
  ~Report() {
    if (!f64_where.empty())
      std::printf("chunkwise f64 vs recurrence f64: worst rel_l2 %.3g (bar %.0e) at %s\n", f64_worst,
                  val::tol::kExactF64, f64_where.c_str());
    if (!f32_where.empty())
      std::printf("chunkwise f32 vs recurrence f64: worst ratio to the f32 recurrence's error %.3g (rel_l2 %.3g) "
                  "at %s\n",
                  f32_worst_ratio, f32_worst_rel, f32_where.c_str());
    if (!f32_where.empty())
      std::printf("chunkwise f32: per-token tensors, largest error as a fraction of the 2x rule %.3g at %s\n",
                  f32_worst_use, f32_use_where.c_str());
    if (!f32_where.empty())  // the rule with an unconditioned floor on every tensor, dA_log and ddt_bias included
      std::printf("chunkwise f32: any tensor, largest error as a fraction of the rule without conditioning %.3g at %s\n",
                  f32_worst_strict, f32_strict_where.c_str());
  }
} report;

}  // namespace

TEST_CASE("chunkwise float64 equals the float64 recurrence on every output and gradient") {
  const uint64_t seed = val::seed_from_env(300);
  for (const val::CaseSpec& s : sweep_cases(seed)) {
    SUBCASE(s.name().c_str()) {
      const val::CaseData c = val::make_case(s);
      const auto ref = test::run_backend<double>("cpu-recurrent", c);
      const auto cand = test::run_backend<double>("cpu-chunkwise", c);
      for (const test::TensorErr& e : test::compare_runs(cand, ref)) {
        INFO(s.name(), " ", e.name, ": rel_l2 ", e.rel, " (|ref| = ", e.ref_norm, ")");
        CHECK(e.ref_norm > 0);  // a zero reference would make the comparison vacuous
        CHECK(e.rel < val::tol::kExactF64);
        if (e.rel >= report.f64_worst) report.f64_worst = e.rel, report.f64_where = s.name() + " " + e.name;
      }
    }
  }
}

TEST_CASE("chunkwise float32 stays within the float32 rule against the float64 recurrence") {
  const uint64_t seed = val::seed_from_env(300);
  const auto cases = sweep_cases(seed);
  for (size_t i = 0; i < cases.size(); i += 2) {  // every other case of the sweep: all combos, mixed C
    const val::CaseSpec& s = cases[i];
    SUBCASE(s.name().c_str()) {
      const val::CaseData c = val::make_case(s);
      const auto oracle = test::run_backend<double>("cpu-recurrent", c);
      const auto base = test::compare_runs(test::run_backend<float>("cpu-recurrent", c), oracle);
      const auto cand = test::compare_runs(test::run_backend<float>("cpu-chunkwise", c), oracle);
      const val::GradConditioning cond = val::grad_conditioning(c.problem(), c.inputs(), c.cotangents(), oracle.gr.dg.view());
      REQUIRE(base.size() == cand.size());
      for (size_t t = 0; t < cand.size(); ++t) {
        const bool param = cand[t].name == "dg" || cand[t].name == "dA_log" || cand[t].name == "ddt_bias";  // conditioned sums
        const double bar = val::float_rule_bar(base[t].rel, cond.of(cand[t].name));
        const double strict = val::float_rule_bar(base[t].rel);
        if (cand[t].rel / strict >= report.f32_worst_strict)
          report.f32_worst_strict = cand[t].rel / strict, report.f32_strict_where = s.name() + " " + cand[t].name;
        INFO(s.name(), " ", cand[t].name, ": chunkwise f32 ", cand[t].rel, ", recurrence f32 ", base[t].rel,
             ", condition ", cond.of(cand[t].name), ", bar ", bar);
        CHECK(cand[t].rel <= bar);
        const double ratio = cand[t].rel / std::max(base[t].rel, 1e-300);
        if (!param && cand[t].rel / bar >= report.f32_worst_use)
          report.f32_worst_use = cand[t].rel / bar, report.f32_use_where = s.name() + " " + cand[t].name;
        if (ratio >= report.f32_worst_ratio)
          report.f32_worst_ratio = ratio, report.f32_worst_rel = cand[t].rel,
          report.f32_where = s.name() + " " + cand[t].name;
      }
    }
  }
}
