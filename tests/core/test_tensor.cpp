// Tensor views and the counter RNG (core/tensor.h, core/rng.h): shapes and strides, narrow() sharing
// memory, element access by multi-index, the owning Tensor, and the RNG's determinism and ranges
// (every seeded test depends on the same counter giving the same value). And DeviceTensor::reuse
// (core/queue.h): the same buffer while dtype and shape stay, a new one when either changes.
#include <doctest/doctest.h>

#include <cmath>

#include "core/queue.h"
#include "core/rng.h"
#include "core/tensor.h"

using namespace kcp;

TEST_CASE("shapes: numel, row-major strides, printing") {
  CHECK(shape_numel({2, 3, 4}) == 24);
  CHECK(shape_numel({}) == 1);
  CHECK(contiguous_strides({2, 3, 4}) == Shape{12, 4, 1});
  CHECK(shape_str({1, 64, 2, 32}) == "[1,64,2,32]");
}

TEST_CASE("narrow shares memory and keeps strides; an empty view stays empty") {
  Tensor<double> t({2, 5, 3});
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = double(i);
  const TensorView v = t.view().narrow(1, 2, 3);
  CHECK(v.shape == Shape{2, 3, 3});
  CHECK(v.stride == Shape{15, 3, 1});
  CHECK_FALSE(v.contiguous());
  CHECK(v.get(v.offset({1, 0, 2})) == t(1, 2, 2));
  v.set(v.offset({0, 2, 1}), -7.0);
  CHECK(t(0, 4, 1) == -7.0);
  CHECK(TensorView().narrow(0, 0, 1).empty());
  const Tensor<float> c = to_tensor<float>(v);  // a contiguous copy in another dtype
  CHECK(c.shape() == v.shape);
  CHECK(c(1, 1, 1) == float(t(1, 3, 1)));
}

TEST_CASE("typed pointers refuse the wrong dtype") {
  Tensor<float> t({4});
  CHECK(t.view().ptr<float>() == t.data());
  CHECK_THROWS_WITH_AS(t.view().ptr<double>(), doctest::Contains("holds float32"), Error);
}

TEST_CASE("counter RNG: same counter, same value; uniform in [0,1); normal has mean 0, variance 1") {
  const CounterRng a{42, 1}, b{42, 1}, other{42, 2};
  int differ = 0;
  double sum = 0, sq = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    CHECK(a.uniform(uint64_t(i)) == b.uniform(uint64_t(i)));
    const double u = a.uniform(uint64_t(i));
    CHECK((u >= 0.0 && u < 1.0));
    differ += a.uniform(uint64_t(i)) != other.uniform(uint64_t(i));
    const double z = a.normal(uint64_t(i));
    sum += z, sq += z * z;
  }
  CHECK(differ > n - 10);  // another stream is another sequence
  CHECK(std::fabs(sum / n) < 0.03);  // 4 standard errors (1/sqrt(n) = 0.007)
  CHECK(std::fabs(sq / n - 1.0) < 0.05);
}

TEST_CASE("DeviceTensor::reuse keeps its buffer for the same dtype and shape, reallocates otherwise") {
  Queue& q = host_queue();
  DeviceTensor t;
  const TensorView a = t.reuse(q, DType::f32, {2, 3});
  REQUIRE(a.data != nullptr);
  CHECK(a.shape == Shape{2, 3});
  CHECK(a.dtype == DType::f32);
  static_cast<float*>(a.data)[5] = 7.0f;
  const TensorView b = t.reuse(q, DType::f32, {2, 3});
  CHECK(b.data == a.data);                         // kept: the contents are the last user's
  CHECK(static_cast<float*>(b.data)[5] == 7.0f);
  const TensorView c = t.reuse(q, DType::f32, {3, 2});
  CHECK(c.shape == Shape{3, 2});                   // another shape: a view of that shape
  const TensorView d = t.reuse(q, DType::f64, {3, 2});
  CHECK(d.dtype == DType::f64);
  CHECK(d.numel() == 6);
  const TensorView e = t.reuse(q, DType::f64, {0});  // zero elements: still a non-null pointer
  CHECK(e.data != nullptr);
  CHECK(e.numel() == 0);
}
