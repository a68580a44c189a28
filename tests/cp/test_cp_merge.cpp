// The merge algebra of ALGORITHMS.md 5.2-5.4 on the CPU oracle's own transitions, no MPI needed:
// a sequence cut into pieces (lengths 1, uneven, partial chunks) folds back to the whole sequence's
// transition, its final state from h0, and its dh0 through the transposed chain; compose is
// associative with identity (I, 0); a reset (M = 0) forgets everything before it.
#include <doctest/doctest.h>

#include "core/rng.h"
#include "cp/merge.h"
#include "validation/cases.h"
#include "validation/compare.h"
#include "validation/registry.h"
#include "validation/tolerance.h"

using namespace kcp;
using cp::Summary;

namespace {

Summary<double> random_summary(int64_t HV, int64_t K, int64_t V, uint64_t seed) {
  Summary<double> a(HV, K, V);
  for (size_t i = 0; i < a.packed.size(); ++i) a.packed[i] = CounterRng{seed, 9}.normal(i) * 0.5;
  return a;
}

double rel(const std::vector<double>& a, const std::vector<double>& b) {
  return val::compare(TensorView(const_cast<double*>(a.data()), DType::f64, {int64_t(a.size())}),
                      TensorView(const_cast<double*>(b.data()), DType::f64, {int64_t(b.size())}))
      .rel_l2;
}

// Transitions of every sequence of a packed case, forward (S_ext | M) or backward (dS_ext | M^T).
std::vector<Summary<double>> transitions(Backend& be, const val::CaseData& c, bool backward) {
  const Problem p = c.problem();
  std::vector<Summary<double>> out;
  for (int64_t n = 0; n < p.N; ++n) {
    Tensor<double> s({p.HV, p.K, p.V}), m({p.HV, p.K, p.K});
    if (backward) be.transition_backward(p, c.inputs(), c.d_o.view(), n, {s.view(), m.view()});
    else be.transition_forward(p, c.inputs(), n, {s.view(), m.view()});
    Summary<double> a(p.HV, p.K, p.V);
    for (int64_t h = 0; h < p.HV; ++h) {
      a.head(h).leftCols(p.V) = Eigen::Map<ref::Mat<double>>(s.data() + h * p.K * p.V, p.K, p.V);
      a.head(h).rightCols(p.K) = Eigen::Map<ref::Mat<double>>(m.data() + h * p.K * p.K, p.K, p.K);
    }
    out.push_back(a);
  }
  return out;
}

std::vector<double> gathered(const std::vector<Summary<double>>& parts) {
  std::vector<double> all;
  for (const auto& a : parts) all.insert(all.end(), a.packed.begin(), a.packed.end());
  return all;
}

}  // namespace

TEST_CASE("merge algebra: compose is associative with identity (I, 0); a reset forgets the past") {
  const auto a = random_summary(2, 5, 3, 1), b = random_summary(2, 5, 3, 2), c = random_summary(2, 5, 3, 3);
  CHECK(rel(cp::compose(cp::compose(a, b), c).packed, cp::compose(a, cp::compose(b, c)).packed) < val::tol::kIdentityF64);
  const auto id = Summary<double>::identity(2, 5, 3);
  CHECK(cp::compose(id, a).packed == a.packed);
  CHECK(cp::compose(a, id).packed == a.packed);
  Summary<double> reset = b;
  for (int64_t h = 0; h < 2; ++h) reset.head(h).rightCols(5).setZero();
  CHECK(cp::summary_state(cp::compose(reset, a)).vec() == cp::summary_state(reset).vec());
  // fold_linear = the S part of the composition applied to zero
  const std::vector<double> all = gathered({a, b, c});
  CHECK(rel(cp::fold_linear(all.data(), 2, 5, 3, {0, 1, 2}).vec(),
            cp::summary_state(cp::compose(c, cp::compose(b, a))).vec()) < val::tol::kIdentityF64);
  CHECK(rel(cp::fold_linear(all.data(), 2, 5, 3, {2, 0}).vec(), cp::summary_state(cp::compose(a, c)).vec()) <
        val::tol::kIdentityF64);
}

TEST_CASE("merge algebra: pieces of a sequence fold back to the whole (forward and backward)") {
  auto be = val::backend_create("cpu-recurrent");
  for (Variant var : {Variant::gdn, Variant::kda, Variant::gla}) {
    val::CaseSpec whole;
    whole.variant = var, whole.H = 1, whole.HV = 2, whole.K = 6, whole.V = 4, whole.chunk_size = 4;
    whole.seqlens = {23}, whole.initial_state = true, whole.final_state = false, whole.seed = 7;
    val::CaseSpec pieces = whole;
    pieces.seqlens = {1, 9, 5, 1, 7};  // same tokens (the RNG is indexed by token), cut in five
    pieces.initial_state = false;
    SUBCASE(whole.name().c_str()) {
      const val::CaseData cw = val::make_case(whole), cpz = val::make_case(pieces);
      REQUIRE(cw.q.vec() == cpz.q.vec());
      const auto fw = transitions(*be, cw, false), fp = transitions(*be, cpz, false);
      const std::vector<double> all = gathered(fp);
      const std::vector<int> fwd = {0, 1, 2, 3, 4}, bwd = {4, 3, 2, 1, 0};
      Summary<double> chain = fp[0];
      for (size_t j = 1; j < fp.size(); ++j) chain = cp::compose(fp[j], chain);
      CHECK(rel(chain.packed, fw[0].packed) < val::tol::kExactF64);
      CHECK(rel(cp::fold_linear(all.data(), 2, 6, 4, fwd).vec(), cp::summary_state(fw[0]).vec()) < val::tol::kExactF64);
      // final state from h0 = M h0 + S_ext of the whole; the single-process forward agrees
      const Problem pw = cw.problem();
      auto out = val::make_outputs<double>(pw, true);
      be->forward(pw, cw.inputs(), out.views());
      Summary<double> h0(2, 6, 4);
      for (int64_t h = 0; h < 2; ++h)
        h0.head(h).leftCols(4) = Eigen::Map<const ref::Mat<double>>(cw.h0.data() + h * 24, 6, 4);
      CHECK(rel(cp::summary_state(cp::compose(chain, h0)).vec(), out.final_state.vec()) < val::tol::kExactF64);
      // backward: dh0 of the whole (dht = 0) = the transposed chain folded farthest piece first
      const auto bp = transitions(*be, cpz, true);
      auto gr = val::make_grads<double>(pw, cw.inputs());
      be->backward(pw, cw.inputs(), {cw.d_o.view(), {}}, gr.views());
      CHECK(rel(cp::fold_linear(gathered(bp).data(), 2, 6, 4, bwd).vec(), gr.dh0.vec()) < val::tol::kExactF64);
    }
  }
}
