// Block quantization for communication: each block of B values is sent with
// one fp32 scale (absmax / qmax) and the values in int8, int4 (two per byte)
// or fp8-e4m3; bf16 and fp16 are plain casts. Rounding is to nearest or
// stochastic (seeded, counter-based: the same on every run and rank count).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"  // Precision, Rounding, QuantSpec, quantized_bytes

namespace ss {

// Precision per all-reduce site (attn: attention output, mlp: MLP output,
// mixer: Mamba/Mamba2 out_proj) and layer range. Written as a comma list of
// [site[@first-last]=]spec, e.g. "int8:128" (every site) or
// "attn=bf16,mlp@0-15=int8:128". Later rules win; unmatched sites stay fp32.
struct SitePrecision {
  std::string site = "all";
  int first = 0, last = 1 << 30;
  QuantSpec spec;
};
struct CommPrecision {
  std::vector<SitePrecision> rules;
  // The spec of a site and layer; where no rule matches, the plain cast
  // `native` (the run's own dtype: the unquantized all-reduce).
  QuantSpec at(const std::string& site, int layer, Precision native = Precision::FP32) const;
  bool quantizes() const;  // any rule other than fp32
  std::string str() const;
};
// Throws UsageError naming what to change, prefixed with `option` (the
// command-line option the text came from) where given.
CommPrecision parse_comm_precision(const std::string& text, std::string_view option = {});

// Parses "int8", "int8:128", "int4:64:sr", "fp8", "bf16", "fp16", "fp32";
// throws UsageError naming what to change (unknown precision, block 0 or > 1M),
// prefixed with `option` where given.
QuantSpec parse_quant_spec(const std::string& text, std::string_view option = {});

// Quantizes n values into out (quantized_bytes(n, s) bytes). `counter0` is
// the stochastic-rounding counter of x[0] (unique per element and call).
void quantize_values(const float* x, int64_t n, const QuantSpec& s, uint64_t counter0, uint8_t* out);
// Dequantizes n values from `in`; adds to out when accumulate.
void dequantize_values(const uint8_t* in, int64_t n, const QuantSpec& s, float* out, bool accumulate);

// fp8 e4m3 (OCP 8-bit floating point spec: 1 sign, 4 exponent bits, bias 7,
// 3 mantissa bits, max 448, no infinities).
uint8_t f32_to_e4m3(float v, float u = 0.5f);  // u in [0,1): 0.5 = nearest, uniform = stochastic
float e4m3_to_f32(uint8_t b);

}  // namespace ss
