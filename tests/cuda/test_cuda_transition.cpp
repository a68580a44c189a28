// The CP primitive on the GPU: transition_forward (S_ext, M) of every sequence of packed problems
// against the oracle's (cpu-recurrent, float64), and merge_transitions against a float64 fold on the
// host. Bars: S_ext follows the forward's precision (kFloatVsDouble for float32 inputs, kCudaTf32
// for 16-bit ones, whose w and kg come from TF32 stages); M's own chain is 3xTF32, so the same bars
// apply; the merge is float32 FMA chains: kFloatVsDouble. Outputs are NaN-poisoned first.
// Skipped where no CUDA device is present.
#include <doctest/doctest.h>

#include <cstdio>

#include "core/rng.h"
#include "cuda/backend_cuda.h"
#include "cuda/cp_transition.h"
#include "reference/backend_cpu.h"
#include "tests/cuda/cuda_support.h"
#include "validation/compare.h"
#include "validation/tolerance.h"

using namespace kcp;

namespace {

void check_close(const char* what, const Tensor<double>& got, const Tensor<double>& ref, double bar) {
  const val::Metrics m = val::compare(got.view(), ref.view());
  std::printf("  %-6s rel_l2 %.3e max_abs %.3e (bar %.1e)\n", what, m.rel_l2, m.max_abs, bar);
  INFO(what, ": rel_l2 ", m.rel_l2, " max_abs ", m.max_abs, " at ", val::index_str(m.max_abs_at), " NaN ", m.nan_a);
  CHECK(m.nan_a == 0);
  CHECK(m.rel_l2 <= bar);
}

}  // namespace

TEST_CASE("transition_forward matches the oracle's (S_ext, M) per sequence" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  const uint64_t seed = val::seed_from_env(700);
  for (Variant var : {Variant::gdn, Variant::kda})
    for (DType dt : {DType::f32, DType::bf16}) {
      val::CaseSpec s;
      s.variant = var, s.seqlens = {70, 0, 130, 1}, s.H = 1, s.HV = 2, s.K = 64, s.V = 32;
      s.flags.use_qk_l2norm_in_kernel = var == Variant::kda;
      s.flags.use_beta_sigmoid_in_kernel = var == Variant::gdn;
      s.seed = seed + uint64_t(dt == DType::f32);
      SUBCASE((s.name() + " qkv=" + std::string(dtype_name(dt))).c_str()) {
        const val::CaseData c = test::round_case(val::make_case(s), dt);
        const Problem p64 = c.problem(DType::f64), p32 = c.problem(DType::f32);
        test::DeviceInputs din = test::upload_inputs(*gpu, c, dt);
        const double bar = dt == DType::f32 ? val::tol::kFloatVsDouble : val::tol::kCudaTf32;
        for (int64_t n = 0; n < p32.N; ++n) {
          Tensor<double> s_ref({p32.HV, p32.K, p32.V}), m_ref({p32.HV, p32.K, p32.K});
          oracle->transition_forward(p64, c.inputs(), n, {s_ref.view(), m_ref.view()});
          test::DeviceTensor s_ext = test::poisoned(*gpu, DType::f32, s_ref.shape());
          test::DeviceTensor m = test::poisoned(*gpu, DType::f32, m_ref.shape());
          gpu->transition_forward(p32, din.views, n, {s_ext.view, m.view});
          INFO("sequence ", n);
          check_close("s_ext", test::to_host(*gpu, s_ext.view), s_ref, bar);
          check_close("m", test::to_host(*gpu, m.view), m_ref, bar);
        }
      }
    }
}

TEST_CASE("merge_transitions folds gathered transitions oldest first" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  const int64_t P = 4, HV = 2, K = 64, V = 32;
  const CounterRng rng{val::seed_from_env(701), 1};
  auto random = [&](Shape sh, double sd, uint64_t off) {
    Tensor<double> t(std::move(sh));
    for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = double(float(sd * rng.normal(off + uint64_t(i))));
    return t;
  };
  const Tensor<double> m = random({P, HV, K, K}, 1.0 / 8, 0), x = random({P, HV, K, V}, 1.0, 1u << 20);
  const Tensor<double> s0 = random({HV, K, V}, 1.0, 1u << 22);
  auto d_m = test::to_device(*gpu, m, DType::f32), d_x = test::to_device(*gpu, x, DType::f32);
  auto d_s0 = test::to_device(*gpu, s0, DType::f32);
  for (auto [first, count, with_s0] : {std::tuple{1, 3, true}, std::tuple{0, 4, false}, std::tuple{2, 0, true}}) {
    SUBCASE(("first=" + std::to_string(first) + " count=" + std::to_string(count) + (with_s0 ? " s0" : "")).c_str()) {
      Tensor<double> ref({HV, K, V});
      for (int64_t h = 0; h < HV; ++h)
        for (int64_t i = 0; i < K; ++i)
          for (int64_t j = 0; j < V; ++j) ref(h, i, j) = with_s0 ? s0(h, i, j) : 0.0;
      for (int64_t r = first; r < first + count; ++r) {
        Tensor<double> next({HV, K, V});
        for (int64_t h = 0; h < HV; ++h)
          for (int64_t i = 0; i < K; ++i)
            for (int64_t j = 0; j < V; ++j) {
              double acc = x(r, h, i, j);
              for (int64_t q = 0; q < K; ++q) acc += m(r, h, i, q) * ref(h, q, j);
              next(h, i, j) = acc;
            }
        ref = next;
      }
      test::DeviceTensor out = test::poisoned(*gpu, DType::f32, {HV, K, V});
      cuda::merge_transitions(d_m.view, d_x.view, first, count, with_s0 ? d_s0.view : TensorView{}, out.view);
      check_close("merged", test::to_host(*gpu, out.view), ref, val::tol::kFloatVsDouble);
    }
  }
}
