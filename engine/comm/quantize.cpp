#include "comm/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "core/dtype.h"
#include "core/error.h"

namespace ss {
namespace {

// Uniform in [0, 1) from a counter (splitmix64), for stochastic rounding.
float uniform(uint64_t seed, uint64_t counter) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + counter + 0x632be59bd9b4e019ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return float(x >> 40) * 0x1p-24f;
}

float qmax(Precision p) {
  switch (p) {
    case Precision::INT8: return 127.0f;
    case Precision::INT4: return 7.0f;
    case Precision::FP8: return 448.0f;
    default: return 1.0f;
  }
}

// Rounds v to an integer: nearest (ties away from zero), or down/up with the
// probabilities that make the expectation v.
float round_int(float v, float u, Rounding r) {
  if (r == Rounding::Nearest) return std::round(v);
  const float f = std::floor(v);
  return (v - f) > u ? f + 1.0f : f;
}

// Bad input's one line, named for the option that gave it where there is one.
UsageError refusal(std::string_view option, const std::string& why) {
  return UsageError(option.empty() ? why : std::string(option) + ": " + why);
}

}  // namespace

QuantSpec parse_quant_spec(const std::string& text, std::string_view option) {
  QuantSpec s;
  std::string name = text, rest;
  if (auto c = text.find(':'); c != std::string::npos) {
    name = text.substr(0, c);
    rest = text.substr(c + 1);
  }
  if (name == "fp32") s.precision = Precision::FP32;
  else if (name == "bf16") s.precision = Precision::BF16;
  else if (name == "fp16") s.precision = Precision::FP16;
  else if (name == "int8") s.precision = Precision::INT8;
  else if (name == "int4") s.precision = Precision::INT4;
  else if (name == "fp8" || name == "fp8e4m3" || name == "e4m3") s.precision = Precision::FP8;
  else
    throw refusal(option, "unknown precision '" + name + "'" + (text == name ? "" : " in '" + text + "'") +
                              "; use fp32, bf16, fp16, int8, int4 or fp8");
  while (!rest.empty()) {
    std::string part = rest.substr(0, rest.find(':'));
    rest = rest.find(':') == std::string::npos ? "" : rest.substr(rest.find(':') + 1);
    if (part == "sr") s.rounding = Rounding::Stochastic;
    else if (part == "rn") s.rounding = Rounding::Nearest;
    else if (part == "tensor") {
      if (!s.is_block()) throw refusal(option, "'" + text + "': " + name + " is a plain cast and takes no block size");
      s.block = QuantSpec::kPerTensor;
    } else {
      long long b = 0;
      try {
        size_t used = 0;
        b = std::stoll(part, &used);
        if (used != part.size()) throw std::invalid_argument(part);
      } catch (...) {
        throw refusal(option, "'" + part + "' in '" + text + "' is neither a block size, tensor, nor sr/rn");
      }
      if (b < 1 || b > (1 << 20))
        throw refusal(option, "block size " + part + " in '" + text + "' must be between 1 and 1048576 (e.g. 128)");
      if (!s.is_block()) throw refusal(option, "'" + text + "': " + name + " is a plain cast and takes no block size");
      s.block = int(b);
    }
  }
  return s;
}

QuantSpec CommPrecision::at(const std::string& site, int layer, Precision native) const {
  QuantSpec out;
  out.precision = native;
  for (const auto& r : rules)
    if ((r.site == "all" || r.site == site) && layer >= r.first && layer <= r.last) out = r.spec;
  return out;
}

bool CommPrecision::quantizes() const {
  for (const auto& r : rules)
    if (!r.spec.is_plain()) return true;
  return false;
}

std::string CommPrecision::str() const {
  std::string out;
  for (const auto& r : rules) {
    if (!out.empty()) out += ",";
    out += r.site;
    if (r.first != 0 || r.last != (1 << 30)) out += "@" + std::to_string(r.first) + "-" + std::to_string(r.last);
    out += "=" + r.spec.str();
  }
  return out.empty() ? "fp32" : out;
}

CommPrecision parse_comm_precision(const std::string& text, std::string_view option) {
  CommPrecision p;
  size_t at = 0;
  while (at <= text.size() && !text.empty()) {
    size_t comma = text.find(',', at);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(at, comma - at);
    at = comma + 1;
    if (item.empty()) continue;
    SitePrecision r;
    std::string spec = item;
    if (auto eq = item.find('='); eq != std::string::npos) {
      std::string where = item.substr(0, eq);
      spec = item.substr(eq + 1);
      if (auto a = where.find('@'); a != std::string::npos) {
        const std::string range = where.substr(a + 1);
        where = where.substr(0, a);
        if (std::sscanf(range.c_str(), "%d-%d", &r.first, &r.last) != 2 || r.first < 0 || r.last < r.first)
          throw refusal(option, "layer range '" + range + "' in '" + item + "' must look like 0-11");
      }
      if (where != "all" && where != "attn" && where != "mlp" && where != "mixer")
        throw refusal(option,
                      "unknown all-reduce site '" + where + "' in '" + item + "'; sites are attn, mlp, mixer, all");
      r.site = where;
    }
    r.spec = parse_quant_spec(spec, option);
    p.rules.push_back(r);
    if (comma == text.size()) break;
  }
  return p;
}

uint8_t f32_to_e4m3(float v, float u) {
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  float a = std::fabs(v);
  if (std::isnan(v)) return 0x7f;
  a = std::min(a, 448.0f);
  if (a == 0) return sign;
  int e;
  std::frexp(a, &e);        // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1;          // a = 1.f * 2^exp
  exp = std::max(exp, -6);  // subnormals share the smallest exponent
  const float step = std::ldexp(1.0f, exp - 3);  // spacing of representable values here
  float q = a / step;                            // in [8, 16) for normals, [0, 8) subnormal
  q = u == 0.5f ? std::nearbyint(q) : std::floor(q) + ((q - std::floor(q)) > u ? 1.0f : 0.0f);
  float r = q * step;
  r = std::min(r, 448.0f);
  // Encode r exactly.
  if (r == 0) return sign;
  int re;
  std::frexp(r, &re);
  int rexp = std::max(re - 1, -6);
  int mant = int(std::lround(r / std::ldexp(1.0f, rexp - 3)));  // 8..15 normal, 1..7 subnormal
  if (mant >= 16) {
    ++rexp;
    mant /= 2;
  }
  if (mant < 8) return uint8_t(sign | (mant & 7));  // subnormal: exponent field 0
  return uint8_t(sign | ((rexp + 7) << 3) | (mant & 7));
}

float e4m3_to_f32(uint8_t b) {
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  const int e = (b >> 3) & 0xf, m = b & 7;
  if (e == 0xf && m == 7) return NAN;
  if (e == 0) return sign * std::ldexp(float(m), -9);  // m/8 * 2^-6
  return sign * std::ldexp(float(8 + m), e - 7 - 3);
}

namespace {

// Fast e4m3 encoding of |v| <= 448 by bit manipulation, round-to-nearest-even
// on the float's mantissa (normals), or on the subnormal grid of 2^-9.
inline uint8_t e4m3_nearest(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  const uint8_t sign = uint8_t((u >> 24) & 0x80);
  u &= 0x7fffffffu;
  if (u < 0x3c800000u) {  // below 2^-6: subnormal grid m * 2^-9, m in 0..8
    float a;
    std::memcpy(&a, &u, 4);
    const int m = int(std::nearbyint(a * 512.0f));
    return uint8_t(sign | (m >= 8 ? 0x08 : m));  // m = 8 is the smallest normal
  }
  u += 0x7ffffu + ((u >> 20) & 1u);  // round the 23-bit mantissa to 3 bits
  int exp = int(u >> 23) - 127 + 7;
  const uint32_t mant = (u >> 20) & 7u;
  if (exp > 15 || (exp == 15 && mant == 7)) return uint8_t(sign | 0x7e);  // clamp to 448
  return uint8_t(sign | (exp << 3) | mant);
}

struct E4m3Table {
  float v[256];
  E4m3Table() {
    for (int i = 0; i < 256; ++i) v[i] = e4m3_to_f32(uint8_t(i));
  }
};
const E4m3Table& e4m3_table() {
  static const E4m3Table t;
  return t;
}

// The round-to-nearest kernels below come in two forms that give the same
// bytes: AVX2 (the engine's x86-64-v3 build) over whole vectors, and the
// plain loops, which do the remainders and every other build. Each vector
// step is the scalar one lane by lane: |x| and max (NaN ignored, as
// std::max(amax, |x|) does), x * inv, round half to even (nearbyint in the
// default rounding mode), clamp, convert; casts and e4m3 by the same bit
// arithmetic as f32_to_bf16 / e4m3_nearest.

#if defined(__AVX2__)
inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// 32 int32 lanes (a, b, c, d in order, each 8) saturated to 32 int8 in order.
inline __m256i pack_i8(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
  return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
// The same for values in 0..255 (fp8 codes).
inline __m256i pack_u8(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i p = _mm256_packus_epi16(_mm256_packus_epi32(a, b), _mm256_packus_epi32(c, d));
  return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
// 8 int32 lanes (0..255) to 8 bytes.
inline void store8_u8(uint8_t* out, __m256i a) {
  __m128i p = _mm_packus_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm_packus_epi16(p, p));
}

// round(x * inv) as int32: the conversion rounds in the current rounding
// mode, as nearbyint does (half to even by default).
inline __m256i int_nearest8(const float* x, __m256 inv) {
  return _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), inv));
}
// 32 values rounded and clamped to [-qm, qm], as int8 in order. Packing
// saturates to [-128, 127] and the byte clamp finishes the job, which is the
// float clamp of the definition for every |x * inv| < 2^31 (a block's values
// are at most qmax times (1 + 1e-7) in steps of its scale).
inline __m256i int_nearest32(const float* x, __m256 inv, __m256i lo, __m256i hi) {
  const __m256i b = pack_i8(int_nearest8(x, inv), int_nearest8(x + 8, inv), int_nearest8(x + 16, inv),
                            int_nearest8(x + 24, inv));
  return _mm256_min_epi8(_mm256_max_epi8(b, lo), hi);
}

// e4m3_nearest of x * inv, lane by lane, as int32 codes.
inline __m256i e4m3_nearest8(const float* x, __m256 inv) {
  const __m256i u0 = _mm256_castps_si256(_mm256_mul_ps(_mm256_loadu_ps(x), inv));
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u0, 24), _mm256_set1_epi32(0x80));
  const __m256i u = _mm256_and_si256(u0, _mm256_set1_epi32(0x7fffffff));
  // Subnormal grid: m = nearbyint(|v| * 512), 0..8 (8 is the smallest normal's code).
  const __m256i sub = _mm256_min_epi32(
      _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_castsi256_ps(u), _mm256_set1_ps(512.0f))), _mm256_set1_epi32(8));
  // Normals: round the mantissa to 3 bits, re-bias the exponent, clamp to 448 (code 0x7e).
  const __m256i r = _mm256_add_epi32(
      u, _mm256_add_epi32(_mm256_set1_epi32(0x7ffff), _mm256_and_si256(_mm256_srli_epi32(u, 20), _mm256_set1_epi32(1))));
  const __m256i exp = _mm256_sub_epi32(_mm256_srli_epi32(r, 23), _mm256_set1_epi32(127 - 7));
  const __m256i code = _mm256_min_epi32(
      _mm256_or_si256(_mm256_slli_epi32(exp, 3), _mm256_and_si256(_mm256_srli_epi32(r, 20), _mm256_set1_epi32(7))),
      _mm256_set1_epi32(0x7e));
  const __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x3c800000), u);
  return _mm256_or_si256(_mm256_blendv_epi8(code, sub, is_sub), sign);
}

// out = v (+ out when accumulating): plain multiply then add, never fused.
inline void put8(float* out, __m256 v, bool accumulate) {
  if (accumulate) v = _mm256_add_ps(_mm256_loadu_ps(out), v);
  _mm256_storeu_ps(out, v);
}

// e4m3 code (low byte of each int32 lane) to float: the code's exponent and
// mantissa bits placed in an f32 and scaled by 2^(127-7) give normals and
// subnormals alike; 0x7f / 0xff are NaN.
inline __m256 e4m3_decode8(__m256i b) {
  const __m256i mag = _mm256_and_si256(b, _mm256_set1_epi32(0x7f));
  __m256 v = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(mag, 20)), _mm256_set1_ps(0x1p120f));
  v = _mm256_blendv_ps(v, _mm256_set1_ps(NAN), _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7f))));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24);
  return _mm256_or_ps(v, _mm256_castsi256_ps(sign));
}
#endif

float block_absmax(const float* x, int64_t n) {
  float amax = 0;
  int64_t i = 0;
#if defined(__AVX2__)
  if (n >= 8) {
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 32 <= n; i += 32) {
      a0 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), abs), a0);
      a1 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i + 8), abs), a1);
      a2 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i + 16), abs), a2);
      a3 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i + 24), abs), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), abs), a0);
    amax = hmax8(_mm256_max_ps(_mm256_max_ps(a0, a1), _mm256_max_ps(a2, a3)));
  }
#endif
  for (; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
}

#if defined(__AVX2__)
// x * m for 4 uint64 lanes and a constant m, mod 2^64 (AVX2 has no 64-bit
// multiply): the low product plus the two cross products shifted up.
inline __m256i mul64(__m256i x, uint64_t m) {
  const __m256i ml = _mm256_set1_epi64x(int64_t(m & 0xffffffffu)), mh = _mm256_set1_epi64x(int64_t(m >> 32));
  const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(x, 32), ml), _mm256_mul_epu32(x, mh));
  return _mm256_add_epi64(_mm256_mul_epu32(x, ml), _mm256_slli_epi64(cross, 32));
}
// uniform(seed, counter) of 4 counters: splitmix64's finaliser, top 24 bits,
// as int32 in the low half of each 64-bit lane.
inline __m256i uniform_bits4(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi64(x, 30));
  x = mul64(x, 0xbf58476d1ce4e5b9ull);
  x = _mm256_xor_si256(x, _mm256_srli_epi64(x, 27));
  x = mul64(x, 0x94d049bb133111ebull);
  x = _mm256_xor_si256(x, _mm256_srli_epi64(x, 31));
  return _mm256_srli_epi64(x, 40);
}
// The uniforms of counters c0 + 0..7, in order, as floats in [0, 1).
inline __m256 uniform8(uint64_t c0) {
  const __m256i base = _mm256_set1_epi64x(int64_t(c0));
  const __m256i a = uniform_bits4(_mm256_add_epi64(base, _mm256_setr_epi64x(0, 1, 2, 3)));
  const __m256i b = uniform_bits4(_mm256_add_epi64(base, _mm256_setr_epi64x(4, 5, 6, 7)));
  // dwords a0 b0 a1 b1 | a2 b2 a3 b3, then into order.
  const __m256i ab = _mm256_blend_epi32(a, _mm256_slli_epi64(b, 32), 0xaa);
  const __m256i r = _mm256_permutevar8x32_epi32(ab, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(r), _mm256_set1_ps(0x1p-24f));
}
// round_int(x * inv, u, Stochastic) clamped to [-qm, qm], as int32: down,
// or up when the fraction exceeds u.
inline __m256i int_stochastic8(const float* x, __m256 inv, __m256 lo, __m256 hi, uint64_t c0) {
  const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x), inv);
  const __m256 f = _mm256_floor_ps(v);
  const __m256 up = _mm256_cmp_ps(_mm256_sub_ps(v, f), uniform8(c0), _CMP_GT_OQ);
  const __m256 q = _mm256_add_ps(f, _mm256_and_ps(up, _mm256_set1_ps(1.0f)));
  return _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(q, lo), hi));
}
#endif

// Integer block formats, values x[i0, i1) of the buffer at scale 1 / inv,
// rounded to nearest or stochastically with uniform(seed, counter0 + i).
// int8: byte i. int4: element i is the low (even i) or high nibble of byte
// i / 2; the bytes start zeroed, and a byte shared with a neighbouring block
// is or-ed in.
void int_block(const float* x, int64_t i0, int64_t i1, float inv, const QuantSpec& s, uint64_t counter0,
               uint8_t* values) {
  const bool int4 = s.precision == Precision::INT4, sr = s.rounding == Rounding::Stochastic;
  const float qm = int4 ? 7.0f : 127.0f;
  auto one = [&](int64_t i) {
    const float v = x[i] * inv;
    const float q =
        std::clamp(sr ? round_int(v, uniform(s.seed, counter0 + uint64_t(i)), s.rounding) : std::nearbyint(v), -qm, qm);
    if (int4) values[i >> 1] |= uint8_t((int(q) & 0xf) << ((i & 1) << 2));
    else values[i] = uint8_t(int8_t(q));
  };
  int64_t i = i0;
#if defined(__AVX2__)
  if (i1 - i0 >= 33) {
    if (int4 && (i & 1)) one(i++);
    const __m256 vinv = _mm256_set1_ps(inv), flo = _mm256_set1_ps(-qm), fhi = _mm256_set1_ps(qm);
    const __m256i lo = _mm256_set1_epi8(int8_t(-qm)), hi = _mm256_set1_epi8(int8_t(qm));
    const uint64_t c = s.seed * 0x9e3779b97f4a7c15ull + counter0 + 0x632be59bd9b4e019ull;  // as in uniform()
    for (; i + 32 <= i1; i += 32) {
      // 32 values, rounded and clamped, as int8 in order.
      __m256i b;
      if (sr)
        b = pack_i8(int_stochastic8(x + i, vinv, flo, fhi, c + uint64_t(i)),
                    int_stochastic8(x + i + 8, vinv, flo, fhi, c + uint64_t(i) + 8),
                    int_stochastic8(x + i + 16, vinv, flo, fhi, c + uint64_t(i) + 16),
                    int_stochastic8(x + i + 24, vinv, flo, fhi, c + uint64_t(i) + 24));
      else
        b = int_nearest32(x + i, vinv, lo, hi);
      if (!int4) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(values + i), b);
        continue;
      }
      // Each pair (e0, e1) of bytes, read as one int16 e0 | e1 << 8, becomes
      // (e0 & 15) | (e1 & 15) << 4.
      const __m256i w = _mm256_or_si256(_mm256_and_si256(b, _mm256_set1_epi16(0x0f)),
                                        _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi16(0xf0)));
      const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi16(w, w), 0x08);  // qwords 0 and 2
      _mm_storeu_si128(reinterpret_cast<__m128i*>(values + (i >> 1)), _mm256_castsi256_si128(p));
    }
  }
#endif
  for (; i < i1; ++i) one(i);
}

void fp8_nearest(const float* x, int64_t n, float inv, uint8_t* q) {
  int64_t i = 0;
#if defined(__AVX2__)
  const __m256 vinv = _mm256_set1_ps(inv);
  for (; i + 32 <= n; i += 32)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i),
                        pack_u8(e4m3_nearest8(x + i, vinv), e4m3_nearest8(x + i + 8, vinv),
                                e4m3_nearest8(x + i + 16, vinv), e4m3_nearest8(x + i + 24, vinv)));
  for (; i + 8 <= n; i += 8) store8_u8(q + i, e4m3_nearest8(x + i, vinv));
#endif
  for (; i < n; ++i) q[i] = e4m3_nearest(x[i] * inv);
}

}  // namespace

// Block formats store the blocks' fp32 scales first (4-byte aligned), then
// the values.
void quantize_values(const float* x, int64_t n, const QuantSpec& s, uint64_t counter0, uint8_t* out) {
  switch (s.precision) {
    case Precision::FP32: std::memcpy(out, x, size_t(n) * 4); return;
    case Precision::BF16: narrow(x, n, DType::BF16, out); return;
    case Precision::FP16: narrow(x, n, DType::F16, out); return;
    default: break;
  }
  const bool sr = s.rounding == Rounding::Stochastic;
  const float qm = qmax(s.precision);
  const int64_t nblocks = (n + s.block - 1) / s.block;
  float* scales = reinterpret_cast<float*>(out);
  uint8_t* values = out + 4 * nblocks;
  if (s.precision == Precision::INT4) std::memset(values, 0, size_t((n + 1) / 2));
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t i0 = b * s.block, i1 = std::min(n, i0 + s.block);
    const float amax = block_absmax(x + i0, i1 - i0);
    // At least FLT_MIN: a subnormal scale (blocks below qmax * FLT_MIN) has an
    // infinite reciprocal, which would turn the block's zeros into NaN.
    const float scale = amax > 0 ? std::max(amax / qm, std::numeric_limits<float>::min()) : 1.0f;
    scales[b] = scale;
    const float inv = 1.0f / scale;
    if (s.precision != Precision::FP8) {
      int_block(x, i0, i1, inv, s, counter0, values);
    } else if (!sr) {
      fp8_nearest(x + i0, i1 - i0, inv, values + i0);
    } else {
      for (int64_t i = i0; i < i1; ++i) values[i] = f32_to_e4m3(x[i] * inv, uniform(s.seed, counter0 + uint64_t(i)));
    }
  }
}

void dequantize_values(const uint8_t* in, int64_t n, const QuantSpec& s, float* out, bool accumulate) {
  // Not out * 0 + v when overwriting: the buffer may hold NaN.
  auto put = [accumulate](float& o, float v) { o = accumulate ? o + v : v; };
  int64_t i = 0;
  switch (s.precision) {
    case Precision::FP32: widen(in, DType::F32, n, out, accumulate); return;
    case Precision::BF16: widen(in, DType::BF16, n, out, accumulate); return;
    case Precision::FP16: widen(in, DType::F16, n, out, accumulate); return;
    default: break;
  }
  const int64_t nblocks = (n + s.block - 1) / s.block;
  const float* scales = reinterpret_cast<const float*>(in);
  const uint8_t* values = in + 4 * nblocks;
  const float* table = e4m3_table().v;
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t i0 = b * s.block, i1 = std::min(n, i0 + s.block);
    const float scale = scales[b];
    i = i0;
    if (s.precision == Precision::INT8) {
      const int8_t* q = reinterpret_cast<const int8_t*>(values);
#if defined(__AVX2__)
      const __m256 vs = _mm256_set1_ps(scale);
      for (; i + 8 <= i1; i += 8) {
        const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i)));
        put8(out + i, _mm256_mul_ps(_mm256_cvtepi32_ps(v), vs), accumulate);
      }
#endif
      for (; i < i1; ++i) put(out[i], float(q[i]) * scale);
    } else if (s.precision == Precision::INT4) {
      auto nibble = [&](int64_t k) {
        // Sign-extend the nibble: shift it to the top of an int8, then back.
        return int8_t(int8_t(uint8_t(values[k >> 1] << (4 - ((k & 1) << 2)))) >> 4);
      };
#if defined(__AVX2__)
      if (i1 - i >= 17) {
        if (i & 1) {
          put(out[i], float(nibble(i)) * scale);
          ++i;
        }
        const __m256 vs = _mm256_set1_ps(scale);
        for (; i + 16 <= i1; i += 16) {
          // 8 bytes: low nibbles are the even elements, high nibbles the odd.
          const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(values + (i >> 1)));
          const __m128i lo = _mm_srai_epi16(_mm_slli_epi16(_mm_unpacklo_epi8(bytes, bytes), 12), 12);
          // unpacklo(bytes, bytes) as int16 holds b | b << 8: << 12 keeps the
          // low nibble on top, >> 12 sign-extends it; the high nibble:
          const __m128i hi = _mm_srai_epi16(_mm_slli_epi16(_mm_unpacklo_epi8(bytes, bytes), 8), 12);
          // interleave even/odd elements: e0 = lo[0], e1 = hi[0], ...
          const __m128i e01 = _mm_unpacklo_epi16(lo, hi), e23 = _mm_unpackhi_epi16(lo, hi);
          put8(out + i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(e01)), vs), accumulate);
          put8(out + i + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(e23)), vs), accumulate);
        }
      }
#endif
      for (; i < i1; ++i) put(out[i], float(nibble(i)) * scale);
    } else {
#if defined(__AVX2__)
      const __m256 vs = _mm256_set1_ps(scale);
      for (; i + 8 <= i1; i += 8) {
        const __m256i b8 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(values + i)));
        put8(out + i, _mm256_mul_ps(e4m3_decode8(b8), vs), accumulate);
      }
#endif
      for (; i < i1; ++i) put(out[i], table[values[i]] * scale);
    }
  }
}

}  // namespace ss
