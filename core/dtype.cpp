// DType names and the float16 conversions (bf16 is inline in dtype.h).
#include "core/dtype.h"

#include <cmath>

#include "core/error.h"

namespace kcp {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f64: return "float64";
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
  }
  return "?";
}

DType dtype_parse(std::string_view name) {
  if (name.starts_with("torch.")) name.remove_prefix(6);
  if (name == "float64" || name == "double" || name == "f64") return DType::f64;
  if (name == "float32" || name == "float" || name == "f32") return DType::f32;
  if (name == "float16" || name == "half" || name == "f16") return DType::f16;
  if (name == "bfloat16" || name == "bf16") return DType::bf16;
  if (name == "int32" || name == "i32") return DType::i32;
  if (name == "int64" || name == "long" || name == "i64") return DType::i64;
  throw Error(detail::concat("unknown dtype '", name, "' (expected float64, float32, float16, ",
                             "bfloat16, int32 or int64)"));
}

int dtype_size(DType t) {
  switch (t) {
    case DType::f64: case DType::i64: return 8;
    case DType::f32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: return 2;
  }
  return 0;
}

bool dtype_is_float(DType t) { return t != DType::i32 && t != DType::i64; }

float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);  // inf / nan
  } else if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      do { man <<= 1; ++e; } while (!(man & 0x400u));
      u = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else {
    u = sign | (exp + 112) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t au = u & 0x7fffffffu;
  if (au >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (au > 0x7f800000u ? 0x200u : 0u));
  if (au >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: overflow to inf
  if (au < 0x38800000u) {  // result is subnormal or zero: scale by 2^24 and round to an integer
    float a;
    std::memcpy(&a, &au, 4);
    return uint16_t(sign | uint16_t(std::nearbyint(double(a) * 16777216.0)));
  }
  uint32_t r = au - 0x38000000u;  // rebias exponent 127 -> 15 (in the 32-bit layout)
  r += 0xfffu + ((r >> 13) & 1u);  // round to nearest even on the 13 dropped bits
  return uint16_t(sign | (r >> 13));
}

double round_to(DType t, double x) {
  switch (t) {
    case DType::f64: return x;
    case DType::f32: return double(float(x));
    case DType::bf16: return double(bf16_to_float(float_to_bf16(float(x))));
    case DType::f16: return double(f16_to_float(float_to_f16(float(x))));
    case DType::i32: case DType::i64: return std::nearbyint(x);
  }
  return x;
}

}  // namespace kcp
