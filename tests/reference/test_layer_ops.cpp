// The layer's own ops (reference/layer_ops.h) against central finite differences, each input and
// weight separately: linear, the per-head L2 norm, the gated RMSNorm (sigmoid and silu gates) and
// the sigmoid. Bar: tol::kFdRel (float64, step kFdStep).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <functional>

#include "core/rng.h"
#include "reference/layer_ops.h"
#include "validation/cases.h"
#include "validation/tolerance.h"

using namespace kcp;
using ref::Mat;
using ref::Vec;

namespace {

Mat<double> randm(int64_t r, int64_t c, uint64_t seed, uint64_t stream) {
  Mat<double> m(r, c);
  const CounterRng rng{seed, stream};
  for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = rng.normal(uint64_t(i));
  return m;
}

// ||fd - analytic|| / ||analytic|| over every element of *x, for the scalar loss().
double fd_rel(double* x, int64_t n, const double* analytic, const std::function<double()>& loss) {
  double d2 = 0, r2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x0 = x[i], h = val::tol::kFdStep;
    x[i] = x0 + h;
    const double lp = loss();
    x[i] = x0 - h;
    const double lm = loss();
    x[i] = x0;
    const double fd = (lp - lm) / (2 * h);
    d2 += (fd - analytic[i]) * (fd - analytic[i]), r2 += analytic[i] * analytic[i];
  }
  return std::sqrt(d2 / r2);
}

double dot(const Mat<double>& a, const Mat<double>& b) { return a.cwiseProduct(b).sum(); }

}  // namespace

TEST_CASE("layer ops: linear backward matches finite differences") {
  const uint64_t seed = val::seed_from_env(21);
  Mat<double> x = randm(5, 3, seed, 1), w = randm(4, 3, seed, 2);
  const Mat<double> dy = randm(5, 4, seed, 3);
  Mat<double> dx = Mat<double>::Zero(5, 3), dw = Mat<double>::Zero(4, 3);
  ref::linear_backward<double>(x, w, dy, &dx, &dw);
  const auto L = [&] { return dot(ref::linear_forward<double>(x, w), dy); };
  const double ex = fd_rel(x.data(), x.size(), dx.data(), L), ew = fd_rel(w.data(), w.size(), dw.data(), L);
  std::printf("layer ops fd (seed %llu): linear dx %.2e dw %.2e\n", (unsigned long long)seed, ex, ew);
  CHECK(ex < val::tol::kFdRel);
  CHECK(ew < val::tol::kFdRel);
}

TEST_CASE("layer ops: l2norm backward matches finite differences") {
  const uint64_t seed = val::seed_from_env(22);
  Mat<double> x = randm(4, 6, seed, 1);
  const Mat<double> dy = randm(4, 6, seed, 2);
  Mat<double> rstd;
  const Mat<double> y = ref::l2norm_forward<double>(x, 3, 1e-6, &rstd);
  const Mat<double> dx = ref::l2norm_backward<double>(y, rstd, dy, 3);
  const double e = fd_rel(x.data(), x.size(), dx.data(), [&] {
    Mat<double> r;
    return dot(ref::l2norm_forward<double>(x, 3, 1e-6, &r), dy);
  });
  std::printf("layer ops fd (seed %llu): l2norm dx %.2e\n", (unsigned long long)seed, e);
  CHECK(e < val::tol::kFdRel);
  for (int64_t h = 0; h < 2; ++h) {  // |y| = sqrt(s / (s + eps)), s = |x|^2
    const double s = x.row(0).segment(h * 3, 3).squaredNorm();
    CHECK(std::abs(y.row(0).segment(h * 3, 3).norm() - std::sqrt(s / (s + 1e-6))) < val::tol::kElementF64);
  }
}

TEST_CASE("layer ops: gated RMSNorm backward matches finite differences (sigmoid and silu)") {
  const uint64_t seed = val::seed_from_env(23);
  for (ref::OutputGate act : {ref::OutputGate::sigmoid, ref::OutputGate::silu}) {
    Mat<double> o = randm(3, 8, seed, 1), z = randm(3, 8, seed, 2);
    Vec<double> w = Vec<double>(randm(4, 1, seed, 3)).array() + 1.0;
    const Mat<double> dy = randm(3, 8, seed, 4);
    Mat<double> d_o, dz;
    Vec<double> dw = Vec<double>::Zero(4);
    ref::rms_gated_backward<double>(o, w, z, 4, 1e-5, act, dy, &d_o, &dz, &dw);
    const auto L = [&] { return dot(ref::rms_gated_forward<double>(o, w, z, 4, 1e-5, act).y, dy); };
    const double eo = fd_rel(o.data(), o.size(), d_o.data(), L), ez = fd_rel(z.data(), z.size(), dz.data(), L);
    const double ew = fd_rel(w.data(), w.size(), dw.data(), L);
    std::printf("layer ops fd (seed %llu): rms_gated %s do %.2e dgate %.2e dw %.2e\n", (unsigned long long)seed,
                act == ref::OutputGate::sigmoid ? "sigmoid" : "silu", eo, ez, ew);
    CHECK(eo < val::tol::kFdRel);
    CHECK(ez < val::tol::kFdRel);
    CHECK(ew < val::tol::kFdRel);
  }
}

TEST_CASE("layer ops: sigmoid backward matches finite differences") {
  Mat<double> r = randm(3, 4, 24, 1);
  const Mat<double> db = randm(3, 4, 24, 2);
  const Mat<double> dr = ref::sigmoid_backward<double>(ref::sigmoid_forward<double>(r), db);
  const double e = fd_rel(r.data(), r.size(), dr.data(), [&] { return dot(ref::sigmoid_forward<double>(r), db); });
  CHECK(e < val::tol::kFdRel);
}
