// dtype conversions: bf16 and f16 round to nearest even (PyTorch's rule, not HDF5's ties-away),
// widen exactly, keep NaN/Inf; views convert on load/store; to_tensor honours strides.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/tensor.h"

using namespace kcp;

namespace {
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

TEST_CASE("bf16 rounds to nearest even, like torch") {
  CHECK(float_to_bf16(from_bits(0x3F808000u)) == 0x3F80u);  // tie, even below (HDF5 would give 0x3F81)
  CHECK(float_to_bf16(from_bits(0x3F818000u)) == 0x3F82u);  // tie, even above
  CHECK(float_to_bf16(from_bits(0x3F808001u)) == 0x3F81u);  // above the tie
  CHECK(float_to_bf16(1.0f) == 0x3F80u);
  CHECK(bf16_to_float(0x3F80u) == 1.0f);
  CHECK(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  CHECK(bf16_to_float(float_to_bf16(INFINITY)) == INFINITY);
  CHECK(bf16_to_float(float_to_bf16(-INFINITY)) == -INFINITY);
  for (uint32_t b = 0; b < 0x10000u; b += 7) {  // every 7th pattern survives a round trip
    const float f = bf16_to_float(uint16_t(b));
    if (!std::isnan(f)) CHECK(float_to_bf16(f) == b);
  }
}

TEST_CASE("f16 conversions: normals, subnormals, overflow, ties to even") {
  CHECK(float_to_f16(1.0f) == 0x3C00u);
  CHECK(f16_to_float(0x3C00u) == 1.0f);
  CHECK(f16_to_float(0x0001u) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(float_to_f16(std::ldexp(1.0f, -24)) == 0x0001u);
  CHECK(float_to_f16(65504.0f) == 0x7BFFu);
  CHECK(float_to_f16(70000.0f) == 0x7C00u);                // overflow to inf
  CHECK(float_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3C00u);  // tie to even (down)
  CHECK(float_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3C02u);  // tie to even (up)
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const float f = f16_to_float(uint16_t(b));
    if (!std::isnan(f)) CHECK(float_to_f16(f) == b);
  }
}

TEST_CASE("dtype names parse, including torch spellings") {
  CHECK(dtype_parse("torch.bfloat16") == DType::bf16);
  CHECK(dtype_parse("float32") == DType::f32);
  CHECK_THROWS_WITH_AS(dtype_parse("float8"), doctest::Contains("unknown dtype 'float8'"), Error);
}

TEST_CASE("views convert on load and store, and to_tensor follows strides") {
  std::vector<uint16_t> bits(6);
  TensorView v(bits.data(), DType::bf16, {2, 3});
  const double vals[6] = {1.0, -2.5, 3.0078125, 0.1, 1e30, -0.0};
  view_store<double>(v, 0, 6, 1, vals);
  double back[6];
  view_load<double>(v, 0, 6, 1, back);
  for (int i = 0; i < 6; ++i) CHECK(back[i] == round_to(DType::bf16, vals[i]));
  // a transposed view of a [3,2] float buffer
  float buf[6] = {0, 1, 2, 3, 4, 5};
  TensorView t(buf, DType::f32, {2, 3});
  t.stride = {1, 2};
  const Tensor<double> c = to_tensor<double>(t);
  CHECK(c(0, 0) == 0);
  CHECK(c(0, 1) == 2);
  CHECK(c(1, 2) == 5);
  CHECK_THROWS_AS(t.ptr<double>(), Error);
}
