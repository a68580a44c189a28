// Element types kcp reads and writes, and the exact conversions between them.
// bfloat16 and float16 narrow with round-to-nearest-even (PyTorch's rule; HDF5's own conversion
// rounds ties away from zero, see docs/DUMP_FORMAT.md section 3), and widen exactly.
// Covered by tests/core/test_dtype.cpp.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace kcp {

enum class DType { f64, f32, f16, bf16, i32, i64 };

std::string_view dtype_name(DType t);               // "float64", "float32", "float16", "bfloat16", ...
DType dtype_parse(std::string_view name);           // accepts torch names ("torch.bfloat16") too
int dtype_size(DType t);
bool dtype_is_float(DType t);

// bfloat16 / float16 bit patterns <-> float.
inline float bf16_to_float(uint16_t bits) {
  uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))  // NaN: keep it a quiet NaN
    return uint16_t((u >> 16) | 0x0040u);
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;  // round to nearest, ties to even
  return uint16_t(u >> 16);
}
float f16_to_float(uint16_t bits);
uint16_t float_to_f16(float f);

// Rounds a value through a narrower type and back (what a tensor stored in `t` would hold).
double round_to(DType t, double x);

}  // namespace kcp
