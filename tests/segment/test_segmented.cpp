// The segmented forward (intra-card CP, segment/segmented.h) on the host backends, with the segment
// length forced to C or 2C so that short sequences are cut too: over a seeded sweep of gdn, kda and
// gla x packed sequences of mixed lengths (0, 1, C-1, C, C+1, 2C, odd long) and dense batches x GVA
// x with and without h0 and final state x state_v_first x fused flags x C in {16, 32, 64}:
//   float64: cpu-chunkwise and cpu-recurrent cut equal the unsplit oracle (cpu-recurrent) and the
//            unsplit cpu-chunkwise within tol::kExactF64, o and final state;
//   float32: cut cpu-chunkwise and cpu-recurrent within the float32 rule of the oracle
//            (val::float_rule_bar of the unsplit float32 recurrence's error) and within
//            tol::kSegmentedVsUnsplitFactor x the same backend's unsplit float32 error + floor.
// The backward through the same cuts (segmented_backward), every gradient, likewise (float64 against
// the oracle, float32 within the float32 rule and twice the unsplit error).
// Also: the queue's scan against folds, an unsplit plan (automatic on the host, or a dense batch
// whose batch and time cannot be merged) leaves the backend's bits alone, a plan for another problem
// is refused, the registry wraps host backends when asked and explains the plan.
// Each case is a SUBCASE named by CaseSpec::name() (with its seed) plus the forced length.
#include <doctest/doctest.h>

#include <cstdio>

#include "core/rng.h"
#include "core/transition.h"
#include "reference/backend_cpu.h"
#include "segment/segmented_backend.h"
#include "validation/compare.h"
#include "validation/float_rule.h"
#include "validation/registry.h"
#include "validation/run_case.h"
#include "validation/tolerance.h"

using namespace kcp;

namespace {

struct SegCase {
  val::CaseSpec spec;
  int64_t segment = 0;  // forced length in tokens
  std::string name() const { return spec.name() + " segment=" + std::to_string(segment); }
};

std::vector<SegCase> sweep(uint64_t seed) {
  std::vector<SegCase> out;
  int id = 0;
  for (Variant var : {Variant::gdn, Variant::kda, Variant::gla})
    for (int64_t C : {16, 32, 64})
      for (int layout = 0; layout < 3; ++layout)
        for (int flags = 0; flags < 3; ++flags, ++id) {
          const CounterRng rng{seed, 2000 + uint64_t(id)};
          SegCase sc;
          val::CaseSpec& s = sc.spec;
          s.variant = var, s.chunk_size = C;
          const int64_t odd = 3 * C + 2 * int64_t(rng.bits(0) % uint64_t(C)) + 1;
          if (layout == 0) s.seqlens = {1, C, C + 1, 0, odd, 2 * C, C - 1}, s.H = 1, s.HV = 2;  // GVA
          if (layout == 1) s.seqlens = {odd, 1, 2 * C + 1}, s.H = 2, s.HV = 2;
          if (layout == 2) s.B = 2, s.T = odd, s.H = 1, s.HV = 3;  // dense batch, GVA
          s.K = 8 + int64_t(rng.bits(1) % 9), s.V = 8 + int64_t(rng.bits(2) % 9);
          Flags& f = s.flags;
          if (flags == 1) {  // the fused pre-processing
            f.use_qk_l2norm_in_kernel = true, f.use_gate_in_kernel = true;
            if (var != Variant::gla) f.use_beta_sigmoid_in_kernel = true;
          }
          if (flags == 2) {  // states [V,K]; the lower-bound gate, or gdn's negative eigenvalues
            f.state_v_first = true;
            if (var == Variant::gdn) f.use_beta_sigmoid_in_kernel = f.allow_neg_eigval = true;
            else f.use_gate_in_kernel = true, f.lower_bound = -3.0, s.A_log = rng.bits(3) % 2 == 0;
          }
          s.initial_state = id % 4 != 1;
          s.final_state = id % 4 != 2;
          s.seed = seed + uint64_t(id);
          sc.segment = (id % 2 == 0 ? 1 : 2) * C;
          out.push_back(sc);
        }
  return out;
}

std::unique_ptr<Backend> cut(ref::CpuAlgorithm a, int64_t tokens) {
  seg::SegmentOptions o;
  o.mode = seg::SegmentMode::forced, o.forced_tokens = tokens;
  return seg::make_segmented_backend(ref::make_cpu_backend(a), o);
}

// rel_l2 of o and final state (when present) of a run against a reference run.
template <class A, class B>
std::vector<std::pair<const char*, double>> errors(const val::RunResult<A>& a, const val::RunResult<B>& b) {
  std::vector<std::pair<const char*, double>> e = {{"o", val::compare(a.out.o.view(), b.out.o.view()).rel_l2}};
  if (!b.out.final_state.empty())
    e.push_back({"final_state", val::compare(a.out.final_state.view(), b.out.final_state.view()).rel_l2});
  return e;
}

struct Worst {
  double f64 = 0, f32_rule = 0, f32_unsplit = 0, bwd = 0;
  std::string f64_at, rule_at, unsplit_at, bwd_at;
  ~Worst() {
    if (!bwd_at.empty()) std::printf("segmented backward f64: worst rel_l2 %.3g (bar %.0e) at %s\n", bwd, val::tol::kExactF64, bwd_at.c_str());
    if (!f64_at.empty()) std::printf("segmented f64: worst rel_l2 %.3g (bar %.0e) at %s\n", f64, val::tol::kExactF64, f64_at.c_str());
    if (!rule_at.empty())
      std::printf("segmented f32: worst fraction of the float32 rule %.3g at %s; of %gx unsplit %.3g at %s\n", f32_rule,
                  rule_at.c_str(), val::tol::kSegmentedVsUnsplitFactor, f32_unsplit, unsplit_at.c_str());
  }
} worst;

}  // namespace

TEST_CASE("segmented forward, float64: cut equals unsplit and the oracle on host backends") {
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  auto chunkwise = ref::make_cpu_backend(ref::CpuAlgorithm::chunkwise);
  for (const SegCase& sc : sweep(val::seed_from_env(1200))) {
    SUBCASE(sc.name().c_str()) {
      const val::CaseData c = val::make_case(sc.spec);
      const auto ref = val::run_case<double>(*oracle, c, false);
      const auto whole = val::run_case<double>(*chunkwise, c, false);
      auto cut_cw = cut(ref::CpuAlgorithm::chunkwise, sc.segment), cut_rec = cut(ref::CpuAlgorithm::recurrent, sc.segment);
      REQUIRE(dynamic_cast<seg::SegmentedBackend&>(*cut_cw).plan(c.problem()).split);
      const auto cw = val::run_case<double>(*cut_cw, c, false), rec = val::run_case<double>(*cut_rec, c, false);
      for (auto [what, a, b] : {std::tuple{"cut chunkwise vs oracle", &cw, &ref}, std::tuple{"cut chunkwise vs unsplit", &cw, &whole},
                                std::tuple{"cut recurrent vs oracle", &rec, &ref}})
        for (auto [tensor, e] : errors(*a, *b)) {
          INFO(what, " ", tensor, ": rel_l2 ", e);
          CHECK(e <= val::tol::kExactF64);
          if (e >= worst.f64) worst.f64 = e, worst.f64_at = sc.name() + " " + what + " " + tensor;
        }
    }
  }
}

TEST_CASE("segmented forward, float32: within the float32 rule and twice the unsplit error") {
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  for (const SegCase& sc : sweep(val::seed_from_env(1200))) {
    SUBCASE(sc.name().c_str()) {
      const val::CaseData c = val::make_case(sc.spec);
      const auto ref = val::run_case<double>(*oracle, c, false);
      const auto base = errors(val::run_case<float>(*oracle, c, false), ref);  // the float32 recurrence
      for (ref::CpuAlgorithm a : {ref::CpuAlgorithm::chunkwise, ref::CpuAlgorithm::recurrent}) {
        auto plain = ref::make_cpu_backend(a);
        auto segmented = cut(a, sc.segment);
        const auto unsplit = errors(val::run_case<float>(*plain, c, false), ref);
        const auto got = errors(val::run_case<float>(*segmented, c, false), ref);
        for (size_t t = 0; t < got.size(); ++t) {
          const double rule = val::float_rule_bar(base[t].second);
          const double twice = val::tol::kSegmentedVsUnsplitFactor * unsplit[t].second + val::tol::kFloatRuleFloor;
          INFO(plain->name(), " ", got[t].first, ": cut ", got[t].second, ", unsplit ", unsplit[t].second,
               ", recurrence f32 ", base[t].second, "; bars ", rule, " and ", twice);
          CHECK(got[t].second <= rule);
          CHECK(got[t].second <= twice);
          const std::string at = sc.name() + " " + std::string(plain->name()) + " " + got[t].first;
          if (got[t].second / rule >= worst.f32_rule) worst.f32_rule = got[t].second / rule, worst.rule_at = at;
          if (got[t].second / twice >= worst.f32_unsplit) worst.f32_unsplit = got[t].second / twice, worst.unsplit_at = at;
        }
      }
    }
  }
}

// The backward through the same forced cut (segmented_backward: transitions forward and backward,
// two scans, one backward over the segments): every output and gradient of the cut run against the
// unsplit oracle (float64: tol::kExactF64) and, in float32, within the float32 rule of the oracle and
// tol::kSegmentedVsUnsplitFactor x the same backend's unsplit error + floor.
TEST_CASE("segmented backward, float64: cut gradients equal the unsplit oracle's on host backends") {
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  for (const SegCase& sc : sweep(val::seed_from_env(1204))) {
    SUBCASE(sc.name().c_str()) {
      const val::CaseData c = val::make_case(sc.spec);
      const auto ref = val::run_case<double>(*oracle, c, true);
      for (ref::CpuAlgorithm a : {ref::CpuAlgorithm::chunkwise, ref::CpuAlgorithm::recurrent}) {
        auto segmented = cut(a, sc.segment);
        REQUIRE(dynamic_cast<seg::SegmentedBackend&>(*segmented).plan(c.problem()).split);
        const auto got = val::run_case<double>(*segmented, c, true);
        const auto w = val::named_tensors(ref), g = val::named_tensors(got);
        REQUIRE(w.size() == g.size());
        for (size_t i = 0; i < w.size(); ++i) {
          const double e = val::compare(g[i].second->view(), w[i].second->view()).rel_l2;
          INFO(segmented->name(), " cut ", w[i].first, ": rel_l2 ", e);
          CHECK(e <= val::tol::kExactF64);
          if (e >= worst.bwd) worst.bwd = e, worst.bwd_at = sc.name() + " " + std::string(w[i].first);
        }
      }
    }
  }
}

TEST_CASE("segmented backward, float32: within the float32 rule and twice the unsplit error") {
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  for (const SegCase& sc : sweep(val::seed_from_env(1204))) {
    SUBCASE(sc.name().c_str()) {
      const val::CaseData c = val::make_case(sc.spec);
      const auto ref = val::run_case<double>(*oracle, c, true);
      const auto rec32 = val::run_case<float>(*oracle, c, true);
      auto plain = ref::make_cpu_backend(ref::CpuAlgorithm::chunkwise);
      auto segmented = cut(ref::CpuAlgorithm::chunkwise, sc.segment);
      const auto unsplit = val::run_case<float>(*plain, c, true), got = val::run_case<float>(*segmented, c, true);
      const auto w = val::named_tensors(ref);
      const auto b = val::named_tensors(rec32), u = val::named_tensors(unsplit), g = val::named_tensors(got);
      REQUIRE((w.size() == g.size() && b.size() == g.size() && u.size() == g.size()));
      for (size_t i = 0; i < w.size(); ++i) {
        const double e = val::compare(g[i].second->view(), w[i].second->view()).rel_l2;
        const double rule = val::float_rule_bar(val::compare(b[i].second->view(), w[i].second->view()).rel_l2);
        const double twice = val::tol::kSegmentedVsUnsplitFactor * val::compare(u[i].second->view(), w[i].second->view()).rel_l2 +
                             val::tol::kFloatRuleFloor;
        INFO("cut cpu-chunkwise ", w[i].first, ": rel_l2 ", e, "; bars ", rule, " and ", twice);
        CHECK(e <= rule);
        CHECK(e <= twice);
      }
    }
  }
}

TEST_CASE("the queue's scan: per range, the state after each element, as a chain of folds") {
  const int64_t E = 6, HV = 2, K = 5, V = 3;
  Tensor<double> elems(transition_shape(E, HV, K, V));
  const CounterRng rng{val::seed_from_env(1201), 1};
  for (int64_t i = 0; i < elems.numel(); ++i) elems.data()[i] = 0.5 * rng.normal(uint64_t(i));
  Tensor<double> out({E, HV, K, V}, -7.0);
  host_queue().transition_scan(elems.view(), {{0, 2}, {3, 3}}, out.view());
  for (auto [first, count] : {std::pair<int64_t, int64_t>{0, 2}, {3, 3}})
    for (int64_t j = first; j < first + count; ++j) {
      Tensor<double> want({HV, K, V});
      host_queue().transition_fold(elems.view(), first, j - first + 1, false, {}, want.view());
      CHECK(val::compare(transition_element(out.view(), j), want.view()).max_abs <= val::tol::kElementF64);
    }
  CHECK(out(2, 1, 4, 2) == -7.0);  // element 2 is in no range: left alone
  CHECK_THROWS_AS(host_queue().transition_scan(elems.view(), {{4, 3}}, out.view()), Error);
}

TEST_CASE("an unsplit plan runs the wrapped backend as it is; a plan for another problem is refused") {
  val::CaseSpec s;
  s.variant = Variant::kda, s.seqlens = {100, 37}, s.K = 8, s.V = 8, s.chunk_size = 16, s.seed = val::seed_from_env(1202);
  const val::CaseData c = val::make_case(s);
  auto plain = ref::make_cpu_backend(ref::CpuAlgorithm::chunkwise);
  auto automatic = seg::make_segmented_backend(ref::make_cpu_backend(ref::CpuAlgorithm::chunkwise), {});
  CHECK(automatic->explain_forward(c.problem()).find("unsplit") == 0);  // the host queue has one unit
  const auto a = val::run_case<double>(*plain, c, false), b = val::run_case<double>(*automatic, c, false);
  CHECK(a.out.o.vec() == b.out.o.vec());
  CHECK(a.out.final_state.vec() == b.out.final_state.vec());
  seg::SegmentOptions o;
  o.mode = seg::SegmentMode::forced, o.forced_tokens = 16;
  val::CaseSpec other = s;
  other.seqlens = {50, 87};
  const seg::SegmentPlan wrong = seg::plan_segments(val::make_case(other).problem(), 1, o);
  val::OutputSet<double> out = val::make_outputs<double>(c.problem(), true);
  seg::SegmentWorkspace ws;
  CHECK_THROWS_WITH_AS(seg::segmented_forward(*plain, c.problem(), c.inputs(), out.views(), wrong, ws),
                       doctest::Contains("another problem"), Error);
}

TEST_CASE("the registry wraps a host backend in the segmented forward when asked, and explains the plan") {
  val::BackendOptions opt;
  opt.segment = seg::parse_segment_option("32");
  auto be = val::backend_create("cpu-chunkwise", opt);
  CHECK(be->name() == "cpu-chunkwise");
  val::CaseSpec s;
  s.seqlens = {100, 20}, s.K = 8, s.V = 8, s.chunk_size = 16;
  const std::string plan = be->explain_forward(val::make_case(s).problem());
  INFO(plan);
  CHECK(plan.find("split: 1 sequences") == 0);
  CHECK(plan.find("forced 32 tokens") != std::string::npos);
  CHECK(val::backend_create("cpu-chunkwise")->explain_forward(val::make_case(s).problem()).empty());
}

TEST_CASE("a dense batch whose batch and time cannot be merged runs unsplit, with the same bits") {
  val::CaseSpec s;
  s.variant = Variant::gdn, s.B = 2, s.T = 70, s.K = 8, s.V = 8, s.chunk_size = 16, s.seed = val::seed_from_env(1203);
  const val::CaseData c = val::make_case(s);
  // q stored [T, B, H, K] and seen as [B, T, H, K]: stride[0] = H*K, not T * stride[1]
  const int64_t B = s.B, T = s.T, H = s.H, K = s.K;
  Tensor<double> qt({T, B, H, K});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < K; ++i) qt(t, b, h, i) = c.q(b, t, h, i);
  Inputs in = c.inputs();
  in.q = qt.view();
  in.q.shape = {B, T, H, K}, in.q.stride = {H * K, B * H * K, K, 1};
  auto plain = ref::make_cpu_backend(ref::CpuAlgorithm::chunkwise);
  auto segmented = cut(ref::CpuAlgorithm::chunkwise, 16);
  const Problem p = c.problem();
  val::OutputSet<double> a = val::make_outputs<double>(p, true), b = val::make_outputs<double>(p, true);
  plain->forward(p, in, a.views());
  segmented->forward(p, in, b.views());
  CHECK(a.o.vec() == b.o.vec());
  CHECK(a.final_state.vec() == b.final_state.vec());
}
