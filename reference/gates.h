// The pre-processing FLA can fuse into the kernel, each with its backward (ALGORITHMS.md 2.1-2.2, 3.3):
//   l2norm:   y = x * rstd,  rstd = 1/sqrt(sum x^2 + 1e-6);           dx = rstd (dy - (dy.y) y)
//   beta:     b = s * sigmoid(r), s = 2 with allow_neg_eigval;         dr = db s sig (1 - sig)
//   softplus gate:    a = -exp(A_log) softplus(x), x = g + dt_bias;   dx = -da exp(A_log) sigmoid(x)
//   lower-bound gate: a = lb sigmoid(z), z = c x, c = exp(A_log) or 1; dx = c da lb sig (1 - sig)
//   dA_log accumulates da * a (softplus) or dz * z (lower bound, only when A_log is given).
// softplus uses FLA's threshold: softplus(x) = x for x > 20.
// Covered by tests/reference/test_gradients.cpp (finite differences through every flag).
#pragma once

#include <cmath>

#include "core/problem.h"

namespace kcp::ref {

constexpr double kL2NormEps = 1e-6;        // FLA's l2norm_fwd: rsqrt(sum x^2 + 1e-6)
constexpr double kSoftplusThreshold = 20;  // FLA (and torch.nn.functional.softplus) threshold

template <class S> S sigmoid(S x) { return S(1) / (S(1) + std::exp(-x)); }
template <class S> S softplus(S x) { return x > S(kSoftplusThreshold) ? x : std::log1p(std::exp(x)); }
template <class S> S softplus_grad(S x) { return x > S(kSoftplusThreshold) ? S(1) : sigmoid(x); }

// Gate parameters of one value head.
template <class S>
struct GateParams {
  GateFormula formula = GateFormula::log_decay;
  bool has_A_log = false;
  S A_log = 0;  // log of the decay rate scale
  S lower_bound = 0;
};

// a = gate(x) for one element.
template <class S>
S gate_forward(const GateParams<S>& p, S x) {
  switch (p.formula) {
    case GateFormula::log_decay: return x;
    case GateFormula::softplus: return -std::exp(p.A_log) * softplus(x);
    case GateFormula::lower_bound: {
      const S z = p.has_A_log ? std::exp(p.A_log) * x : x;
      return p.lower_bound * sigmoid(z);
    }
  }
  return x;
}

// Returns dL/dx for one element and adds its dL/dA_log contribution to *dA_log.
template <class S>
S gate_backward(const GateParams<S>& p, S x, S da, S* dA_log) {
  switch (p.formula) {
    case GateFormula::log_decay: return da;
    case GateFormula::softplus: {
      const S c = std::exp(p.A_log);
      *dA_log += da * (-c * softplus(x));
      return -da * c * softplus_grad(x);
    }
    case GateFormula::lower_bound: {
      const S c = p.has_A_log ? std::exp(p.A_log) : S(1), z = c * x, s = sigmoid(z);
      const S dz = da * p.lower_bound * s * (S(1) - s);
      if (p.has_A_log) *dA_log += dz * z;
      return c * dz;
    }
  }
  return da;
}

template <class S> S beta_scale(const Flags& f) { return f.allow_neg_eigval ? S(2) : S(1); }

}  // namespace kcp::ref
