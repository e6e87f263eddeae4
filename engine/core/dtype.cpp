#include "core/dtype.h"

#include <cmath>

namespace ss {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
  }
  return "?";
}

// IEEE 754 binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31;
  const int exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  float value;
  if (exp == 0) {
    value = std::ldexp(float(mant), -24);  // subnormal (or zero)
  } else if (exp == 31) {
    value = mant ? NAN : INFINITY;
  } else {
    value = std::ldexp(float(mant | 0x400), exp - 25);
  }
  uint32_t u;
  std::memcpy(&u, &value, 4);
  u |= sign;
  std::memcpy(&value, &u, 4);
  return value;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;  // rounds to infinity
  if (a < 6.103515625e-05f) {               // subnormal: multiples of 2^-24
    return sign | uint16_t(std::nearbyint(a * 16777216.0f));
  }
  int e;
  float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  uint32_t mant = uint32_t(std::nearbyint((m * 2.0f - 1.0f) * 1024.0f));
  int exp = e - 1 + 15;
  if (mant == 1024) {
    mant = 0;
    ++exp;
  }
  if (exp >= 31) return sign | 0x7c00;
  return sign | uint16_t(exp << 10) | uint16_t(mant);
}

}  // namespace ss
