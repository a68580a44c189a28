// Causal depthwise conv1d: finite differences for dx, dweight, dbias, dhalo; a sequence split in two
// with the first part's tail as halo reproduces the unsplit y and, with the halo gradient sent back,
// the unsplit dx; zero history at every packed sequence start.
#include <doctest/doctest.h>

#include <cmath>

#include "core/rng.h"
#include "reference/conv1d.h"
#include "validation/compare.h"
#include "validation/tolerance.h"

using namespace kcp;

namespace {

Tensor<double> randn(const Shape& s, uint64_t seed, uint64_t stream) {
  Tensor<double> t(s);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = CounterRng{seed, stream}.normal(uint64_t(i));
  return t;
}

double loss(const ref::Conv1dProblem& p, const Tensor<double>& x, const Tensor<double>& w, const Tensor<double>& b,
            const Tensor<double>& halo, const Tensor<double>& dy) {
  Tensor<double> y(x.shape());
  ref::conv1d_forward(p, x.view(), w.view(), b.view(), halo.view(), y.view());
  double L = 0;
  for (int64_t i = 0; i < y.numel(); ++i) L += y.data()[i] * dy.data()[i];
  return L;
}

}  // namespace

TEST_CASE("conv1d backward matches finite differences (packed, halo, SiLU and identity)") {
  const uint64_t seed = 11;
  for (bool silu : {true, false}) {
    for (int64_t W : {2, 3, 4}) {
      const std::vector<int64_t> cu = {0, 5, 6, 13};
      Tensor<double> x = randn({1, 13, 3}, seed, 1), w = randn({3, W}, seed, 2), b = randn({3}, seed, 3);
      Tensor<double> halo = randn({W - 1, 3}, seed, 4), dy = randn({1, 13, 3}, seed, 5);
      const auto p = ref::make_conv1d_problem(x.view(), w.view(), b.view(), cu, silu, halo.view());
      Tensor<double> dx(x.shape()), dw(w.shape()), db(b.shape()), dh(halo.shape());
      ref::conv1d_backward(p, x.view(), w.view(), b.view(), halo.view(), dy.view(), dx.view(), dw.view(), db.view(),
                           dh.view());
      struct Pair { const char* name; Tensor<double>* v; Tensor<double>* g; };
      for (Pair pr : {Pair{"x", &x, &dx}, Pair{"weight", &w, &dw}, Pair{"bias", &b, &db}, Pair{"halo", &halo, &dh}}) {
        double d2 = 0, r2 = 0;
        for (int64_t i = 0; i < pr.v->numel(); ++i) {
          const double x0 = pr.v->data()[i], h = val::tol::kFdStep;
          pr.v->data()[i] = x0 + h;
          const double lp = loss(p, x, w, b, halo, dy);
          pr.v->data()[i] = x0 - h;
          const double lm = loss(p, x, w, b, halo, dy);
          pr.v->data()[i] = x0;
          const double fd = (lp - lm) / (2 * h);
          d2 += (fd - pr.g->data()[i]) * (fd - pr.g->data()[i]), r2 += pr.g->data()[i] * pr.g->data()[i];
        }
        INFO("silu=", silu, " W=", W, " input ", pr.name);
        CHECK(r2 > 0);
        CHECK(std::sqrt(d2 / r2) < val::tol::kFdRel);
      }
    }
  }
}

TEST_CASE("conv1d: a split sequence with the previous part's tail as halo equals the whole") {
  const int64_t T = 10, D = 4, W = 4, cut = 6;
  Tensor<double> x = randn({1, T, D}, 3, 1), w = randn({D, W}, 3, 2), dy = randn({1, T, D}, 3, 5);
  const auto whole = ref::make_conv1d_problem(x.view(), w.view(), {}, {}, true, {});
  Tensor<double> y(x.shape()), dx(x.shape());
  ref::conv1d_forward(whole, x.view(), w.view(), {}, {}, y.view());
  ref::conv1d_backward(whole, x.view(), w.view(), {}, {}, dy.view(), dx.view(), {}, {}, {});
  // second part: tokens [cut, T) with halo = x[cut-(W-1) .. cut)
  Tensor<double> x2({1, T - cut, D}), dy2({1, T - cut, D}), halo({W - 1, D});
  for (int64_t t = 0; t < T - cut; ++t)
    for (int64_t d = 0; d < D; ++d) x2(0, t, d) = x(0, cut + t, d), dy2(0, t, d) = dy(0, cut + t, d);
  for (int64_t t = 0; t < W - 1; ++t)
    for (int64_t d = 0; d < D; ++d) halo(t, d) = x(0, cut - (W - 1) + t, d);
  const auto part = ref::make_conv1d_problem(x2.view(), w.view(), {}, {}, true, halo.view());
  Tensor<double> y2(x2.shape()), dx2(x2.shape()), dhalo(halo.shape());
  ref::conv1d_forward(part, x2.view(), w.view(), {}, halo.view(), y2.view());
  ref::conv1d_backward(part, x2.view(), w.view(), {}, halo.view(), dy2.view(), dx2.view(), {}, {}, dhalo.view());
  for (int64_t t = 0; t < T - cut; ++t)
    for (int64_t d = 0; d < D; ++d) {
      CHECK(y2(0, t, d) == doctest::Approx(y(0, cut + t, d)).epsilon(val::tol::kElementF64));
      CHECK(dx2(0, t, d) == doctest::Approx(dx(0, cut + t, d)).epsilon(val::tol::kElementF64));
    }
  // the halo gradient is the second part's share of dx on the first part's tail
  Tensor<double> dy1({1, cut, D}), x1({1, cut, D}), dx1({1, cut, D});
  for (int64_t t = 0; t < cut; ++t)
    for (int64_t d = 0; d < D; ++d) x1(0, t, d) = x(0, t, d), dy1(0, t, d) = dy(0, t, d);
  const auto first = ref::make_conv1d_problem(x1.view(), w.view(), {}, {}, true, {});
  ref::conv1d_backward(first, x1.view(), w.view(), {}, {}, dy1.view(), dx1.view(), {}, {}, {});
  for (int64_t t = 0; t < W - 1; ++t)
    for (int64_t d = 0; d < D; ++d)
      CHECK(dx1(0, cut - (W - 1) + t, d) + dhalo(t, d) == doctest::Approx(dx(0, cut - (W - 1) + t, d)).epsilon(val::tol::kElementF64));
}
