// Structural identities of the oracle: packed = one by one, grouped heads = repeated q/k heads,
// empty sequences pass the state through, float vs double, transitions vs the recurrence, and
// bitwise determinism for any thread count.
#include <doctest/doctest.h>
#include <omp.h>

#include <cstring>

#include "reference/backend_cpu.h"
#include "validation/compare.h"
#include "validation/run_case.h"
#include "validation/tolerance.h"

using namespace kcp;

namespace {

std::unique_ptr<Backend> oracle() { return ref::make_cpu_backend(ref::CpuAlgorithm::recurrent); }
double rel(const TensorView& a, const TensorView& b) { return val::compare(a, b).rel_l2; }

// Rows [t0, t0+len) of a [1,T,...] tensor as a [1,len,...] tensor.
Tensor<double> slice_rows(const Tensor<double>& x, int64_t t0, int64_t len) {
  Shape s = x.shape();
  const int64_t row = x.numel() / s[1];
  s[1] = len;
  Tensor<double> y(s);
  std::memcpy(y.data(), x.data() + t0 * row, size_t(len * row) * sizeof(double));
  return y;
}

// Entry n of an [N,...] tensor as a [1,...] tensor.
Tensor<double> slice_first(const Tensor<double>& x, int64_t n) {
  Shape s = x.shape();
  const int64_t per = x.numel() / s[0];
  s[0] = 1;
  Tensor<double> y(s);
  std::memcpy(y.data(), x.data() + n * per, size_t(per) * sizeof(double));
  return y;
}

val::CaseSpec flagged(Variant v, uint64_t seed) {
  val::CaseSpec s;
  s.variant = v, s.K = 6, s.V = 5, s.seed = seed;
  s.flags.use_qk_l2norm_in_kernel = true;
  if (v != Variant::gla) s.flags.use_beta_sigmoid_in_kernel = true;
  s.flags.use_gate_in_kernel = true;
  if (v == Variant::kda) s.flags.lower_bound = -4.0;
  return s;
}

}  // namespace

TEST_CASE("a packed batch equals its sequences run one by one") {
  for (Variant v : {Variant::gdn, Variant::kda, Variant::gla}) {
    val::CaseSpec s = flagged(v, val::seed_from_env(20));
    s.seqlens = {6, 1, 0, 11};
    SUBCASE(s.name().c_str()) {
      const auto packed = val::make_case(s);
      auto be = oracle();
      const auto all = val::run_case<double>(*be, packed, true);
      for (size_t n = 0; n < s.seqlens.size(); ++n) {
        const int64_t t0 = packed.cu_seqlens[n], len = s.seqlens[n];
        auto one = packed;
        one.cu_seqlens = {0, len};
        for (Tensor<double>* x : {&one.q, &one.k, &one.v, &one.g, &one.beta, &one.d_o})
          if (!x->empty()) *x = slice_rows(*x, t0, len);
        one.h0 = slice_first(packed.h0, int64_t(n)), one.dht = slice_first(packed.dht, int64_t(n));
        const auto r = val::run_case<double>(*be, one, true);
        CHECK(rel(r.out.final_state.view(), slice_first(all.out.final_state, int64_t(n)).view()) < val::tol::kIdentityF64);
        CHECK(rel(r.grads.dh0.view(), slice_first(all.grads.dh0, int64_t(n)).view()) < val::tol::kIdentityF64);
        if (len == 0) continue;
        CHECK(rel(r.out.o.view(), slice_rows(all.out.o, t0, len).view()) < val::tol::kIdentityF64);
        CHECK(rel(r.grads.dq.view(), slice_rows(all.grads.dq, t0, len).view()) < val::tol::kIdentityF64);
        CHECK(rel(r.grads.dg.view(), slice_rows(all.grads.dg, t0, len).view()) < val::tol::kIdentityF64);
      }
    }
  }
}

TEST_CASE("an empty sequence leaves the state untouched, exactly") {
  val::CaseSpec s = flagged(Variant::kda, val::seed_from_env(21));
  s.seqlens = {4, 0, 3};
  const auto c = val::make_case(s);
  auto be = oracle();
  const auto r = val::run_case<double>(*be, c, true);
  const Tensor<double> h0 = slice_first(c.h0, 1), ht = slice_first(r.out.final_state, 1);
  const Tensor<double> dht = slice_first(c.dht, 1), dh0 = slice_first(r.grads.dh0, 1);
  CHECK(std::memcmp(h0.data(), ht.data(), size_t(h0.numel()) * sizeof(double)) == 0);
  CHECK(std::memcmp(dht.data(), dh0.data(), size_t(dht.numel()) * sizeof(double)) == 0);
}

TEST_CASE("grouped value heads equal q/k heads repeated to HV") {
  for (Variant v : {Variant::gdn, Variant::kda, Variant::gla}) {
    val::CaseSpec s = flagged(v, val::seed_from_env(22));
    s.H = 2, s.HV = 6, s.T = 15;
    SUBCASE(s.name().c_str()) {
      const auto gva = val::make_case(s);
      auto rep = gva;
      rep.spec.H = 6;
      rep.q = Tensor<double>({1, 15, 6, 6}), rep.k = rep.q;
      for (int64_t t = 0; t < 15; ++t)
        for (int64_t hv = 0; hv < 6; ++hv)
          for (int64_t i = 0; i < 6; ++i) rep.q(0, t, hv, i) = gva.q(0, t, hv / 3, i), rep.k(0, t, hv, i) = gva.k(0, t, hv / 3, i);
      auto be = oracle();
      const auto a = val::run_case<double>(*be, gva, true), b = val::run_case<double>(*be, rep, true);
      CHECK(rel(a.out.o.view(), b.out.o.view()) < val::tol::kIdentityF64);
      CHECK(rel(a.grads.dv.view(), b.grads.dv.view()) < val::tol::kIdentityF64);
      CHECK(rel(a.grads.dA_log.view(), b.grads.dA_log.view()) < val::tol::kIdentityF64);
      Tensor<double> dq(a.grads.dq.shape()), dk(dq.shape());  // sum the repeated heads' gradients per group
      for (int64_t t = 0; t < 15; ++t)
        for (int64_t hv = 0; hv < 6; ++hv)
          for (int64_t i = 0; i < 6; ++i) dq(0, t, hv / 3, i) += b.grads.dq(0, t, hv, i), dk(0, t, hv / 3, i) += b.grads.dk(0, t, hv, i);
      CHECK(rel(a.grads.dq.view(), dq.view()) < val::tol::kIdentityF64);
      CHECK(rel(a.grads.dk.view(), dk.view()) < val::tol::kIdentityF64);
    }
  }
}

TEST_CASE("float32 and float64 recurrences agree to float precision") {
  for (Variant v : {Variant::gdn, Variant::kda, Variant::gla}) {
    val::CaseSpec s = flagged(v, val::seed_from_env(23));
    s.seqlens = {40, 3, 77}, s.H = 1, s.HV = 2, s.K = s.V = 16;
    SUBCASE(s.name().c_str()) {
      const auto c = val::make_case(s);
      auto be = oracle();
      const auto d = val::run_case<double>(*be, c, true);
      const auto f = val::run_case<float>(*be, c, true);
      const auto dn = val::named_tensors(d);
      const auto fn = val::named_tensors(f);
      REQUIRE(dn.size() == fn.size());
      for (size_t i = 0; i < dn.size(); ++i) {
        const double e = rel(fn[i].second->view(), dn[i].second->view());
        INFO(dn[i].first, ": float32 vs float64 rel err ", e);
        CHECK(e < val::tol::kFloatVsDouble);
      }
    }
  }
}

TEST_CASE("transitions reproduce the recurrence: M S_in + S_ext and dM dht + dS_ext") {
  for (Variant v : {Variant::gdn, Variant::kda, Variant::gla}) {
    val::CaseSpec s = flagged(v, val::seed_from_env(24));
    s.seqlens = {9, 14}, s.H = 1, s.HV = 2;
    SUBCASE(s.name().c_str()) {
      const auto c = val::make_case(s);
      const Problem p = c.problem();
      auto be = oracle();
      const auto r = val::run_case<double>(*be, c, true);  // with h0 and dht
      const int64_t seq = 1, HV = 2, K = s.K, V = s.V;
      const auto [s_ext, m] = val::sequence_transition(*be, p, c.inputs(), {}, seq, false);
      const auto [ds_ext, mt] = val::sequence_transition(*be, p, c.inputs(), c.d_o.view(), seq, true);
      Tensor<double> fwd({1, HV, K, V}), bwd({1, HV, K, V});
      for (int64_t hv = 0; hv < HV; ++hv)
        for (int64_t i = 0; i < K; ++i)
          for (int64_t j = 0; j < V; ++j) {
            double a = s_ext(hv, i, j), b = ds_ext(hv, i, j);
            for (int64_t l = 0; l < K; ++l) a += m(hv, i, l) * c.h0(seq, hv, l, j), b += mt(hv, i, l) * c.dht(seq, hv, l, j);
            fwd(0, hv, i, j) = a, bwd(0, hv, i, j) = b;
            CHECK(mt(hv, i, j % K) == doctest::Approx(m(hv, j % K, i)).epsilon(val::tol::kElementF64));  // dM = M^T
          }
      CHECK(rel(fwd.view(), slice_first(r.out.final_state, seq).view()) < val::tol::kIdentityF64);
      CHECK(rel(bwd.view(), slice_first(r.grads.dh0, seq).view()) < val::tol::kIdentityF64);
    }
  }
}

TEST_CASE("results are bitwise identical for any thread count") {
  val::CaseSpec s = flagged(Variant::kda, val::seed_from_env(25));
  s.seqlens = {30, 5, 18}, s.H = 1, s.HV = 3;
  const auto c = val::make_case(s);
  auto be = oracle();
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = val::run_case<double>(*be, c, true);
  for (int threads : {2, 3, 5}) {
    omp_set_num_threads(threads);
    const auto many = val::run_case<double>(*be, c, true);
    const auto a = val::named_tensors(one), b = val::named_tensors(many);
    for (size_t i = 0; i < a.size(); ++i) {
      INFO(a[i].first, " with ", threads, " threads");
      CHECK(std::memcmp(a[i].second->data(), b[i].second->data(), size_t(a[i].second->numel()) * sizeof(double)) == 0);
    }
  }
  omp_set_num_threads(saved);
}
