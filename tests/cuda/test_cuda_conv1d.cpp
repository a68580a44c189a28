// The GPU conv1d (cuda/conv1d.cu) against the float64 reference (reference/conv1d.h) on packed
// sequences (an empty one, a length-1 one), with and without a CP halo, SiLU or identity, bias or
// not, W = 2..4: y, dx, dweight, dbias, dhalo. The GPU computes in float32 on float32 inputs (FMA
// sums of W + T terms): bar kFloatVsDouble. Outputs are NaN-poisoned first. Skipped without a GPU.
#include <doctest/doctest.h>

#include <cstdio>

#include "core/rng.h"
#include "cuda/backend_cuda.h"
#include "reference/conv1d.h"
#include "tests/cuda/cuda_support.h"
#include "validation/compare.h"
#include "validation/tolerance.h"

using namespace kcp;

namespace {

Tensor<double> random_f32(Shape sh, uint64_t seed, uint64_t stream) {
  Tensor<double> t(std::move(sh));
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = double(float(CounterRng{seed, stream}.normal(uint64_t(i))));
  return t;
}

void check(const char* what, const Tensor<double>& got, const Tensor<double>& ref) {
  const val::Metrics m = val::compare(got.view(), ref.view());
  std::printf("  %-8s rel_l2 %.3e\n", what, m.rel_l2);
  INFO(what, ": rel_l2 ", m.rel_l2, " NaN ", m.nan_a);
  CHECK(m.nan_a == 0);
  CHECK(m.rel_l2 <= val::tol::kFloatVsDouble);
}

}  // namespace

TEST_CASE("conv1d on the GPU equals the reference" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  const std::vector<int64_t> cu = {0, 37, 37, 38, 130};
  const int64_t T = cu.back(), D = 70;
  const uint64_t seed = val::seed_from_env(740);
  for (int64_t W : {2, 3, 4})
    for (bool silu_bias : {true, false})
      for (int64_t halo : {int64_t(0), W - 1}) {
        SUBCASE(("W=" + std::to_string(W) + (silu_bias ? " silu+bias" : " identity") + " halo=" + std::to_string(halo)).c_str()) {
          const Tensor<double> x = random_f32({1, T, D}, seed, 1), w = random_f32({D, W}, seed, 2),
                               dy = random_f32({1, T, D}, seed, 4), h = random_f32({halo, D}, seed, 5);
          const Tensor<double> b = silu_bias ? random_f32({D}, seed, 3) : Tensor<double>();
          const TensorView hv = halo ? h.view() : TensorView();
          const auto p64 = ref::make_conv1d_problem(x.view(), w.view(), b.view(), cu, silu_bias, hv, DType::f64);
          Tensor<double> y({1, T, D}), dx({1, T, D}), dw({D, W}), db({D}), dh({halo, D});
          ref::conv1d_forward(p64, x.view(), w.view(), b.view(), hv, y.view());
          ref::conv1d_backward(p64, x.view(), w.view(), b.view(), hv, dy.view(), dx.view(), dw.view(),
                               silu_bias ? db.view() : TensorView(), halo ? dh.view() : TensorView());
          auto d_x = test::to_device(*gpu, x, DType::f32), d_w = test::to_device(*gpu, w, DType::f32),
               d_dy = test::to_device(*gpu, dy, DType::f32), d_h = test::to_device(*gpu, h, DType::f32);
          test::DeviceTensor d_b = silu_bias ? test::to_device(*gpu, b, DType::f32) : test::DeviceTensor();
          const TensorView dhv = halo ? d_h.view : TensorView();
          const auto p32 = make_conv1d_problem(d_x.view, d_w.view, d_b.view, cu, silu_bias, dhv, DType::f32);
          auto o_y = test::poisoned(*gpu, DType::f32, {1, T, D}), o_dx = test::poisoned(*gpu, DType::f32, {1, T, D}),
               o_dw = test::poisoned(*gpu, DType::f32, {D, W}), o_db = test::poisoned(*gpu, DType::f32, {D}),
               o_dh = test::poisoned(*gpu, DType::f32, {halo, D});
          gpu->conv1d_forward(p32, {d_x.view, d_w.view, d_b.view, dhv}, o_y.view);
          gpu->conv1d_backward(p32, {d_x.view, d_w.view, d_b.view, dhv}, d_dy.view,
                               {o_dx.view, o_dw.view, silu_bias ? o_db.view : TensorView(), halo ? o_dh.view : TensorView()});
          check("y", test::to_host(*gpu, o_y.view), y);
          check("dx", test::to_host(*gpu, o_dx.view), dx);
          check("dweight", test::to_host(*gpu, o_dw.view), dw);
          if (silu_bias) check("dbias", test::to_host(*gpu, o_db.view), db);
          if (halo) check("dhalo", test::to_host(*gpu, o_dh.view), dh);
        }
      }
}
