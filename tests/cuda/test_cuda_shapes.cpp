// The registry's cuda-chunkwise on shapes its kernels are not instantiated for, served by the shape
// adapter (core/padded_backend.h, cuda::pad_rule()): K = 16, 48, 96, V = 16, 40, 72, chunk_size 32,
// gdn / kda / gla, lengths 1, 63, 65 and packed (with empty and one-token sequences), h0 / final state,
// state_v_first, the fused flags, q/k/v in bfloat16 and float32; against the float64 oracle
// (cpu-recurrent) on the unpadded problem:
//   forward (o, final_state), backward (every gradient; skipped where supports_backward() says no, gla
//   today), transition_forward and transition_backward of sequence ranges, and one case with a strided
//   q and o on the device, and o views at element offsets 1 and 2 (unpadded shapes: the kernels'
//   own stores). Outputs NaN-poisoned before each launch.
// Bars (validation/tolerance.h), as the unpadded suites use them: forward and transitions as
// test_cuda_forward.cpp / test_cuda_transition.cpp (float32 inputs kFloatVsDouble; 16-bit kCudaTf32);
// gradients as test_cuda_backward.cpp (16-bit: kFlaChunkGrad, kFlaChunkGateBeta for the gate and beta
// gradients; float32: kFloatVsDouble or the float32 rule against the float32 recurrence, the looser).
// What needs no GPU (supports() of the registry's backend) is in test_cuda_backend.cpp.
// Skipped (kernels) where no CUDA device is present.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "core/transition.h"
#include "reference/backend_cpu.h"
#include "tests/cuda/cuda_support.h"
#include "validation/compare.h"
#include "validation/float_rule.h"
#include "validation/registry.h"
#include "validation/run_case.h"
#include "validation/tolerance.h"

using namespace kcp;

namespace {

using ShapeCase = test::DtypeCase;

std::vector<ShapeCase> sweep(uint64_t seed) {
  struct L { int64_t B, T; std::vector<int64_t> lens; int64_t H, HV, K, V; };
  const std::vector<L> layouts = {{1, 1, {}, 2, 2, 16, 16},           {2, 63, {}, 1, 2, 48, 40},
                                  {1, 65, {}, 2, 2, 16, 72},          {1, 0, {65, 1, 0, 63}, 1, 2, 48, 16},
                                  {1, 0, {40, 100}, 2, 2, 96, 40},    {1, 130, {}, 1, 1, 64, 40}};
  std::vector<ShapeCase> out;
  for (Variant var : {Variant::gdn, Variant::kda, Variant::gla})
    for (size_t li = 0; li < layouts.size(); ++li)
      for (int f = 0; f < 3; ++f) {
        const L& l = layouts[li];
        ShapeCase c;
        val::CaseSpec& s = c.spec;
        s.variant = var, s.B = l.B, s.T = l.T, s.seqlens = l.lens, s.H = l.H, s.HV = l.HV, s.K = l.K, s.V = l.V;
        s.chunk_size = (li + size_t(f)) % 2 == 0 ? 32 : 64;
        if (f == 1) {  // the fused pre-processing: per-channel dt_bias padded with K
          s.flags.use_qk_l2norm_in_kernel = s.flags.use_gate_in_kernel = true;
          s.flags.use_beta_sigmoid_in_kernel = var != Variant::gla;
          if (var != Variant::gdn && li % 2 == 1) s.flags.lower_bound = -5.0, s.flags.safe_gate = true;
        }
        if (f == 2) s.flags.state_v_first = true, s.initial_state = li % 2 == 0, s.final_state = li % 3 != 0;
        s.seed = seed + out.size();
        c.qkv = out.size() % 2 == 0 ? DType::bf16 : DType::f32;
        out.push_back(c);
      }
  return out;
}

void check_forward(Backend& gpu, const ShapeCase& sc, const val::CaseData& c, const val::RunResult<double>& ref) {
  const Problem p = c.problem(DType::f32);
  test::DeviceInputs din = test::upload_inputs(gpu, c, sc.qkv);
  test::DeviceTensor o = test::poisoned(gpu, DType::f32, shape_v(p)), ht;
  if (sc.spec.final_state) ht = test::poisoned(gpu, DType::f32, shape_state(p));
  gpu.forward(p, din.views, {o.view, ht.view});
  const double bar = sc.qkv == DType::f32 ? val::tol::kFloatVsDouble : val::tol::kCudaTf32;
  test::check_rel_l2("o", sc.name(), test::to_host(gpu, o.view), ref.out.o.view(), bar);
  if (sc.spec.final_state)
    test::check_rel_l2("final_state", sc.name(), test::to_host(gpu, ht.view), ref.out.final_state.view(), bar);
}

// dq, dk, dv in the input dtype, the rest float32 (FLA's dtypes), as test_cuda_backward.cpp.
void check_backward(Backend& gpu, Backend& oracle, const ShapeCase& sc, const val::CaseData& c,
                    const val::RunResult<double>& ref) {
  const Problem p = c.problem(DType::f32);
  test::DeviceInputs din = test::upload_inputs(gpu, c, sc.qkv);
  test::DeviceTensor d_o = test::to_device(gpu, c.d_o, sc.qkv), dht;
  if (!c.dht.empty()) dht = test::to_device(gpu, c.dht, DType::f32);
  const test::DeviceGrads dg = test::device_grads(gpu, ref.grads, sc.qkv);
  gpu.backward(p, din.views, {d_o.view, dht.view}, dg.views);
  const bool f32 = sc.qkv == DType::f32;
  val::RunResult<float> r32;
  val::GradConditioning cond;
  if (f32) {
    r32 = val::run_case<float>(oracle, c, true);
    cond = val::grad_conditioning(c.problem(DType::f64), c.inputs(), c.cotangents(), ref.grads.dg.view());
  }
  const auto base = val::named_tensors(r32);
  for (const test::DeviceGrad& d : dg.t) {
    double bar = test::fla_chunk_bar(d.name);
    if (f32)
      for (const auto& [n, b] : base)
        if (d.name == n)
          bar = std::max(val::tol::kFloatVsDouble,
                         val::float_rule_bar(val::compare(b->view(), d.want->view()).rel_l2, cond.of(d.name)));
    test::check_rel_l2(d.name, sc.name(), test::to_host(gpu, d.t.view), d.want->view(), bar);
  }
}

// M (and M^T) is a product of per-token transitions, each a contraction with entries <= 1; its
// natural scale is the identity's, the state it multiplies is O(1), and on the long softplus-gated
// sequences here it decays to 1e-6 .. 1e-115 (below float32's range: stored 0 or subnormal, the
// reason the plain rel_l2 is meaningless there). An error in M matters through M S, so it is measured
// against max(||M||, ||I||) (||I|| = sqrt(HV K)): the same bar, relative to the identity once M has
// decayed below it. test_cuda_transition.cpp judges M with the plain rel_l2 on gates that keep M O(1).
void check_transition_m(const char* what, const std::string& name, const Tensor<double>& got, const TensorView& ref,
                        double bar) {
  const val::Metrics m = val::compare(got.view(), ref);
  const double ref_norm = m.ref_rms * std::sqrt(double(m.n)), id_norm = std::sqrt(double(ref.shape[0] * ref.shape[1]));
  const double err = (m.rel_l2 > 0 ? m.rel_l2 * ref_norm : 0) / std::max(ref_norm, id_norm);
  std::printf("  %-16s err/max(|M|,|I|) %.3e  rel_l2 %.3e  (bar %.1e)  %s\n", what, err, m.rel_l2, bar, name.c_str());
  INFO(what, ": err ", err, ", rel_l2 ", m.rel_l2, ", max_abs ", m.max_abs, " at ", val::index_str(m.max_abs_at), ", NaN ",
       m.nan_a);
  CHECK(m.nan_a == 0);
  CHECK(m.finite_ok());
  CHECK(err <= bar);
}

void check_transitions(Backend& gpu, Backend& oracle, const ShapeCase& sc, const val::CaseData& c, bool backward) {
  const Problem p64 = c.problem(DType::f64), p32 = c.problem(DType::f32);
  test::DeviceInputs din = test::upload_inputs(gpu, c, sc.qkv);
  test::DeviceTensor d_o = test::to_device(gpu, c.d_o, DType::f32);
  Tensor<double> ref(transition_shape(p64.N, p64.HV, p64.K, p64.V));
  if (backward) oracle.transition_backward(p64, c.inputs(), c.d_o.view(), 0, ref.view());
  else oracle.transition_forward(p64, c.inputs(), 0, ref.view());
  const double bar = sc.qkv == DType::f32 ? val::tol::kFloatVsDouble : val::tol::kCudaTf32;
  for (auto [first, count] : {std::pair<int64_t, int64_t>{0, p64.N}, {p64.N - 1, 1}}) {
    INFO("sequences [", first, ", ", first + count, ")");
    test::DeviceTensor pk = test::poisoned(gpu, DType::f32, transition_shape(count, p32.HV, p32.K, p32.V));
    if (backward) gpu.transition_backward(p32, din.views, d_o.view, first, pk.view);
    else gpu.transition_forward(p32, din.views, first, pk.view);
    const Tensor<double> got = test::to_host(gpu, pk.view);
    for (int64_t i = 0; i < count; ++i) {
      const TensorView g = transition_element(got.view(), i), r = transition_element(ref.view(), first + i);
      test::check_rel_l2(backward ? "ds_ext" : "s_ext", sc.name(), to_tensor<double>(transition_s(g)), transition_s(r), bar);
      check_transition_m(backward ? "m_t" : "m", sc.name(), to_tensor<double>(transition_m(g)), transition_m(r), bar);
    }
  }
}

val::CaseData rounded_case(const ShapeCase& sc) {
  val::CaseData c = test::round_case(val::make_case(sc.spec), sc.qkv);
  for (double& x : c.d_o.vec()) x = round_to(sc.qkv, x);  // FLA: do in the input dtype
  return c;
}

}  // namespace

TEST_CASE("cuda-chunkwise on padded shapes matches the float64 oracle" * doctest::skip(!test::gpu_present())) {
  auto gpu = val::backend_create("cuda-chunkwise");
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  for (const ShapeCase& sc : sweep(val::seed_from_env(1100))) {
    SUBCASE(sc.name().c_str()) {
      const val::CaseData c = rounded_case(sc);
      const Problem p = c.problem(DType::f32);
      REQUIRE(gpu->supports(p));
      CHECK(gpu->explain_forward(p).find("pad ") == 0);
      const bool bwd = bool(gpu->supports_backward(p));
      const auto ref = val::run_case<double>(*oracle, c, bwd);
      check_forward(*gpu, sc, c, ref);
      check_transitions(*gpu, *oracle, sc, c, false);
      if (!bwd) {
        std::printf("  backward skipped: %s  %s\n", gpu->supports_backward(p).reason.c_str(), sc.name().c_str());
        continue;
      }
      check_backward(*gpu, *oracle, sc, c, ref);
      check_transitions(*gpu, *oracle, sc, c, true);
    }
  }
}

TEST_CASE("cuda-chunkwise pads strided device views" * doctest::skip(!test::gpu_present())) {
  auto gpu = val::backend_create("cuda-chunkwise");
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  ShapeCase sc;
  sc.spec.variant = Variant::kda, sc.spec.seqlens = {33, 70}, sc.spec.H = 1, sc.spec.HV = 2;
  sc.spec.K = 48, sc.spec.V = 40, sc.spec.chunk_size = 32, sc.spec.seed = val::seed_from_env(1101);
  sc.spec.flags.use_gate_in_kernel = true, sc.qkv = DType::f32;
  const val::CaseData c = rounded_case(sc);
  const Problem p = c.problem(DType::f32);
  const auto ref = val::run_case<double>(*oracle, c, false);
  test::DeviceInputs din = test::upload_inputs(*gpu, c, DType::f32);
  Shape wide_q = shape_qk(p), wide_o = shape_v(p);
  wide_q.back() += 16, wide_o.back() += 8;
  test::DeviceTensor q = test::poisoned(*gpu, DType::f32, wide_q), o = test::poisoned(*gpu, DType::f32, wide_o);
  const TensorView qv = q.view.narrow(3, 0, p.K), ov = o.view.narrow(3, 0, p.V);
  gpu->queue().copy_view(qv, din.views.q);
  Inputs in = din.views;
  in.q = qv;
  test::DeviceTensor ht = test::poisoned(*gpu, DType::f32, shape_state(p));
  gpu->forward(p, in, {ov, ht.view});
  const Tensor<double> o_wide = test::to_host(*gpu, o.view);
  test::check_rel_l2("o (strided)", sc.name(), to_tensor<double>(o_wide.view().narrow(3, 0, p.V)), ref.out.o.view(),
               val::tol::kFloatVsDouble);
  test::check_rel_l2("final_state", sc.name(), test::to_host(*gpu, ht.view), ref.out.final_state.view(), val::tol::kFloatVsDouble);
  int64_t untouched = 0;  // the columns beside the view keep their poison
  for (int64_t i = 0; i < o_wide.numel(); ++i) untouched += i % wide_o.back() >= p.V && std::isnan(o_wide.data()[i]);
  CHECK(untouched == o_wide.numel() / wide_o.back() * 8);
}

// o at element offsets 1 and 2 of a wider row (a slice of a caller's buffer): the kernels store pairs
// or quads of columns only where the view's start and row stride are aligned for them, else element by
// element (tile_store.cuh store_acc_rows); before, the folded gdn kernel's pair stores faulted on such a
// view. Unpadded shapes (K = 64, V = 32), so the view reaches the kernels themselves; bf16 inputs (gdn:
// the folded kernel).
TEST_CASE("cuda-chunkwise writes o into views at any element offset" * doctest::skip(!test::gpu_present())) {
  auto gpu = val::backend_create("cuda-chunkwise");
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  uint64_t seed = val::seed_from_env(1201);
  for (Variant var : {Variant::gdn, Variant::kda, Variant::gla})
    for (int64_t off : {1, 2}) {
      ShapeCase sc;
      sc.spec.variant = var, sc.spec.seqlens = {70, 33}, sc.spec.H = 2, sc.spec.HV = 2, sc.spec.K = 64, sc.spec.V = 32;
      sc.spec.seed = seed++, sc.qkv = DType::bf16;
      SUBCASE((sc.name() + " o offset " + std::to_string(off)).c_str()) {
        const val::CaseData c = rounded_case(sc);
        const Problem p = c.problem(DType::f32);
        REQUIRE(gpu->supports(p));
        CHECK(gpu->explain_forward(p).find("pad ") == std::string::npos);  // the kernels see the view
        const auto ref = val::run_case<double>(*oracle, c, false);
        test::DeviceInputs din = test::upload_inputs(*gpu, c, sc.qkv);
        Shape wide_o = shape_v(p);
        wide_o.back() += 4;
        test::DeviceTensor o = test::poisoned(*gpu, DType::f32, wide_o);
        test::DeviceTensor ht = test::poisoned(*gpu, DType::f32, shape_state(p));
        gpu->forward(p, din.views, {o.view.narrow(3, off, p.V), ht.view});
        const Tensor<double> o_wide = test::to_host(*gpu, o.view);
        test::check_rel_l2("o (offset view)", sc.name(), to_tensor<double>(o_wide.view().narrow(3, off, p.V)), ref.out.o.view(),
                           val::tol::kCudaTf32);
        int64_t untouched = 0;  // the columns beside the view keep their poison
        for (int64_t i = 0; i < o_wide.numel(); ++i) {
          const int64_t col = i % wide_o.back();
          untouched += (col < off || col >= off + p.V) && std::isnan(o_wide.data()[i]);
        }
        CHECK(untouched == o_wide.numel() / wide_o.back() * 4);
      }
    }
}
