// Runs a backend on a seeded case and returns owning outputs and gradients in the case's compute
// precision; the common first step of every comparison test and of the sweeps.
#pragma once

#include "core/backend.h"
#include "validation/cases.h"

namespace kcp::val {

template <class S>
struct RunResult {
  OutputSet<S> out;
  GradSet<S> grads;  // empty unless backward was requested
};

template <class S>
RunResult<S> run_case(Backend& be, const CaseData& c, bool backward) {
  const Problem p = c.problem(dtype_of<S>());
  RunResult<S> r;
  r.out = make_outputs<S>(p, !c.dht.empty() || c.spec.final_state);
  be.forward(p, c.inputs(), r.out.views());
  if (backward) {
    r.grads = make_grads<S>(p, c.inputs());
    be.backward(p, c.inputs(), c.cotangents(), r.grads.views());
  }
  return r;
}

// Every output and gradient of a result as (name, tensor) pairs, for loops over "each tensor".
template <class S>
std::vector<std::pair<const char*, const Tensor<S>*>> named_tensors(const RunResult<S>& r) {
  std::vector<std::pair<const char*, const Tensor<S>*>> v = {
      {"o", &r.out.o},         {"final_state", &r.out.final_state}, {"dq", &r.grads.dq},
      {"dk", &r.grads.dk},     {"dv", &r.grads.dv},                 {"dg", &r.grads.dg},
      {"dbeta", &r.grads.dbeta}, {"dinitial_state", &r.grads.dh0},  {"dA_log", &r.grads.dA_log},
      {"ddt_bias", &r.grads.ddt_bias}};
  std::erase_if(v, [](const auto& x) { return x.second->empty() || x.second->numel() == 0; });
  return v;
}

}  // namespace kcp::val
