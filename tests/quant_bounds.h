// Error bounds of block quantization (comm/quantize.h), shared by the codec's
// suite (tst_quant) and the quantized all-reduce's (tst_quant_mpi). Written
// from the formats' definitions, not from the codec under test.
//
// A block of absmax A has the scale s = max(A / qmax, FLT_MIN); one step at
// an element of magnitude a is
//   int8 / int4   s                                (qmax 127, 7)
//   fp8-e4m3      s sp(a / s), sp the e4m3 spacing (qmax 448)
//   bf16 / fp16   an ulp of the cast at a          (no blocks, no scale)
// and rounding to a level is off by at most half a step (nearest) or less
// than a whole one (stochastic).
#pragma once

#include <QMetaType>
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "comm/quantize.h"

Q_DECLARE_METATYPE(ss::Precision)
Q_DECLARE_METATYPE(ss::Rounding)

namespace quant_bounds {

// The relative slack of a bound, of one step: the scale, its reciprocal and
// the dequantized product are each rounded once in f32.
constexpr double kSlack = 1e-4;

inline double qmax(ss::Precision p) {
  switch (p) {
    case ss::Precision::INT8:
      return 127;
    case ss::Precision::INT4:
      return 7;
    case ss::Precision::FP8:
      return 448;
    default:
      return 1;
  }
}

// The spacing of e4m3 values at magnitude v (v <= 448).
inline double e4m3_spacing(double v) {
  if (v < std::ldexp(1.0, -6)) return std::ldexp(1.0, -9);
  return std::ldexp(1.0, int(std::floor(std::log2(v))) - 3);
}

// An ulp of a cast at magnitude a (its subnormal spacing below the normal range).
inline double cast_ulp(ss::Precision p, double a) {
  if (p == ss::Precision::BF16) return std::max(std::ldexp(a, -7), std::ldexp(1.0, -133));
  return std::max(std::ldexp(a, -10), std::ldexp(1.0, -24));
}

// The scale of a block of absmax `amax`: A / qmax, never below FLT_MIN, so
// that its reciprocal stays finite (blocks of subnormal values are measured
// in FLT_MIN steps).
inline double block_scale(ss::Precision p, double amax) {
  return std::max(amax / qmax(p), double(FLT_MIN));
}

// One step at magnitude a in a block of the given scale (unused by the
// casts): the distance between the two levels around a; 0 for fp32.
inline double step(ss::Precision p, double scale, double a) {
  switch (p) {
    case ss::Precision::INT8:
    case ss::Precision::INT4:
      return scale;
    case ss::Precision::FP8:
      return scale * e4m3_spacing(std::min(a / scale, 448.0));
    case ss::Precision::BF16:
    case ss::Precision::FP16:
      return cast_ulp(p, a);
    case ss::Precision::FP32:
      return 0;
  }
  return 0;
}

// The largest rounding error, in steps: a whole step for stochastic rounding
// of a block format, half a step otherwise.
inline double error_steps(const ss::QuantSpec& s) {
  return s.is_block() && s.rounding == ss::Rounding::Stochastic ? 1.0 : 0.5;
}

inline ss::QuantSpec spec_of(ss::Precision p, int block = 128,
                             ss::Rounding r = ss::Rounding::Nearest, uint64_t seed = 0) {
  ss::QuantSpec s;
  s.precision = p;
  s.block = block;
  s.rounding = r;
  s.seed = seed;
  return s;
}

}  // namespace quant_bounds
