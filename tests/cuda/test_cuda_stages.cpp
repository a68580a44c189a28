// Each CUDA stage against its CPU chunkwise twin (reference/chunkwise.h, float64) on the same
// inputs: before a stage runs, the buffers it reads are overwritten with the twin's values, so a
// failure names one kernel: cumsum (gcum, beta, rstd; kda and gla: rstd, their gcum and beta come
// from kkt), kkt + solve (P, Aqk; gdn with 16-bit inputs also w as kkt writes it for the kept forward,
// equal bit for bit to WY's from the same P), WY (w, u, kg, qg),
// state (h, vnew, final state), output (o). For gdn with 16-bit inputs the forward's state kernel
// is the folded one (chunk_state_fold.cu: reads P, k, v instead of w, u, and fuses the output): it
// runs in every block layout (1 or 2 column groups of one warpgroup, 2 x 2) and its fused o is checked too; WY is still checked (it
// serves the other cases and the CP transition). Every buffer a stage writes is NaN-poisoned first and
// must come back without NaN (every element written). Bars (validation/tolerance.h): float32
// inputs kFloatVsDouble (3xTF32 products); 16-bit inputs kCudaTf32; the cumsum is float32 for every
// input type: kFloatVsDouble. gla runs kda's kernels without the delta rule (kDelta = false): kkt
// writes Aqk, kg and qg (checked after kkt), WY does not run, P, w, u are not allocated (so not
// compared), and its state stage (chunk_state_gla.cu: the chain split over key rows, writing h, then
// the output from h) forms no vnew (= v, not compared). gla's plain forward stores h TF32-rounded for
// its output, the kept forward float32 (last case). Skipped where no CUDA device is present.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdio>

#include "cuda/backend_cuda.h"
#include "cuda/chunkwise.h"
#include "tests/cuda/cuda_support.h"
#include "tests/cuda/stage_twin.h"
#include "validation/compare.h"
#include "validation/tolerance.h"

using namespace kcp;

namespace {

struct StageCase {
  val::CaseSpec spec;
  DType qkv;
  DType gates = DType::f32;  // g's dtype (kda and gla read it in kkt's gate scan, in its dtype)
  std::string name() const {
    return spec.name() + " qkv=" + std::string(dtype_name(qkv)) + (gates == DType::f32 ? "" : " g=" + std::string(dtype_name(gates)));
  }
};

std::vector<StageCase> stage_cases(uint64_t seed) {
  std::vector<StageCase> v;
  auto add = [&](Variant var, DType dt, auto&& setup, DType gates = DType::f32) {
    val::CaseSpec s;
    s.variant = var;
    setup(s);
    s.seed = seed + v.size();
    v.push_back({s, dt, gates});
  };
  add(Variant::gdn, DType::bf16, [](val::CaseSpec& s) {  // packed, GVA, empty and 1-token sequences
    s.seqlens = {64, 37, 0, 90, 1, 60}, s.H = 1, s.HV = 3, s.K = 64, s.V = 64;
    s.flags.use_qk_l2norm_in_kernel = s.flags.use_beta_sigmoid_in_kernel = true;
  });
  add(Variant::kda, DType::bf16, [](val::CaseSpec& s) {  // strong fused gates: pairwise diagonal blocks
    s.seqlens = {64, 37, 0, 90, 1, 60}, s.H = 1, s.HV = 3, s.K = 64, s.V = 64;
    s.flags.use_gate_in_kernel = s.flags.use_qk_l2norm_in_kernel = true;
  });
  add(Variant::gdn, DType::f32, [](val::CaseSpec& s) {
    s.B = 2, s.T = 130, s.K = s.V = 128, s.flags.use_gate_in_kernel = true;
  });
  add(Variant::kda, DType::f32, [](val::CaseSpec& s) {
    s.T = 200, s.H = 2, s.HV = 4, s.K = 128, s.V = 96, s.flags.use_gate_in_kernel = true, s.flags.lower_bound = -5.0;
  });
  add(Variant::kda, DType::f16, [](val::CaseSpec& s) { s.T = 100, s.K = s.V = 32; });
  add(Variant::gdn, DType::f16, [](val::CaseSpec& s) { s.T = 65, s.K = 32, s.V = 64, s.initial_state = false; });
  add(Variant::gdn, DType::bf16, [](val::CaseSpec& s) {  // the production shape: K = V = 128, packed, GVA
    s.seqlens = {200, 64, 1, 129}, s.H = 1, s.HV = 2, s.K = s.V = 128, s.flags.use_qk_l2norm_in_kernel = true;
  });
  add(Variant::kda, DType::bf16, [](val::CaseSpec& s) { s.T = 333, s.K = s.V = 128, s.flags.use_beta_sigmoid_in_kernel = true; });
  add(Variant::gla, DType::bf16, [](val::CaseSpec& s) {  // packed, GVA, fused gate and norm
    s.seqlens = {64, 37, 0, 90, 1, 60}, s.H = 1, s.HV = 3, s.K = 64, s.V = 64;
    s.flags.use_gate_in_kernel = s.flags.use_qk_l2norm_in_kernel = true;
  });
  add(Variant::gla, DType::f32, [](val::CaseSpec& s) { s.B = 2, s.T = 130, s.K = s.V = 128; });
  add(Variant::gla, DType::f16, [](val::CaseSpec& s) { s.T = 100, s.K = s.V = 32; });
  // The gates in other dtypes than float32 (kkt's gate scan loads each one in its own: FLA's gla and
  // kda layers pass 16-bit gates), packed with empty and 1-token sequences; one with the gate formula.
  auto packed128 = [](val::CaseSpec& s) { s.seqlens = {64, 37, 0, 90, 1, 60}, s.H = 1, s.HV = 2, s.K = s.V = 128; };
  add(Variant::kda, DType::bf16, packed128, DType::bf16);
  add(Variant::gla, DType::bf16, packed128, DType::bf16);
  add(Variant::kda, DType::f16, [](val::CaseSpec& s) {
    s.T = 130, s.K = 64, s.V = 32, s.flags.use_gate_in_kernel = true, s.flags.lower_bound = -5.0;
  }, DType::f16);
  add(Variant::gla, DType::f32, [](val::CaseSpec& s) { s.T = 100, s.K = s.V = 64; }, DType::f64);
  return v;
}

// The device buffer against the twin where the twin is defined; no NaN anywhere in the buffer.
void check_stage(const char* what, Backend& gpu, const TensorView& dev, const Tensor<double>& twin, double bar) {
  const Tensor<double> got = test::to_host(gpu, dev);
  REQUIRE(got.numel() == twin.numel());
  int64_t nan = 0;
  std::vector<double> a, b;
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (std::isnan(got.data()[i])) ++nan;
    if (!std::isnan(twin.data()[i])) a.push_back(got.data()[i]), b.push_back(twin.data()[i]);
  }
  Tensor<double> ta({int64_t(a.size())}), tb({int64_t(b.size())});
  ta.vec() = a, tb.vec() = b;
  const val::Metrics m = val::compare(ta.view(), tb.view());
  std::printf("  %-12s rel_l2 %.3e max_abs %.3e (bar %.1e) over %zu values, %lld NaN\n", what, m.rel_l2, m.max_abs, bar,
              a.size(), static_cast<long long>(nan));
  INFO(what, ": rel_l2 ", m.rel_l2, " max_abs ", m.max_abs, " (", m.a_at, " vs ", m.b_at, "), unwritten ", nan);
  CHECK(nan == 0);
  CHECK(m.rel_l2 <= bar);
}

// The twin's values into a stage buffer (undefined padding as 0).
void feed(Backend& gpu, const TensorView& dst, Tensor<double> twin) {
  for (double& x : twin.vec()) x = std::isnan(x) ? 0.0 : x;
  test::upload_into(gpu, dst, twin);
}

}  // namespace

TEST_CASE("each CUDA stage matches its CPU chunkwise twin on the same inputs" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  cuda::Pipeline pipe(gpu->queue());
  for (const StageCase& sc : stage_cases(val::seed_from_env(800))) {
    SUBCASE(sc.name().c_str()) {
      std::printf("%s\n", sc.name().c_str());
      const val::CaseData c = test::round_case(val::make_case(sc.spec), sc.qkv, sc.gates);
      const Problem p64 = c.problem(DType::f64), p = c.problem(DType::f32);
      const test::StageTwin tw = test::make_stage_twin(p64, c.inputs());
      test::DeviceInputs din = test::upload_inputs(*gpu, c, sc.qkv, sc.gates);
      const cuda::StageBuffers& b = pipe.prepare_stages(p, din.views);
      const bool l2 = p.flags.use_qk_l2norm_in_kernel, kda = p.per_channel_gate();  // kda and gla: kg, qg
      const bool delta = p.variant != Variant::gla;  // gla: no P, w, u buffers
      const double bar = sc.qkv == DType::f32 ? val::tol::kFloatVsDouble : val::tol::kCudaTf32;

      for (const TensorView* t : {&b.gcum, &b.beta, &b.rstd_q, &b.rstd_k}) if (!t->empty()) test::poison(*gpu, *t);
      // kda, gla: the gate tile and beta_e are formed by kkt (chunk_gates.cuh), so they are checked
      // after it (still poisoned until then: never fed here).
      pipe.run_stage(cuda::Stage::cumsum, p, din.views, {});
      if (!kda) check_stage("cumsum gcum", *gpu, b.gcum, tw.gcum, val::tol::kFloatVsDouble);
      if (!kda) check_stage("cumsum beta", *gpu, b.beta, tw.beta, val::tol::kFloatVsDouble);
      if (l2) check_stage("cumsum rstd", *gpu, b.rstd_k, tw.rstd_k, val::tol::kFloatVsDouble);

      if (!kda) feed(*gpu, b.gcum, tw.gcum), feed(*gpu, b.beta, tw.beta);
      if (l2) feed(*gpu, b.rstd_q, tw.rstd_q), feed(*gpu, b.rstd_k, tw.rstd_k);
      CHECK(b.P.empty() == !delta);  // gla: no P, w, u allocated
      CHECK(b.w.empty() == !delta);
      CHECK(b.u.empty() == !delta);
      if (delta) test::poison(*gpu, b.P);
      else test::poison(*gpu, b.kg), test::poison(*gpu, b.qg);  // gla: the kkt stage writes kg, qg
      test::poison(*gpu, b.Aqk);
      pipe.run_stage(cuda::Stage::kkt, p, din.views, {});
      if (delta) check_stage("kkt P", *gpu, b.P, tw.P, bar);
      else check_stage("kkt kg", *gpu, b.kg, tw.kg, bar), check_stage("kkt qg", *gpu, b.qg, tw.qg, bar);
      check_stage("kkt Aqk", *gpu, b.Aqk, tw.Aqk, bar);
      if (kda) check_stage("kkt gcum", *gpu, b.gcum, tw.gcum, val::tol::kFloatVsDouble);
      if (kda) check_stage("kkt beta", *gpu, b.beta, tw.beta, val::tol::kFloatVsDouble);
      if (!kda && sc.qkv != DType::f32) {  // gdn, 16-bit: kkt writes w where no u is wanted (Stage::kkt_w),
        test::poison(*gpu, b.w);             // bit for bit the WY stage's w from the P it wrote
        pipe.run_stage(cuda::Stage::kkt_w, p, din.views, {});
        check_stage("kkt w", *gpu, b.w, tw.w, bar);
        const Tensor<double> w_kkt = test::to_host(*gpu, b.w);
        test::poison(*gpu, b.w);
        pipe.run_stage(cuda::Stage::wy, p, din.views, {});
        const Tensor<double> w_wy = test::to_host(*gpu, b.w);
        int64_t differ = 0;
        for (int64_t i = 0; i < w_wy.numel(); ++i) differ += w_kkt.data()[i] != w_wy.data()[i];
        INFO("w elements where kkt's differs from WY's: ", differ, " of ", w_wy.numel());
        CHECK(differ == 0);
      }

      if (delta) {  // gla: no WY stage
        feed(*gpu, b.P, tw.P);
        for (const TensorView* t : {&b.w, &b.u, &b.kg, &b.qg}) if (!t->empty()) test::poison(*gpu, *t);
        pipe.run_stage(cuda::Stage::wy, p, din.views, {});
        check_stage("wy w", *gpu, b.w, tw.w, bar), check_stage("wy u", *gpu, b.u, tw.u, bar);
        if (kda) check_stage("wy kg", *gpu, b.kg, tw.kg, bar), check_stage("wy qg", *gpu, b.qg, tw.qg, bar);
      }

      if (delta) feed(*gpu, b.w, tw.w), feed(*gpu, b.u, tw.u);
      feed(*gpu, b.Aqk, tw.Aqk);
      if (kda) feed(*gpu, b.kg, tw.kg), feed(*gpu, b.qg, tw.qg);
      // gdn with 16-bit inputs: the folded kernel (reads P, not w and u) in every block layout (16 or
      // 32 columns of one warpgroup; 64 as two warpgroups of 32 sharing the loaded tiles), and its
      // fused output; the others: the state kernel from w and u.
      const bool fold = !kda && sc.qkv != DType::f32;
      const std::vector<std::array<int, 2>> layouts =
          fold ? std::vector<std::array<int, 2>>{{1, 1}, {2, 1}, {2, 2}} : std::vector<std::array<int, 2>>{{0, 1}};
      for (const auto& [groups, warpgroups] : layouts) {
        if (fold) std::printf(" state kernel: folded, %d group(s) x %d warpgroup(s)\n", groups, warpgroups);
        else std::printf(" state kernel: %s\n", delta ? "from w, u" : "gla chain");
        pipe.set_state_groups(groups, warpgroups);
        test::poison(*gpu, b.h), test::poison(*gpu, b.vnew);
        test::DeviceTensor ht = test::poisoned(*gpu, DType::f32, shape_state(p));
        test::DeviceTensor of = fold ? test::poisoned(*gpu, DType::f32, shape_v(p)) : test::DeviceTensor{};
        pipe.run_stage(cuda::Stage::state, p, din.views, {of.view, ht.view});
        check_stage("state h", *gpu, b.h, tw.h, bar);
        if (delta) check_stage("state vnew", *gpu, b.vnew, tw.vnew, bar);  // gla: vnew = v, not formed
        check_stage("state ht", *gpu, ht.view, tw.ht, bar);
        if (fold) check_stage("state o", *gpu, of.view, tw.o, bar);
      }
      pipe.set_state_groups(0);

      feed(*gpu, b.h, tw.h), feed(*gpu, b.vnew, tw.vnew);
      test::DeviceTensor o = test::poisoned(*gpu, DType::f32, shape_v(p));
      pipe.run_stage(cuda::Stage::output, p, din.views, {o.view, {}});
      check_stage("output o", *gpu, o.view, tw.o, bar);
    }
  }
}

// gla's plain forward stores h TF32-rounded, the form its output reads it in without rounding it
// again (chunk_state_gla.cu stored_h); the kept forward stores float32, since kernel hv's gate term
// 2^b_end rowsum(h dh) reads h unrounded (rounded states made dg's error 2-4x larger).
TEST_CASE("gla's plain forward stores h as TF32 values, the kept forward as float32" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  val::CaseSpec s;
  s.variant = Variant::gla, s.T = 200, s.H = s.HV = 2, s.K = s.V = 64, s.seed = val::seed_from_env(802);
  std::printf("%s\n", s.name().c_str());
  const val::CaseData c = test::round_case(val::make_case(s), DType::bf16);
  const Problem p = c.problem(DType::f32);
  test::DeviceInputs din = test::upload_inputs(*gpu, c, DType::bf16);
  test::DeviceTensor o = test::poisoned(*gpu, DType::f32, shape_v(p));
  for (const bool keep : {false, true}) {
    cuda::Pipeline pipe(gpu->queue());
    pipe.set_keep_forward(keep);
    pipe.set_gla_halves(0);  // one chain (in halves, whether forced or automatic, h stays float32: corrected later)
    pipe.forward(p, din.views, {o.view, {}});
    const int64_t rounded_not = test::count_not_tf32(*gpu, pipe.buffers().h);
    INFO("keep ", keep, ": ", rounded_not, " of ", pipe.buffers().h.numel(), " h elements not TF32");
    CHECK(pipe.buffers().h.numel() >= p.K * p.V * p.HV * 4);  // the states of 4 chunks (T = 200) were written
    if (keep) CHECK(rounded_not > 0);
    else CHECK(rounded_not == 0);
  }
}
