#include "comm/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

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

}  // namespace

std::string QuantSpec::str() const {
  std::string s;
  switch (precision) {
    case Precision::FP32: return "fp32";
    case Precision::BF16: return "bf16";
    case Precision::FP16: return "fp16";
    case Precision::INT8: s = "int8"; break;
    case Precision::INT4: s = "int4"; break;
    case Precision::FP8: s = "fp8"; break;
  }
  s += ":" + std::to_string(block);
  if (rounding == Rounding::Stochastic) s += ":sr";
  return s;
}

QuantSpec parse_quant_spec(const std::string& text) {
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
    throw UsageError("unknown precision '" + name + "' in '" + text + "'; use fp32, bf16, fp16, int8, int4 or fp8");
  while (!rest.empty()) {
    std::string part = rest.substr(0, rest.find(':'));
    rest = rest.find(':') == std::string::npos ? "" : rest.substr(rest.find(':') + 1);
    if (part == "sr") s.rounding = Rounding::Stochastic;
    else if (part == "rn") s.rounding = Rounding::Nearest;
    else {
      long long b = 0;
      try {
        size_t used = 0;
        b = std::stoll(part, &used);
        if (used != part.size()) throw std::invalid_argument(part);
      } catch (...) {
        throw UsageError("'" + part + "' in '" + text + "' is neither a block size nor sr/rn");
      }
      if (b < 1 || b > (1 << 20))
        throw UsageError("block size " + part + " in '" + text + "' must be between 1 and 1048576 (e.g. 128)");
      if (!s.is_block()) throw UsageError("'" + text + "': " + name + " is a plain cast and takes no block size");
      s.block = int(b);
    }
  }
  return s;
}

QuantSpec CommPrecision::at(const std::string& site, int layer) const {
  QuantSpec out;
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

CommPrecision parse_comm_precision(const std::string& text) {
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
          throw UsageError("layer range '" + range + "' in '" + item + "' must look like 0-11");
      }
      if (where != "all" && where != "attn" && where != "mlp" && where != "mixer")
        throw UsageError("unknown all-reduce site '" + where + "' in '" + item + "'; sites are attn, mlp, mixer, all");
      r.site = where;
    }
    r.spec = parse_quant_spec(spec);
    p.rules.push_back(r);
    if (comma == text.size()) break;
  }
  return p;
}

double value_bytes(Precision p) {
  switch (p) {
    case Precision::FP32: return 4;
    case Precision::BF16:
    case Precision::FP16: return 2;
    case Precision::INT8:
    case Precision::FP8: return 1;
    case Precision::INT4: return 0.5;
  }
  return 4;
}

int64_t quantized_bytes(int64_t n, const QuantSpec& s) {
  if (!s.is_block()) return int64_t(value_bytes(s.precision) * double(n));
  const int64_t blocks = (n + s.block - 1) / s.block;
  const int64_t values = s.precision == Precision::INT4 ? (n + 1) / 2 : n;
  return values + 4 * blocks;
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

}  // namespace

// Block formats store the blocks' fp32 scales first (4-byte aligned), then
// the values. The loops are written per format so the compiler vectorises them.
void quantize_values(const float* x, int64_t n, const QuantSpec& s, uint64_t counter0, uint8_t* out) {
  switch (s.precision) {
    case Precision::FP32: std::memcpy(out, x, size_t(n) * 4); return;
    case Precision::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_bf16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case Precision::FP16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_f16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
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
    float amax = 0;
    for (int64_t i = i0; i < i1; ++i) amax = std::max(amax, std::fabs(x[i]));
    // At least FLT_MIN: a subnormal scale (blocks below qmax * FLT_MIN) has an
    // infinite reciprocal, which would turn the block's zeros into NaN.
    const float scale = amax > 0 ? std::max(amax / qm, std::numeric_limits<float>::min()) : 1.0f;
    scales[b] = scale;
    const float inv = 1.0f / scale;
    if (s.precision == Precision::INT8 && !sr) {
      int8_t* q = reinterpret_cast<int8_t*>(values);
      for (int64_t i = i0; i < i1; ++i) q[i] = int8_t(std::clamp(std::nearbyint(x[i] * inv), -qm, qm));
    } else if (s.precision == Precision::INT4 && !sr) {
      // Two values per byte, low nibble first; blocks start on any element.
      for (int64_t i = i0; i < i1; ++i) {
        const int q = int(std::clamp(std::nearbyint(x[i] * inv), -qm, qm));
        values[i >> 1] |= uint8_t((q & 0xf) << ((i & 1) << 2));
      }
    } else if (s.precision == Precision::FP8 && !sr) {
      for (int64_t i = i0; i < i1; ++i) values[i] = e4m3_nearest(x[i] * inv);
    } else {
      for (int64_t i = i0; i < i1; ++i) {
        const float u = sr ? uniform(s.seed, counter0 + uint64_t(i)) : 0.5f;
        const float v = x[i] * inv;
        if (s.precision == Precision::FP8) {
          values[i] = f32_to_e4m3(v, u);
        } else {
          const float q = std::clamp(round_int(v, u, s.rounding), -qm, qm);
          if (s.precision == Precision::INT8) values[i] = uint8_t(int8_t(q));
          else values[i / 2] |= uint8_t((int(q) & 0xf) << (4 * (i & 1)));
        }
      }
    }
  }
}

void dequantize_values(const uint8_t* in, int64_t n, const QuantSpec& s, float* out, bool accumulate) {
  switch (s.precision) {
    case Precision::FP32:
      for (int64_t i = 0; i < n; ++i) {
        float v;
        std::memcpy(&v, in + 4 * i, 4);
        out[i] = (accumulate ? out[i] : 0.0f) + v;  // not out * 0: the buffer may hold NaN
      }
      return;
    case Precision::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, in + 2 * i, 2);
        out[i] = (accumulate ? out[i] : 0.0f) + bf16_to_f32(h);
      }
      return;
    case Precision::FP16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, in + 2 * i, 2);
        out[i] = (accumulate ? out[i] : 0.0f) + f16_to_f32(h);
      }
      return;
    default: break;
  }
  const int64_t nblocks = (n + s.block - 1) / s.block;
  const float* scales = reinterpret_cast<const float*>(in);
  const uint8_t* values = in + 4 * nblocks;
  const float* table = e4m3_table().v;
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t i0 = b * s.block, i1 = std::min(n, i0 + s.block);
    const float scale = scales[b];
    if (!accumulate) std::fill(out + i0, out + i1, 0.0f);
    if (s.precision == Precision::INT8) {
      const int8_t* q = reinterpret_cast<const int8_t*>(values);
      for (int64_t i = i0; i < i1; ++i) out[i] += float(q[i]) * scale;
    } else if (s.precision == Precision::INT4) {
      for (int64_t i = i0; i < i1; ++i) {
        // Sign-extend the nibble: shift it to the top of an int8, then back.
        const int8_t q = int8_t(uint8_t(values[i >> 1] << (4 - ((i & 1) << 2)))) >> 4;
        out[i] += float(q) * scale;
      }
    } else {
      for (int64_t i = i0; i < i1; ++i) out[i] += table[values[i]] * scale;
    }
  }
}

}  // namespace ss
