// The transition algebra of core/transition.h on the host queue (the reference of the CUDA queue's
// kernels), on the CPU oracle's own transitions, no MPI needed: compose is associative with identity
// (I, 0); a reset (transition_start: M = 0) forgets everything before it; the fold is the S part of
// the composition; a sequence cut into pieces (lengths 1, uneven, partial chunks) folds back to the
// whole sequence's transition, its final state from h0, and its dh0 through the transposed chain.
// Also the host queue's view operations (copy with strides and dtypes, add, zero).
#include <doctest/doctest.h>

#include "core/queue.h"
#include "core/rng.h"
#include "core/transition.h"
#include "validation/cases.h"
#include "validation/compare.h"
#include "validation/registry.h"
#include "validation/tolerance.h"

using namespace kcp;

namespace {

Queue& q = host_queue();

Tensor<double> random_elements(int64_t n, int64_t HV, int64_t K, int64_t V, uint64_t seed) {
  Tensor<double> a(transition_shape(n, HV, K, V));
  for (int64_t i = 0; i < a.numel(); ++i) a.data()[i] = CounterRng{seed, 9}.normal(uint64_t(i)) * 0.5;
  return a;
}

double rel(const TensorView& a, const TensorView& b) { return val::compare(a, b).rel_l2; }
TensorView el(const Tensor<double>& t, int64_t i) { return transition_element(t.view(), i); }

// later o earlier, as a new element [HV, K, V+K]
Tensor<double> compose(const TensorView& later, const TensorView& earlier) {
  Tensor<double> out(later.shape);
  q.transition_compose(later, earlier, out.view());
  return out;
}

Tensor<double> fold(const Tensor<double>& elems, int64_t first, int64_t count, bool reverse, const TensorView& x0 = {}) {
  Tensor<double> out({elems.dim(1), elems.dim(2), elems.dim(3) - elems.dim(2)});
  q.transition_fold(elems.view(), first, count, reverse, x0, out.view());
  return out;
}

// Transitions of every sequence of a packed case in one call: forward (S_ext | M) or backward (dS_ext | M^T).
Tensor<double> transitions(Backend& be, const val::CaseData& c, bool backward) {
  const Problem p = c.problem();
  Tensor<double> packed(transition_shape(p.N, p.HV, p.K, p.V));
  if (backward) be.transition_backward(p, c.inputs(), c.d_o.view(), 0, packed.view());
  else be.transition_forward(p, c.inputs(), 0, packed.view());
  return packed;
}

}  // namespace

TEST_CASE("transition algebra: compose is associative with identity (I, 0); a reset forgets the past") {
  const Tensor<double> e = random_elements(3, 2, 5, 3, 1);
  const TensorView a = el(e, 0), b = el(e, 1), c = el(e, 2);
  const Tensor<double> ab = compose(a, b), bc = compose(b, c);
  CHECK(rel(compose(ab.view(), c).view(), compose(a, bc.view()).view()) < val::tol::kIdentityF64);
  Tensor<double> id(transition_shape(1, 2, 5, 3));
  q.transition_identity(el(id, 0));
  CHECK(compose(el(id, 0), a).vec() == to_tensor<double>(a).vec());
  CHECK(compose(a, el(id, 0)).vec() == to_tensor<double>(a).vec());
  Tensor<double> reset = to_tensor<double>(b);  // [HV, K, V+K]
  q.transition_start(reset.view(), {});
  const Tensor<double> ra = compose(reset.view(), a);
  CHECK(rel(transition_s(ra.view()), transition_s(reset.view())) == 0.0);
  // the fold is the S part of the composition applied to zero, in either order
  CHECK(rel(fold(e, 0, 3, false).view(), transition_s(compose(c, compose(b, a).view()).view())) < val::tol::kIdentityF64);
  CHECK(rel(fold(e, 1, 2, true).view(), transition_s(compose(b, c).view())) < val::tol::kIdentityF64);
  // start from x0: S = M x0 + S, M = 0; equals folding one element from x0
  const Tensor<double> x0 = to_tensor<double>(transition_s(el(random_elements(1, 2, 5, 3, 4), 0)));
  Tensor<double> started = to_tensor<double>(a);
  q.transition_start(started.view(), x0.view());
  CHECK(rel(transition_s(started.view()), fold(e, 0, 1, false, x0.view()).view()) < val::tol::kIdentityF64);
  CHECK(to_tensor<double>(transition_m(started.view())).vec() == std::vector<double>(50, 0.0));
}

TEST_CASE("transition algebra: pieces of a sequence fold back to the whole (forward and backward)") {
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
      const Tensor<double> fw = transitions(*be, cw, false), fp = transitions(*be, cpz, false);
      Tensor<double> chain = to_tensor<double>(el(fp, 0));
      for (int64_t j = 1; j < 5; ++j) chain = compose(el(fp, j), chain.view());
      CHECK(rel(chain.view(), el(fw, 0)) < val::tol::kExactF64);
      CHECK(rel(fold(fp, 0, 5, false).view(), transition_s(el(fw, 0))) < val::tol::kExactF64);
      // final state from h0 = M h0 + S_ext of the whole; the single-process forward agrees
      const Problem pw = cw.problem();
      auto out = val::make_outputs<double>(pw, true);
      be->forward(pw, cw.inputs(), out.views());
      const TensorView h0 = state_entry_kmajor(cw.h0.view(), 0, false);
      CHECK(rel(fold(fp, 0, 5, false, h0).view(), state_entry_kmajor(out.final_state.view(), 0, false)) <
            val::tol::kExactF64);
      // backward: dh0 of the whole (dht = 0) = the transposed chain folded farthest piece first
      const Tensor<double> bp = transitions(*be, cpz, true);
      auto gr = val::make_grads<double>(pw, cw.inputs());
      be->backward(pw, cw.inputs(), {cw.d_o.view(), {}}, gr.views());
      CHECK(rel(fold(bp, 0, 5, true).view(), state_entry_kmajor(gr.dh0.view(), 0, false)) < val::tol::kExactF64);
    }
  }
}

TEST_CASE("host queue view operations: strided copies across dtypes, add, zero") {
  Tensor<double> a({2, 3, 4});
  for (int64_t i = 0; i < a.numel(); ++i) a.data()[i] = double(i) * 0.25 - 1;
  Tensor<float> b({4, 3, 2});  // a transposed (last and first axes swapped) as float32
  TensorView bt = b.view();
  bt.shape = {2, 3, 4}, bt.stride = {1, 2, 6};
  q.copy_view(bt, a.view());
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 4; ++k) CHECK(double(b(k, j, i)) == a(i, j, k));
  q.add_view(a.view(), bt);
  CHECK(a(1, 2, 3) == 2 * (23 * 0.25 - 1));
  q.fill_zero(a.view().narrow(1, 1, 1));
  CHECK(a(0, 1, 2) == 0.0);
  CHECK(a(0, 2, 2) != 0.0);
}
