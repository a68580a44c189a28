// The CP primitives on the GPU: transition_forward (S_ext, M) of a range of sequences of packed
// problems in one call, against the oracle's (cpu-recurrent, float64) per sequence, through the backend
// and through pipelines that assume 1 or 24 multiprocessors (32-column blocks; kda with 16-bit inputs
// and V = 64, K = 64 and 128: the transposed chain, cuda/chunk_state_kda.cu, and chunk_state.cu's with
// set_kda_chain(false), both under the same bar, which names the one that ran; gdn with bf16 and V = 64:
// the folded kernel's 2 x 2 layout at one multiprocessor); and the CUDA
// queue's transition algebra (fold oldest/farthest first, compose, start, identity) against the host
// queue's (the reference loops, core/queue.cpp) on the same float32 values. Bars: S_ext and M follow
// the forward's precision (kFloatVsDouble for float32 inputs; kCudaTf32 for 16-bit ones: kda's w and
// kg come from TF32 stages and its M chain is 3xTF32 on chunk_state.cu, TF32 on the transposed chain; gdn's pair comes from the forward's folded
// kernel, S carried as 16-bit hi + lo and P Y in TF32: the forward's own precision, for which
// kCudaTf32 is set; kcp bench --transitions at T = 32768 H = 16 saw 0.21 of it, H100 2026-11-27);
// the algebra is float32 FMA chains against float64 host loops: kFloatVsDouble. Outputs are
// NaN-poisoned first.
// Skipped where no CUDA device is present.
#include <doctest/doctest.h>

#include <cstdio>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "core/transition.h"
#include "cuda/backend_cuda.h"
#include "cuda/chunkwise.h"
#include "reference/backend_cpu.h"
#include "tests/cuda/cuda_support.h"
#include "validation/compare.h"
#include "validation/tolerance.h"

using namespace kcp;

namespace {

void check_close(const char* what, const Tensor<double>& got, const TensorView& ref, double bar) {
  const val::Metrics m = val::compare(got.view(), ref);
  std::printf("  %-8s rel_l2 %.3e max_abs %.3e (bar %.1e)\n", what, m.rel_l2, m.max_abs, bar);
  INFO(what, ": rel_l2 ", m.rel_l2, " max_abs ", m.max_abs, " at ", val::index_str(m.max_abs_at), " NaN ", m.nan_a);
  CHECK(m.nan_a == 0);
  CHECK(m.rel_l2 <= bar);
}

// float32-representable random values, so device and host start from the same numbers.
Tensor<double> random_f32(Shape sh, double sd, uint64_t seed, uint64_t stream) {
  Tensor<double> t(std::move(sh));
  const CounterRng rng{seed, stream};
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = double(float(sd * rng.normal(uint64_t(i))));
  return t;
}

}  // namespace

TEST_CASE("transition_forward of a range of sequences matches the oracle's (S_ext, M)" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  const uint64_t seed = val::seed_from_env(700);
  std::vector<std::pair<val::CaseSpec, DType>> cases;
  for (Variant var : {Variant::gdn, Variant::kda, Variant::gla})  // gla: M is diagonal
    for (DType dt : {DType::f32, DType::bf16}) cases.emplace_back(test::transition_case_spec(var, dt, seed), dt);
  for (const auto& [K, dt] : {std::pair<int64_t, DType>{64, DType::bf16}, {128, DType::f16}}) {
    // kda with V = 64: the transposed chain's shape (S_ext and M as V + K columns of 64)
    val::CaseSpec s = test::transition_case_spec(Variant::kda, dt, seed + 2);
    s.K = K, s.V = 64;
    cases.emplace_back(s, dt);
  }
  {  // gdn with 16-bit inputs and V = 64: V + K = 128 columns, so the folded kernel's 2 x 2 blocks (two
     // warpgroups of 32 columns) where a pipeline assumes one multiprocessor (fold_layout.h)
    val::CaseSpec s = test::transition_case_spec(Variant::gdn, DType::bf16, seed + 4);
    s.V = 64;
    cases.emplace_back(s, DType::bf16);
  }
  for (const auto& [s, dt] : cases) {
    const bool kda_chain = s.variant == Variant::kda && dt != DType::f32 && s.V % 64 == 0;
    SUBCASE((s.name() + " qkv=" + std::string(dtype_name(dt))).c_str()) {
      const val::CaseData c = test::round_case(val::make_case(s), dt);
      const Problem p64 = c.problem(DType::f64), p32 = c.problem(DType::f32);
      test::DeviceInputs din = test::upload_inputs(*gpu, c, dt);
      const double bar = dt == DType::f32 ? val::tol::kFloatVsDouble : val::tol::kCudaTf32;
      Tensor<double> ref(transition_shape(p64.N, p64.HV, p64.K, p64.V));
      oracle->transition_forward(p64, c.inputs(), 0, ref.view());
      // The backend as users call it (sms 0), and pipelines assuming 1 or 24 multiprocessors, which
      // pick 32-column blocks wherever they divide (1: forward S_ext and M in two launches; 24: both
      // in one launch at the 4-sequence range): every grid shape of the chains on these small cases.
      // kda with 16-bit inputs and V = 64: the transposed chain (sms 24), chunk_state.cu's (sms 1).
      for (const int sms : {0, 1, 24})
      for (const auto [first, count] : test::kTransitionRanges) {
        INFO("sequences [", first, ", ", first + count, "), assumed multiprocessors ", sms);
        test::DeviceTensor packed = test::poisoned(*gpu, DType::f32, transition_shape(count, p32.HV, p32.K, p32.V));
        cuda::Pipeline pipe(gpu->queue());
        pipe.set_multiprocessors(sms);
        pipe.set_kda_chain(sms != 1);
        if (sms > 0) {
          pipe.transition_forward(p32, din.views, first, packed.view);
          CHECK(pipe.kda_chain_used() == (kda_chain && sms != 1));
        } else {
          gpu->transition_forward(p32, din.views, first, packed.view);
        }
        const Tensor<double> got = test::to_host(*gpu, packed.view);
        for (int64_t i = 0; i < count; ++i) {
          const TensorView g = transition_element(got.view(), i), r = transition_element(ref.view(), first + i);
          check_close("s_ext", to_tensor<double>(transition_s(g)), transition_s(r), bar);
          check_close("m", to_tensor<double>(transition_m(g)), transition_m(r), bar);
        }
      }
    }
  }
}

TEST_CASE("the CUDA queue's transition algebra equals the host queue's" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  Queue& dq = gpu->queue();
  const int64_t P = 5, HV = 2, K = 64, V = 48;  // V not a multiple of the kernel's 32 columns
  const uint64_t seed = val::seed_from_env(701);
  Tensor<double> elems = random_f32(transition_shape(P, HV, K, V), 1.0, seed, 1);
  for (int64_t i = 0; i < P; ++i)  // M ~ N(0, 1/64): contractive like decayed chunks (x1/8 is exact in float32)
    for (int64_t h = 0; h < HV; ++h)
      for (int64_t r = 0; r < K; ++r)
        for (int64_t c = 0; c < K; ++c) elems(i, h, r, V + c) *= 0.125;
  host_queue().transition_start(transition_element(elems.view(), 0), {});  // element 0 starts a sequence
  const Tensor<double> x0 = random_f32({HV, K, V}, 1.0, seed, 2);
  auto d_elems = test::to_device(*gpu, elems, DType::f32), d_x0 = test::to_device(*gpu, x0, DType::f32);
  for (auto [first, count, reverse, with_x0] :
       {std::tuple{1, 3, false, true}, std::tuple{0, 5, false, false}, std::tuple{0, 4, true, false}, std::tuple{2, 0, true, true}}) {
    SUBCASE(("fold first=" + std::to_string(first) + " count=" + std::to_string(count) + (reverse ? " reverse" : "") +
             (with_x0 ? " x0" : "")).c_str()) {
      Tensor<double> ref({HV, K, V});
      host_queue().transition_fold(elems.view(), first, count, reverse, with_x0 ? x0.view() : TensorView{}, ref.view());
      test::DeviceTensor out = test::poisoned(*gpu, DType::f32, {HV, K, V});
      dq.transition_fold(d_elems.view, first, count, reverse, with_x0 ? d_x0.view : TensorView{}, out.view);
      check_close("fold", test::to_host(*gpu, out.view), ref.view(), val::tol::kFloatVsDouble);
    }
  }
  SUBCASE("compose, start, identity") {
    Tensor<double> ref(transition_shape(1, HV, K, V));
    host_queue().transition_compose(transition_element(elems.view(), 3), transition_element(elems.view(), 2),
                                    transition_element(ref.view(), 0));
    test::DeviceTensor out = test::poisoned(*gpu, DType::f32, transition_shape(1, HV, K, V));
    dq.transition_compose(transition_element(d_elems.view, 3), transition_element(d_elems.view, 2),
                          transition_element(out.view, 0));
    check_close("compose", test::to_host(*gpu, out.view), ref.view(), val::tol::kFloatVsDouble);
    host_queue().transition_start(transition_element(ref.view(), 0), x0.view());
    dq.transition_start(transition_element(out.view, 0), d_x0.view);
    check_close("start", test::to_host(*gpu, out.view), ref.view(), val::tol::kFloatVsDouble);
    host_queue().transition_identity(transition_element(ref.view(), 0));
    dq.transition_identity(transition_element(out.view, 0));
    CHECK(test::to_host(*gpu, out.view).vec() == ref.vec());
  }
}

TEST_CASE("the CUDA queue's view operations: strided copies across dtypes, add, zero" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  Queue& dq = gpu->queue();
  const Tensor<double> a = random_f32({3, 5, 7, 2}, 1.0, val::seed_from_env(702), 3);
  auto src = test::to_device(*gpu, a, DType::f32);
  test::DeviceTensor t64 = test::poisoned(*gpu, DType::f64, {2, 7, 5, 3});  // all axes reversed
  TensorView rev = t64.view;
  rev.shape = {3, 5, 7, 2}, rev.stride = {1, 3, 15, 105};
  dq.copy_view(rev, src.view);
  const Tensor<double> back = test::to_host(*gpu, t64.view);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 5; ++j) CHECK(back(1, 6, j, i) == a(i, j, 6, 1));
  dq.add_view(src.view, rev);  // src = 2 a, read through the strided float64 view
  CHECK(test::to_host(*gpu, src.view)(2, 4, 6, 1) == 2 * a(2, 4, 6, 1));
  test::DeviceTensor bf = test::poisoned(*gpu, DType::bf16, {3, 5, 7, 2});
  dq.copy_view(bf.view, src.view);  // rounds once, to nearest even
  CHECK(test::to_host(*gpu, bf.view)(0, 0, 0, 0) == round_to(DType::bf16, 2 * a(0, 0, 0, 0)));
  dq.fill_zero(src.view.narrow(1, 2, 1));
  const Tensor<double> z = test::to_host(*gpu, src.view);
  CHECK(z(1, 2, 3, 0) == 0.0);
  CHECK(z(1, 3, 3, 0) == 2 * a(1, 3, 3, 0));
}
