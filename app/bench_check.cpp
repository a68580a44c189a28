// check_bench_row (see bench_check.h).
#include "app/bench_check.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "core/transition.h"
#include "validation/cases.h"
#include "validation/compare.h"
#include "validation/float_rule.h"
#include "validation/registry.h"

namespace kcp::app {
namespace {

using val::compare;

Problem in_precision(Problem p, DType compute) {
  p.compute = compute;
  return p;
}

// Judges one tensor (the candidate in the timed backend's memory, stored in its own dtype); keeps the
// worst err/bar and the first failure.
struct Judge {
  Judge(Queue& q, DType in) : queue(q), input(in) {}
  Queue& queue;  // the timed backend's
  DType input;   // q, k, v
  BenchVerdict v;
  double worst = 0;
  const char* worst_name = "";
  // `rule`: the tensor whose bar applies (default: `name`'s own).
  void operator()(const char* name, const TensorView& cand, const TensorView& base, const TensorView& oracle,
                  double cond = 1.0, const char* rule = nullptr) {
    const val::Metrics m = compare(download_tensor<double>(queue, cand).view(), oracle);
    const double bar = val::device_result_bar(rule ? rule : name, input, cand.dtype, compare(base, oracle).rel_l2, cond);
    const double r = m.finite_ok() ? m.rel_l2 / bar : 1e300;
    if (r > worst) worst = r, worst_name = name;
    if (r > 1 && v.ok) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "WRONG: %s rel_l2 %.2e > bar %.2e (NaN %lld)", name, m.rel_l2, bar,
                    (long long)m.nan_a);
      v.ok = false, v.text = buf;
    }
  }
  BenchVerdict done() {
    if (v.ok) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "checked (worst %s %.2g of its bar)", worst_name, worst);
      v.text = buf;
    }
    return v;
  }
};

}  // namespace

BenchVerdict check_bench_row(Backend& be, const BenchShape& s, const Problem& p, uint64_t seed, const TensorView& o,
                             const Grads& g) {
  const bool backward = !g.dq.empty();
  auto oracle_be = val::backend_create("cpu-chunkwise"), base_be = val::backend_create("cpu-recurrent");
  const BenchInputs hin = make_bench_inputs(*oracle_be, s, 0, p.T, seed, backward);
  const Problem p64 = in_precision(p, DType::f64), p32 = in_precision(p, DType::f32);
  const Cotangents dc{hin.d_o, {}};
  val::OutputSet<double> ro = val::make_outputs<double>(p64, false);
  val::OutputSet<float> bo = val::make_outputs<float>(p32, false);
  oracle_be->forward(p64, hin.in, ro.views());
  base_be->forward(p32, hin.in, bo.views());
  Judge judge{be.queue(), s.qkv};
  judge("o", o, bo.o.view(), ro.o.view());
  if (!backward) return judge.done();
  val::GradSet<double> rg = val::make_grads<double>(p64, hin.in);
  val::GradSet<float> bg = val::make_grads<float>(p32, hin.in);
  oracle_be->backward(p64, hin.in, dc, rg.views());
  base_be->backward(p32, hin.in, dc, bg.views());
  const val::GradConditioning cond = val::grad_conditioning(p64, hin.in, dc, rg.dg.view());
  const std::pair<const char*, std::tuple<TensorView, TensorView, TensorView>> items[] = {
      {"dq", {g.dq, bg.dq.view(), rg.dq.view()}},
      {"dk", {g.dk, bg.dk.view(), rg.dk.view()}},
      {"dv", {g.dv, bg.dv.view(), rg.dv.view()}},
      {"dg", {g.dg, bg.dg.view(), rg.dg.view()}},
      {"dbeta", {g.dbeta, bg.dbeta.view(), rg.dbeta.view()}},
      {"dA_log", {g.dA_log, bg.dA_log.view(), rg.dA_log.view()}},
      {"ddt_bias", {g.ddt_bias, bg.ddt_bias.view(), rg.ddt_bias.view()}}};
  for (const auto& [name, t] : items) {
    const auto& [cand, base, oracle] = t;
    if (cand.empty() || oracle.empty()) continue;
    judge(name, cand, base, oracle, cond.of(name));
  }
  return judge.done();
}

BenchVerdict check_bench_transitions(Backend& be, const BenchShape& s, const Problem& p, uint64_t seed,
                                     const TensorView& fwd, const TensorView& bwd) {
  auto oracle_be = val::backend_create("cpu-chunkwise"), base_be = val::backend_create("cpu-recurrent");
  const BenchInputs hin = make_bench_inputs(*oracle_be, s, 0, p.T, seed, true);
  const Problem p64 = in_precision(p, DType::f64), p32 = in_precision(p, DType::f32);
  const Shape shape = transition_shape(p.N, p.HV, p.K, p.V);
  Judge judge{be.queue(), s.qkv};
  for (const bool backward : {false, true}) {
    Tensor<double> ro(shape);
    Tensor<float> bo(shape);
    if (backward) {
      oracle_be->transition_backward(p64, hin.in, hin.d_o, 0, ro.view());
      base_be->transition_backward(p32, hin.in, hin.d_o, 0, bo.view());
    } else {
      oracle_be->transition_forward(p64, hin.in, 0, ro.view());
      base_be->transition_forward(p32, hin.in, 0, bo.view());
    }
    judge(backward ? "transition_bwd" : "transition_fwd", backward ? bwd : fwd, bo.view(), ro.view(), 1.0, "final_state");
  }
  return judge.done();
}

}  // namespace kcp::app
