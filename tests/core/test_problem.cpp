// make_problem() rejects every bad argument with a message naming it and the expected shape or
// range; valid calls derive the right sizes. One SUBCASE per rejected input.
#include <doctest/doctest.h>

#include <cmath>

#include "validation/cases.h"

using namespace kcp;

namespace {

val::CaseData base(Variant v = Variant::kda) {
  val::CaseSpec s;
  s.variant = v;
  s.B = 1, s.T = 9, s.H = 2, s.HV = 4, s.K = 8, s.V = 4;
  return val::make_case(s);
}

void expect_error(const val::CaseData& c, const Flags& f, const ProblemOptions& o, const char* needle) {
  CHECK_THROWS_WITH_AS(make_problem(c.spec.variant, c.inputs(), f, o), doctest::Contains(needle), Error);
}

}  // namespace

TEST_CASE("valid problems derive sizes and defaults") {
  const auto c = base();
  const Problem p = make_problem(Variant::kda, c.inputs(), {}, {});
  CHECK(p.B == 1);
  CHECK(p.T == 9);
  CHECK(p.H == 2);
  CHECK(p.HV == 4);
  CHECK(p.G() == 2);
  CHECK(p.N == 1);
  CHECK(p.scale == doctest::Approx(1 / std::sqrt(8.0)));
  ProblemOptions o;
  o.cu_seqlens = {0, 0, 4, 9};  // an empty sequence is legal (its state passes through)
  auto d = c;
  d.h0 = {};
  CHECK(make_problem(Variant::kda, d.inputs(), {}, o).N == 3);
}

TEST_CASE("bad inputs are rejected with the argument named") {
  const auto c = base();
  Flags f;
  ProblemOptions o;
  SUBCASE("k shape") {
    auto d = c;
    d.k = Tensor<double>({1, 9, 2, 7});
    expect_error(d, f, o, "k: expected shape [B,T,H,K] = [1,9,2,8], got [1,9,2,7]");
  }
  SUBCASE("HV not a multiple of H") {
    auto d = c;
    d.v = Tensor<double>({1, 9, 3, 4});
    expect_error(d, f, o, "HV = 3 value heads must be a multiple of H = 2");
  }
  SUBCASE("g shape") {
    auto d = c;
    d.g = Tensor<double>({1, 9, 4});
    expect_error(d, f, o, "g: expected shape [B,T,HV,K]");
  }
  SUBCASE("beta missing") {
    auto d = c;
    d.beta = {};
    expect_error(d, f, o, "beta: required by kda");
  }
  SUBCASE("cu_seqlens decreasing") {
    o.cu_seqlens = {0, 5, 3, 9};
    expect_error(c, f, o, "cu_seqlens: must be nondecreasing, but entry 2 = 3 < entry 1 = 5");
  }
  SUBCASE("cu_seqlens not ending at T") {
    o.cu_seqlens = {0, 5, 8};
    expect_error(c, f, o, "cu_seqlens: must end at T = 9, got 8");
  }
  SUBCASE("cu_seqlens with B != 1") {
    val::CaseSpec s = c.spec;
    s.B = 2;
    o.cu_seqlens = {0, 9};
    expect_error(val::make_case(s), f, o, "packed sequences need B = 1, got B = 2");
  }
  SUBCASE("initial state of the wrong sequence count") {
    o.cu_seqlens = {0, 4, 9};
    expect_error(c, f, o, "initial_state: expected shape [N,HV,K,V] = [2,4,8,4], got [1,4,8,4]");
  }
  SUBCASE("A_log missing for the softplus gate") {
    f.use_gate_in_kernel = true;
    expect_error(c, f, o, "A_log: required by use_gate_in_kernel");
  }
  SUBCASE("A_log without the fused gate") {
    auto d = c;
    d.A_log = Tensor<double>({4});
    expect_error(d, f, o, "A_log: given without use_gate_in_kernel");
  }
  SUBCASE("dt_bias of the wrong size") {
    auto d = c;
    f.use_gate_in_kernel = true;
    d.A_log = Tensor<double>({4});
    d.dt_bias = Tensor<double>({4});
    expect_error(d, f, o, "dt_bias: expected shape [HV*K] = [32], got [4]");
  }
  SUBCASE("lower_bound not negative") {
    f.lower_bound = 0.5;
    expect_error(c, f, o, "lower_bound: must be negative and finite, got 0.5");
  }
  SUBCASE("lower_bound on gdn") {
    f.lower_bound = -1.0;
    expect_error(base(Variant::gdn), f, o, "lower_bound: applies to per-channel gates");
  }
  SUBCASE("safe_gate out of range") {
    f.safe_gate = true;
    f.lower_bound = -6.0;
    expect_error(c, f, o, "safe_gate: requires -5 <= lower_bound < 0");
  }
  SUBCASE("allow_neg_eigval without the sigmoid") {
    f.allow_neg_eigval = true;
    expect_error(c, f, o, "allow_neg_eigval: requires use_beta_sigmoid_in_kernel");
  }
  SUBCASE("NaN in an input") {
    auto d = c;
    d.v(0, 3, 1, 2) = NAN;
    expect_error(d, f, o, "v: non-finite value nan at index [0,3,1,2]");
  }
  SUBCASE("Inf in the initial state") {
    auto d = c;
    d.h0(0, 2, 1, 1) = -INFINITY;
    expect_error(d, f, o, "initial_state: non-finite value -inf at index [0,2,1,1]");
  }
  SUBCASE("beta given to gla") {
    val::CaseData d = base(Variant::gla);
    d.beta = Tensor<double>({1, 9, 4});
    expect_error(d, f, o, "beta: gla has no beta");
  }
  SUBCASE("scale not finite") {
    o.scale = NAN;
    expect_error(c, f, o, "scale: must be positive and finite");
  }
}

TEST_CASE("output and gradient views are shape-checked") {
  const auto c = base();
  const Problem p = c.problem();
  Tensor<double> bad({1, 9, 4, 5});
  CHECK_THROWS_WITH_AS(check_outputs(p, {bad.view(), {}}), doctest::Contains("o: expected shape [B,T,HV,V]"), Error);
  Grads g;
  g.dA_log = Tensor<double>({4}).view();
  CHECK_THROWS_WITH_AS(check_grads(p, c.inputs(), g), doctest::Contains("dA_log: requested, but A_log was not given"),
                       Error);
}
