// Counter-based random numbers: value = f(seed, stream, index), as in nccl-tests, so any rank can
// regenerate its slice of a global tensor bit-identically and every test input is reproducible
// from the printed seed. splitmix64 mixing; uniform in [0,1) with 53 bits; normal by Box-Muller.
// Covered by tests/core/test_tensor.cpp.
#pragma once

#include <cmath>
#include <cstdint>

namespace kcp {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct CounterRng {
  uint64_t seed = 0, stream = 0;
  uint64_t bits(uint64_t i) const { return splitmix64(splitmix64(seed ^ splitmix64(stream)) + i); }
  double uniform(uint64_t i) const { return double(bits(i) >> 11) * 0x1.0p-53; }
  double uniform(uint64_t i, double lo, double hi) const { return lo + (hi - lo) * uniform(i); }
  double normal(uint64_t i) const {
    const double u1 = (double(bits(2 * i) >> 11) + 0.5) * 0x1.0p-53, u2 = uniform(2 * i + 1);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

}  // namespace kcp
