// The device's TF32 operand conversion (tile_mma.cuh tf32_bits, through cuda/tf32_probe) against a
// host round-to-nearest-even to 10 stored mantissa bits: bit for bit on special values (signed
// zeros, infinities, the largest float, halfway cases with even and odd last kept bits, subnormals)
// and on random bit patterns (seed printed). The kernels rely on three properties: the low 13 bits
// of a converted value are zero (values stored rounded are passed to the tensor cores as they are),
// NaN and infinity survive (no silent finite result from a non-finite input), and hi + lo carries
// x to ~2^-22 relative (3xTF32 products). Skipped where no CUDA device is present.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/tf32_probe.h"
#include "tests/cuda/cuda_support.h"

using namespace kcp;

namespace {

float from_bits(uint32_t b) { return std::bit_cast<float>(b); }
uint32_t to_bits(float x) { return std::bit_cast<uint32_t>(x); }

// Round to nearest, ties to even, keeping the top 19 bits (sign, 8 exponent, 10 mantissa); a carry
// into the exponent is the correct result (up to infinity). Finite inputs only.
uint32_t tf32_rne(uint32_t b) { return (b + 0xfffu + ((b >> 13) & 1u)) & ~0x1fffu; }

}  // namespace

TEST_CASE("TF32 operand conversion rounds to nearest even, keeps NaN and infinity" * doctest::skip(!test::gpu_present())) {
  std::vector<float> x;
  for (uint32_t b : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu, 0xff7fffffu, 0x3f800000u,
                     0x3f801000u, 0x3f803000u, 0x3f800fffu, 0x3f801001u, 0xbf801000u, 0xbf803000u, 0x00000001u,
                     0x00001000u, 0x00003000u, 0x007fffffu, 0x80001000u, 0x7f7ff000u})
    x.push_back(from_bits(b));
  const std::vector<uint32_t> nans = {0x7fffffffu, 0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fffe000u};
  for (uint32_t b : nans) x.push_back(from_bits(b));
  const unsigned seed = 20261128u;
  MESSAGE("seed ", seed);
  std::mt19937 rng(seed);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t b = static_cast<uint32_t>(rng());  // mt19937 draws 32 bits; its result_type is wider
    if (!std::isnan(from_bits(b))) x.push_back(from_bits(b));
  }
  const auto [hi, lo] = cuda::tf32_probe(x);
  int wrong = 0, low_bits = 0, nan_lost = 0, split_far = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const uint32_t b = to_bits(x[i]);
    if (hi[i] & 0x1fffu) ++low_bits;
    if (std::isnan(x[i])) {
      if (!std::isnan(from_bits(hi[i])) && ++nan_lost <= 3) MESSAGE("NaN 0x", std::hex, b, " -> 0x", hi[i]);
      continue;
    }
    const uint32_t want = std::isinf(x[i]) ? b : tf32_rne(b);
    if (hi[i] != want && ++wrong <= 5) MESSAGE("x = 0x", std::hex, b, ": got 0x", hi[i], ", expected 0x", want);
    const double xd = x[i], s = double(from_bits(hi[i])) + double(from_bits(lo[i]));
    if (std::isfinite(from_bits(hi[i])) && std::fabs(xd) > 1e-30 && std::fabs(s - xd) > 0x1p-21 * std::fabs(xd) &&
        ++split_far <= 3)
      MESSAGE("split of 0x", std::hex, b, ": hi + lo off by ", std::fabs(s - xd) / std::fabs(xd), " relative");
  }
  CHECK(wrong == 0);
  CHECK(low_bits == 0);
  CHECK(nan_lost == 0);
  CHECK(split_far == 0);
}
