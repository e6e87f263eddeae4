#include "core/dtype.h"

#include <cmath>
#include <iterator>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "core/error.h"

namespace ss {

namespace {
// Per dtype (in enum order): the safetensors-style name and the run-facing one.
struct DTypeNames {
  std::string_view file, run;
};
constexpr DTypeNames kNames[] = {{"f32", "fp32"}, {"bf16", "bf16"}, {"f16", "fp16"}, {"i32", "i32"}};
}  // namespace

std::string_view dtype_name(DType t) { return size_t(t) < std::size(kNames) ? kNames[size_t(t)].file : "?"; }
std::string_view compute_dtype_name(DType t) { return size_t(t) < std::size(kNames) ? kNames[size_t(t)].run : "?"; }

DType parse_compute_dtype(const std::string& text, const std::string& option) {
  if (text == "fp32" || text == "f32" || text == "float32") return DType::F32;
  if (text == "bf16" || text == "bfloat16") return DType::BF16;
  if (text == "fp16" || text == "f16" || text == "float16" || text == "half") return DType::F16;
  throw UsageError((option.empty() ? "" : option + " ") + "'" + text + "' is not a compute dtype; use fp32, bf16 or fp16");
}

Precision precision_of(DType t) {
  switch (t) {
    case DType::BF16:
      return Precision::BF16;
    case DType::F16:
      return Precision::FP16;
    default:
      return Precision::FP32;
  }
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

std::string QuantSpec::str() const {
  std::string s;
  switch (precision) {
    case Precision::FP32:
      return "fp32";
    case Precision::BF16:
      return "bf16";
    case Precision::FP16:
      return "fp16";
    case Precision::INT8:
      s = "int8";
      break;
    case Precision::INT4:
      s = "int4";
      break;
    case Precision::FP8:
      s = "fp8";
      break;
  }
  s += ":" + (block == kPerTensor ? std::string("tensor") : std::to_string(block));
  if (rounding == Rounding::Stochastic) s += ":sr";
  return s;
}

double value_bytes(Precision p) {
  switch (p) {
    case Precision::FP32:
      return 4;
    case Precision::BF16:
    case Precision::FP16:
      return 2;
    case Precision::INT8:
    case Precision::FP8:
      return 1;
    case Precision::INT4:
      return 0.5;
  }
  return 4;
}

int64_t quantized_bytes(int64_t n, const QuantSpec& s) {
  if (!s.is_block()) return int64_t(value_bytes(s.precision) * double(n));
  const int64_t blocks = (n + s.block - 1) / s.block;
  const int64_t values = s.precision == Precision::INT4 ? (n + 1) / 2 : n;
  return values + 4 * blocks;
}

namespace {

#if defined(__AVX2__)
// f32_to_bf16 lane by lane, as int32 holding the 16-bit pattern.
inline __m256i bf16_nearest8(const float* x) {
  const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                            _mm256_set1_epi32(0x7f800000));
  const __m256i r = _mm256_srli_epi32(
      _mm256_add_epi32(
          u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                              _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)))),
      16);
  const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(r, nan, is_nan);
}

// out = v (+ out when accumulating): plain multiply then add, never fused.
inline void put8(float* out, __m256 v, bool accumulate) {
  if (accumulate) v = _mm256_add_ps(_mm256_loadu_ps(out), v);
  _mm256_storeu_ps(out, v);
}
#endif

void narrow_bf16(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
#if defined(__AVX2__)
  for (; i + 16 <= n; i += 16) {
    const __m256i p = _mm256_packus_epi32(bf16_nearest8(x + i), bf16_nearest8(x + i + 8));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_permute4x64_epi64(p, 0xd8));
  }
#endif
  for (; i < n; ++i) out[i] = f32_to_bf16(x[i]);
}

void narrow_f16(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__F16C__)
  // F16C rounds to nearest even like f32_to_f16 (subnormals and overflow to
  // infinity included); only NaN payloads differ, so NaN becomes 0x7e00.
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    if (_mm256_movemask_ps(nan)) {
      const __m128i n16 = _mm_packs_epi32(_mm256_castsi256_si128(_mm256_castps_si256(nan)),
                                          _mm256_extracti128_si256(_mm256_castps_si256(nan), 1));
      const __m128i sign = _mm_and_si128(h, _mm_set1_epi16(int16_t(0x8000)));
      h = _mm_blendv_epi8(h, _mm_or_si128(sign, _mm_set1_epi16(0x7e00)), n16);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
#endif
  for (; i < n; ++i) out[i] = f32_to_f16(x[i]);
}

}  // namespace

void narrow(const float* src, int64_t n, DType to, void* dst) {
  switch (to) {
    case DType::F32:
      if (dst != src) std::memmove(dst, src, size_t(n) * 4);
      return;
    case DType::BF16:
      narrow_bf16(src, n, static_cast<uint16_t*>(dst));
      return;
    case DType::F16:
      narrow_f16(src, n, static_cast<uint16_t*>(dst));
      return;
    case DType::I32:
      break;
  }
  throw std::logic_error("narrow: i32 is not a float format");
}

void widen(const void* src, DType from, int64_t n, float* dst, bool accumulate) {
  // Not out * 0 + v when overwriting: the buffer may hold NaN.
  auto put = [accumulate](float& o, float v) { o = accumulate ? o + v : v; };
  int64_t i = 0;
  switch (from) {
    case DType::F32: {
      const float* s = static_cast<const float*>(src);
      if (!accumulate) {
        if (s != dst) std::memmove(dst, s, size_t(n) * 4);
        return;
      }
      for (; i < n; ++i) put(dst[i], s[i]);
      return;
    }
    case DType::BF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
#if defined(__AVX2__)
      for (; i + 8 <= n; i += 8) {
        const __m256i h =
            _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
        put8(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)), accumulate);
      }
#endif
      for (; i < n; ++i) put(dst[i], bf16_to_f32(s[i]));
      return;
    }
    case DType::F16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
#if defined(__AVX2__) && defined(__F16C__)
      for (; i + 8 <= n; i += 8)
        put8(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))),
             accumulate);
#endif
      for (; i < n; ++i) put(dst[i], f16_to_f32(s[i]));
      return;
    }
    case DType::I32:
      break;
  }
  throw std::logic_error("widen: i32 is not a float format");
}

}  // namespace ss
