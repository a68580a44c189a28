// The token recurrence (the oracle): hand-worked steps, identities that must hold exactly, the
// transition primitives, float vs double, and bitwise determinism across thread counts.
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <cstring>

#include "reference/backend_cpu.h"
#include "validation/compare.h"
#include "validation/run_case.h"
#include "validation/tolerance.h"

using namespace kcp;

namespace {

std::unique_ptr<Backend> oracle() { return ref::make_cpu_backend(ref::CpuAlgorithm::recurrent); }

double rel(const TensorView& a, const TensorView& b) { return val::compare(a, b).rel_l2; }

// The two-token example worked by hand in the comments of the first test case.
val::CaseData hand_case(Variant v) {
  val::CaseSpec s;
  s.variant = v, s.T = 2, s.H = s.HV = 1, s.K = s.V = 2;
  val::CaseData c = val::make_case(s);
  c.q = Tensor<double>({1, 2, 1, 2}), c.k = c.q, c.v = c.q, c.h0 = Tensor<double>({1, 1, 2, 2});
  c.q(0, 0, 0, 0) = 1, c.q(0, 0, 0, 1) = 1, c.q(0, 1, 0, 0) = 1;  // q1 = (1,1), q2 = (1,0)
  c.k(0, 0, 0, 0) = 1, c.k(0, 1, 0, 1) = 1;                       // k1 = (1,0), k2 = (0,1)
  c.v(0, 0, 0, 0) = 1, c.v(0, 0, 0, 1) = 1, c.v(0, 1, 0, 1) = 2;  // v1 = (1,1), v2 = (0,2)
  c.h0(0, 0, 0, 0) = 1, c.h0(0, 0, 1, 1) = 1;                     // h0 = I
  if (v == Variant::gdn) {  // alpha1 = 0.5, alpha2 = 1
    c.g = Tensor<double>({1, 2, 1});
    c.g(0, 0, 0) = std::log(0.5);
  } else {                  // alpha1 = (0.5, 1), alpha2 = (1, 0.5)
    c.g = Tensor<double>({1, 2, 1, 2});
    c.g(0, 0, 0, 0) = std::log(0.5), c.g(0, 1, 0, 1) = std::log(0.5);
  }
  if (v != Variant::gla) {
    c.beta = Tensor<double>({1, 2, 1});
    c.beta(0, 0, 0) = 1, c.beta(0, 1, 0) = 0.5;
  }
  c.spec.scale = 1.0;
  return c;
}

}  // namespace

TEST_CASE("hand-worked two-token examples (K = V = 2, scale 1)") {
  // kda, token 1: Sd = diag(.5,1) I; e = v1 - Sd^T k1 = (1,1)-(.5,0) = (.5,1); S = Sd + k1 e^T = [[1,1],[0,1]];
  //      o1 = S^T q1 = (1,2). token 2: Sd = diag(1,.5) S = [[1,1],[0,.5]]; e = v2 - Sd^T k2 = (0,1.5);
  //      S = Sd + .5 k2 e^T = [[1,1],[0,1.25]]; o2 = S^T q2 = (1,1).
  // gdn, token 1: Sd = .5 I; e = (.5,1); S = [[1,1],[0,.5]]; o1 = (1,1.5). token 2 (alpha 1): as kda -> (1,1).
  // gla, token 1: S = diag(.5,1) I + k1 v1^T = [[1.5,1],[0,1]]; o1 = (1.5,2).
  //      token 2: S = diag(1,.5) S + k2 v2^T = [[1.5,1],[0,2.5]]; o2 = (1.5,1).
  struct Expect { Variant v; double o[4]; double ht[4]; };
  const Expect cases[] = {{Variant::kda, {1, 2, 1, 1}, {1, 1, 0, 1.25}},
                          {Variant::gdn, {1, 1.5, 1, 1}, {1, 1, 0, 1.25}},
                          {Variant::gla, {1.5, 2, 1.5, 1}, {1.5, 1, 0, 2.5}}};
  for (const Expect& e : cases) {
    SUBCASE(std::string(variant_name(e.v)).c_str()) {
      const auto c = hand_case(e.v);
      auto be = oracle();
      const auto r = val::run_case<double>(*be, c, false);
      for (int i = 0; i < 4; ++i) {
        CHECK(r.out.o.data()[i] == doctest::Approx(e.o[i]).epsilon(val::tol::kElementF64));
        CHECK(r.out.final_state.data()[i] == doctest::Approx(e.ht[i]).epsilon(val::tol::kElementF64));
      }
    }
  }
}

TEST_CASE("beta = 0 only decays the state") {
  for (Variant v : {Variant::gdn, Variant::kda}) {
    val::CaseSpec s;
    s.variant = v, s.T = 13, s.K = 5, s.V = 3, s.seed = val::seed_from_env(3);
    SUBCASE(s.name().c_str()) {
      auto c = val::make_case(s);
      for (double& b : c.beta.vec()) b = 0;
      auto be = oracle();
      const auto r = val::run_case<double>(*be, c, false);
      for (int64_t hv = 0; hv < s.HV; ++hv) {
        std::vector<double> decay(size_t(s.K), 0.0);  // cumulative log decay per key channel
        for (int64_t t = 0; t < s.T; ++t) {
          for (int64_t i = 0; i < s.K; ++i) decay[size_t(i)] += v == Variant::gdn ? c.g(0, t, hv) : c.g(0, t, hv, i);
          for (int64_t j = 0; j < s.V; ++j) {
            double o = 0;
            for (int64_t i = 0; i < s.K; ++i) o += std::exp(decay[size_t(i)]) * c.h0(0, hv, i, j) * c.q(0, t, hv / (s.HV / s.H), i);
            CHECK(r.out.o(0, t, hv, j) == doctest::Approx(o * c.problem().scale).epsilon(val::tol::kElementF64));
          }
        }
        for (int64_t i = 0; i < s.K; ++i)
          for (int64_t j = 0; j < s.V; ++j)
            CHECK(r.out.final_state(0, hv, i, j) == doctest::Approx(std::exp(decay[size_t(i)]) * c.h0(0, hv, i, j)).epsilon(val::tol::kElementF64));
      }
    }
  }
}

TEST_CASE("gla with g = 0 is causal linear attention") {
  val::CaseSpec s;
  s.variant = Variant::gla, s.T = 9, s.initial_state = false, s.seed = val::seed_from_env(4);
  auto c = val::make_case(s);
  for (double& g : c.g.vec()) g = 0;
  auto be = oracle();
  const auto r = val::run_case<double>(*be, c, false);
  const double scale = c.problem().scale;
  for (int64_t hv = 0; hv < s.HV; ++hv)
    for (int64_t t = 0; t < s.T; ++t)
      for (int64_t j = 0; j < s.V; ++j) {
        double o = 0;
        for (int64_t u = 0; u <= t; ++u) {
          double qk = 0;
          for (int64_t i = 0; i < s.K; ++i) qk += c.q(0, t, hv, i) * c.k(0, u, hv, i);
          o += scale * qk * c.v(0, u, hv, j);
        }
        CHECK(r.out.o(0, t, hv, j) == doctest::Approx(o).epsilon(val::tol::kElementF64));
      }
}

TEST_CASE("kda with the same gate on every channel equals gdn, forward and backward") {
  val::CaseSpec s;
  s.variant = Variant::gdn, s.seqlens = {7, 1, 12}, s.H = 1, s.HV = 2, s.K = 6, s.V = 5;
  s.flags.use_qk_l2norm_in_kernel = true, s.seed = val::seed_from_env(5);
  const auto gdn = val::make_case(s);
  auto kda = gdn;
  kda.spec.variant = Variant::kda;
  kda.g = Tensor<double>({1, gdn.spec.T, 2, 6});
  for (int64_t t = 0; t < gdn.spec.T; ++t)
    for (int64_t hv = 0; hv < 2; ++hv)
      for (int64_t i = 0; i < 6; ++i) kda.g(0, t, hv, i) = gdn.g(0, t, hv);
  auto be = oracle();
  const auto a = val::run_case<double>(*be, gdn, true), b = val::run_case<double>(*be, kda, true);
  CHECK(rel(b.out.o.view(), a.out.o.view()) < val::tol::kIdentityF64);
  CHECK(rel(b.out.final_state.view(), a.out.final_state.view()) < val::tol::kIdentityF64);
  CHECK(rel(b.grads.dq.view(), a.grads.dq.view()) < val::tol::kIdentityF64);
  CHECK(rel(b.grads.dk.view(), a.grads.dk.view()) < val::tol::kIdentityF64);
  CHECK(rel(b.grads.dv.view(), a.grads.dv.view()) < val::tol::kIdentityF64);
  CHECK(rel(b.grads.dbeta.view(), a.grads.dbeta.view()) < val::tol::kIdentityF64);
  CHECK(rel(b.grads.dh0.view(), a.grads.dh0.view()) < val::tol::kIdentityF64);
  // the gdn gate gradient is the sum of the per-channel ones
  Tensor<double> summed(a.grads.dg.shape());
  for (int64_t t = 0; t < gdn.spec.T; ++t)
    for (int64_t hv = 0; hv < 2; ++hv)
      for (int64_t i = 0; i < 6; ++i) summed(0, t, hv) += b.grads.dg(0, t, hv, i);
  CHECK(rel(summed.view(), a.grads.dg.view()) < val::tol::kIdentityF64);
}
