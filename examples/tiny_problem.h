// A tiny gdn problem shared by the examples: two packed sequences (cu_seqlens [0, 37, 100]), H = 2
// heads, K = V = 16, float64 inputs drawn from kcp's counter RNG (the same on every rank).
#pragma once
#include <cmath>

#include <kcp/core/problem.h>
#include <kcp/core/rng.h>
#include <kcp/core/tensor.h>

struct TinyProblem {
  static constexpr int64_t T = 100, H = 2, K = 16, V = 16;
  std::vector<int64_t> cu_seqlens{0, 37, 100};
  kcp::Tensor<double> q{{1, T, H, K}}, k{{1, T, H, K}}, v{{1, T, H, V}}, g{{1, T, H}}, beta{{1, T, H}};

  TinyProblem() {
    const kcp::CounterRng rng{2026, 1};
    uint64_t i = 0;
    for (auto* t : {&q, &k, &v})
      for (int64_t e = 0; e < t->numel(); ++e) t->data()[e] = rng.normal(i++);
    for (int64_t e = 0; e < g.numel(); ++e) g.data()[e] = -0.1 * rng.uniform(i++);  // log decay < 0
    for (int64_t e = 0; e < beta.numel(); ++e) beta.data()[e] = rng.uniform(i++);
    for (int64_t t = 0; t < T * H; ++t) {  // unit-norm keys keep the delta rule contractive
      double n = 0;
      for (int64_t d = 0; d < K; ++d) n += k.data()[t * K + d] * k.data()[t * K + d];
      for (int64_t d = 0; d < K; ++d) k.data()[t * K + d] /= std::sqrt(n);
    }
  }
  kcp::Inputs inputs() const {
    kcp::Inputs in;
    in.q = q.view(), in.k = k.view(), in.v = v.view(), in.g = g.view(), in.beta = beta.view();
    return in;
  }
};
