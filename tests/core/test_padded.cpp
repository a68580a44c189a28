// The shape adapter (core/pad_plan.h, core/padded_backend.h) on the host queue, no GPU:
//   plan:     K 16 -> 32, 48 -> 64, 96 -> 128; V 16 -> 32, 40 -> 64, 72 -> 96; chunk 32 -> 64; K = 256 and
//             an unaccepted chunk size refused with reasons naming the limit; scale kept.
//   pad_view: the host queue's zero extension of a strided view.
//   backend:  cpu-chunkwise behind the CUDA rule (K in {32, 64, 128}, V a multiple of 32, chunk 64;
//             chunk 16 and 32 accepted) against the float64 oracle cpu-recurrent on the unpadded problem,
//             forward, backward and both transitions, gdn / kda / gla x K 16 / 48 / 96 x V 16 / 40 / 72
//             x lengths 1, 63, 65 and packed x h0 / final state x state_v_first x the fused flags,
//             outputs NaN-poisoned first, one case with strided q, v, o and dq. Bar: tol::kExactF64
//             (two exact float64 algorithms; padding adds exact zeros). A counting inner backend
//             checks that the padded problem (Kp, Vp, C = 64) is what ran.
// Seeds: KCP_SEED or 900 (printed per case through the subcase name).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>

#include "core/padded_backend.h"
#include "core/transition.h"
#include "reference/backend_cpu.h"
#include "validation/compare.h"
#include "validation/run_case.h"
#include "validation/tolerance.h"

using namespace kcp;

namespace {

PadRule cuda_like_rule() { return {"cuda-chunkwise", {32, 64, 128}, 32, 64, {16, 32}}; }

Problem problem(Variant var, int64_t K, int64_t V, int64_t C) {
  val::CaseSpec s;
  s.variant = var, s.K = K, s.V = V, s.chunk_size = C, s.T = 5;
  return val::make_case(s).problem(DType::f64);
}

// Records the problem of the last call that reached it.
class Spy final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  Problem last;
  void forward(const Problem& p, const Inputs& in, const Outputs& o) override { last = p, inner().forward(p, in, o); }
  void backward(const Problem& p, const Inputs& in, const Cotangents& d, const Grads& g) override {
    last = p, inner().backward(p, in, d, g);
  }
};

void poison(const TensorView& v) {
  if (v.empty()) return;
  Tensor<double> nan(v.shape, std::nan(""));
  host_queue().copy_view(v, nan.view());
}

void expect_close(const char* what, const std::string& name, const TensorView& got, const TensorView& want) {
  const val::Metrics m = val::compare(got, want);
  INFO(name, " ", what, ": rel_l2 ", m.rel_l2, ", max_abs ", m.max_abs, " at ", val::index_str(m.max_abs_at), ", NaN ",
       m.nan_a);
  CHECK(m.nan_a == 0);
  CHECK(m.rel_l2 <= val::tol::kExactF64);
}

std::vector<val::CaseSpec> sweep(uint64_t seed) {
  struct L { int64_t B, T; std::vector<int64_t> lens; int64_t K, V; };
  const std::vector<L> layouts = {{1, 1, {}, 16, 16}, {2, 63, {}, 48, 40}, {1, 65, {}, 16, 72},
                                  {1, 0, {65, 1, 0, 63}, 48, 16}, {1, 0, {40, 70}, 96, 40}};
  std::vector<val::CaseSpec> out;
  for (Variant var : {Variant::gdn, Variant::kda, Variant::gla})
    for (size_t li = 0; li < layouts.size(); ++li) {
      val::CaseSpec s;
      const L& l = layouts[li];
      s.variant = var, s.B = l.B, s.T = l.T, s.seqlens = l.lens, s.K = l.K, s.V = l.V, s.H = 1, s.HV = 2;
      s.chunk_size = li % 2 == 0 ? 32 : 64;
      Flags& f = s.flags;
      if (li == 1 || li == 3) {
        f.use_qk_l2norm_in_kernel = f.use_gate_in_kernel = true;
        if (var != Variant::gdn && li == 3) f.lower_bound = -4.0;
        if (var != Variant::gla) f.use_beta_sigmoid_in_kernel = true;
      }
      f.state_v_first = li == 2 || li == 3;
      s.initial_state = li != 4, s.final_state = li != 0;
      s.seed = seed + out.size();
      out.push_back(s);
    }
  return out;
}

// A copy of `t` living inside a wider tensor (last axis + 3): a strided view.
struct Strided {
  Tensor<double> wide;
  TensorView view;
};
Strided strided_copy(const TensorView& t) {
  Shape s = t.shape;
  s.back() += 3;
  Strided r{Tensor<double>(s, 7.0), {}};
  r.view = r.wide.view().narrow(t.rank() - 1, 0, t.shape.back());
  if (!t.empty()) host_queue().copy_view(r.view, t);
  return r;
}

}  // namespace

TEST_CASE("plan_padding maps K, V and the chunk size onto the instantiated ones and names every limit") {
  const PadRule r = cuda_like_rule();
  for (auto [K, Kp] : {std::pair<int64_t, int64_t>{16, 32}, {32, 32}, {48, 64}, {96, 128}, {128, 128}}) {
    const PadPlan pl = plan_padding(problem(Variant::kda, K, 32, 64), r);
    CHECK(pl.support);
    CHECK(pl.padded.K == Kp);
    CHECK(pl.padded.scale == doctest::Approx(1.0 / std::sqrt(double(K))));  // the caller's K
  }
  for (auto [V, Vp] : {std::pair<int64_t, int64_t>{16, 32}, {40, 64}, {64, 64}, {72, 96}})
    CHECK(plan_padding(problem(Variant::gdn, 64, V, 64), r).padded.V == Vp);
  const PadPlan c32 = plan_padding(problem(Variant::gdn, 64, 64, 32), r);
  CHECK(c32.support);
  CHECK(c32.padded.chunk_size == 64);
  CHECK(!c32.pads());
  CHECK(c32.changes());
  CHECK(c32.describe() == "chunk 32->64");
  CHECK(plan_padding(problem(Variant::gdn, 16, 40, 32), r).describe() == "pad K 16->32, V 40->64; chunk 32->64");
  CHECK(plan_padding(problem(Variant::gdn, 64, 64, 64), r).describe().empty());
  const PadPlan k256 = plan_padding(problem(Variant::gdn, 256, 64, 64), r);
  CHECK(!k256.support);
  CHECK(k256.support.reason.find("K <= 128") != std::string::npos);
  const PadPlan c48 = plan_padding(problem(Variant::gdn, 64, 64, 48), r);
  CHECK(!c48.support);
  CHECK(c48.support.reason.find("chunk_size 48") != std::string::npos);
  CHECK(c48.support.reason.find("16, 32 or 64") != std::string::npos);
}

TEST_CASE("pad_view zero-extends a strided view on the host queue") {
  Tensor<double> src({2, 3}), big({2, 5}, 9.0);
  for (int64_t i = 0; i < 6; ++i) src.data()[i] = double(i + 1);
  const TensorView col = big.view().narrow(1, 0, 3);  // strided source
  host_queue().copy_view(col, src.view());
  Tensor<double> dst({3, 4}, -1.0);
  host_queue().pad_view(dst.view(), col);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j) CHECK(dst(i, j) == (i < 2 && j < 3 ? src(i, j) : 0.0));
  CHECK_THROWS_WITH_AS(host_queue().pad_view(src.view(), dst.view()), doctest::Contains("does not fit"), Error);
}

TEST_CASE("the padded cpu-chunkwise equals the float64 oracle on unpadded shapes: forward, backward, transitions") {
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  auto spy_owned = std::make_unique<Spy>(ref::make_cpu_backend(ref::CpuAlgorithm::chunkwise));
  Spy& spy = *spy_owned;
  PaddedBackend padded(std::move(spy_owned), cuda_like_rule());
  for (const val::CaseSpec& s : sweep(val::seed_from_env(900))) {
    SUBCASE(s.name().c_str()) {
      const val::CaseData c = val::make_case(s);
      const Problem p = c.problem(DType::f64);
      REQUIRE(padded.supports(p));
      const auto want = val::run_case<double>(*oracle, c, true);
      auto out = val::make_outputs<double>(p, s.final_state);
      auto gr = val::make_grads<double>(p, c.inputs());
      for (Tensor<double>* t : {&out.o, &out.final_state, &gr.dq, &gr.dk, &gr.dv, &gr.dg, &gr.dbeta, &gr.dh0,
                                &gr.dA_log, &gr.ddt_bias})
        poison(t->view());
      padded.forward(p, c.inputs(), out.views());
      CHECK(spy.last.chunk_size == 64);
      CHECK(spy.last.K % 32 == 0);
      CHECK(spy.last.V % 32 == 0);
      padded.backward(p, c.inputs(), c.cotangents(), gr.views());
      const val::RunResult<double> got{out, gr};
      const auto w = val::named_tensors(want), g = val::named_tensors(got);
      REQUIRE(w.size() == g.size());
      for (size_t i = 0; i < w.size(); ++i) expect_close(w[i].first, s.name(), g[i].second->view(), w[i].second->view());
      for (bool bwd : {false, true}) {
        Tensor<double> ref(transition_shape(p.N, p.HV, p.K, p.V)), pk(transition_shape(p.N, p.HV, p.K, p.V));
        poison(pk.view());
        if (bwd) {
          oracle->transition_backward(p, c.inputs(), c.d_o.view(), 0, ref.view());
          padded.transition_backward(p, c.inputs(), c.d_o.view(), 0, pk.view());
        } else {
          oracle->transition_forward(p, c.inputs(), 0, ref.view());
          padded.transition_forward(p, c.inputs(), 0, pk.view());
        }
        expect_close(bwd ? "transition_backward" : "transition_forward", s.name(), pk.view(), ref.view());
        if (bwd) {  // dS_ext alone ([N,HV,K,V]), padded and unpadded likewise
          Tensor<double> ds(transition_s_shape(p.N, p.HV, p.K, p.V));
          poison(ds.view());
          padded.transition_backward(p, c.inputs(), c.d_o.view(), 0, ds.view());
          expect_close("transition_backward, dS_ext alone", s.name(), ds.view(), ref.view().narrow(3, 0, p.V));
        }
      }
    }
  }
}

TEST_CASE("the padded backend honours strided inputs and outputs") {
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  PaddedBackend padded(ref::make_cpu_backend(ref::CpuAlgorithm::chunkwise), cuda_like_rule());
  val::CaseSpec s;
  s.variant = Variant::kda, s.seqlens = {33, 70}, s.H = 1, s.HV = 2, s.K = 48, s.V = 40, s.chunk_size = 32;
  s.flags.use_gate_in_kernel = true, s.seed = val::seed_from_env(901);
  const val::CaseData c = val::make_case(s);
  const Problem p = c.problem(DType::f64);
  const auto want = val::run_case<double>(*oracle, c, true);
  Inputs in = c.inputs();
  const Strided q = strided_copy(in.q), v = strided_copy(in.v);
  in.q = q.view, in.v = v.view;
  Strided o = strided_copy(Tensor<double>(shape_v(p), std::nan("")).view());
  auto out = val::make_outputs<double>(p, true);
  padded.forward(p, in, {o.view, out.final_state.view()});
  expect_close("o (strided)", s.name(), o.view, want.out.o.view());
  expect_close("final_state", s.name(), out.final_state.view(), want.out.final_state.view());
  auto gr = val::make_grads<double>(p, c.inputs());
  Strided dq = strided_copy(Tensor<double>(shape_qk(p), std::nan("")).view());
  Grads g = gr.views();
  g.dq = dq.view;
  padded.backward(p, in, c.cotangents(), g);
  expect_close("dq (strided)", s.name(), dq.view, want.grads.dq.view());
  expect_close("dg", s.name(), gr.dg.view(), want.grads.dg.view());
  expect_close("ddt_bias", s.name(), gr.ddt_bias.view(), want.grads.ddt_bias.view());
  for (int64_t i = 0; i < o.wide.numel(); ++i)  // the columns beside the view are untouched
    if (i % o.wide.shape().back() >= p.V) CHECK(o.wide.data()[i] == 7.0);
}
