// Block quantization for communication (comm/quantize.h), in one process:
// round-trip error bounds per format and rounding mode, the fp8-e4m3 codec
// against a brute-force search over its 256 codes, unbiasedness of stochastic
// rounding (byte counts and the --comm-precision parser: tst_quant_spec).
//
// Bounds, per element x of a block with absmax A (scale s = A / qmax):
//   int8 / int4   nearest |err| <= s/2, stochastic |err| < s   (s = A/127, A/7)
//   fp8-e4m3      nearest |err| <= s * sp(|x|/s) / 2, stochastic < s * sp(|x|/s),
//                 sp(v) = 2^(floor(log2 v) - 3) for normal v >= 2^-6, 2^-9 below
//   bf16 / fp16   nearest |err| <= 2^-8 |x| / 2^-11 |x| (half an ulp), normal range
// A block scale is never below FLT_MIN (A < qmax FLT_MIN happens only for
// blocks of values near the subnormal range); the bounds use that scale.
// Each bound gets a relative slack of kSlack of the step: the scale, its
// reciprocal and the dequantized product are each rounded once in f32, which
// moves a value by a few 1e-7 of the block's range, never by a visible part of
// a step.
#include <QtTest>
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "comm/quantize.h"
#include "core/error.h"
#include "core/dtype.h"
#include "quant_bounds.h"

using quant_bounds::e4m3_spacing;
using quant_bounds::kSlack;
using quant_bounds::qmax;
using quant_bounds::spec_of;
using ss::Precision;
using ss::QuantSpec;
using ss::Rounding;

namespace {

constexpr uint8_t kGuard = 0xA5;  // fills the bytes after the quantized payload
constexpr int kGuardBytes = 16;

bool is_nan_code(int c) {
  return (c & 0x7f) == 0x7f;
}

// Storage for quantized bytes: 4-byte aligned (scales come first), followed
// by guard bytes that must survive quantization.
struct Packed {
  std::vector<uint32_t> words;
  int64_t bytes = 0;
  uint8_t* data() { return reinterpret_cast<uint8_t*>(words.data()); }
  const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(words.data()); }
  bool guard_intact() const {
    for (int i = 0; i < kGuardBytes; ++i)
      if (data()[bytes + i] != kGuard) return false;
    return true;
  }
  bool operator==(const Packed& o) const {
    return bytes == o.bytes && std::memcmp(data(), o.data(), size_t(bytes)) == 0;
  }
};

Packed quantize(const std::vector<float>& x, const QuantSpec& s, uint64_t counter = 0) {
  Packed p;
  p.bytes = ss::quantized_bytes(int64_t(x.size()), s);
  p.words.resize(size_t((p.bytes + kGuardBytes + 3) / 4));
  std::memset(p.data(), kGuard, p.words.size() * 4);
  ss::quantize_values(x.data(), int64_t(x.size()), s, counter, p.data());
  return p;
}

std::vector<float> dequantize(const Packed& p, int64_t n, const QuantSpec& s) {
  std::vector<float> out(size_t(n), -12345.0f);
  ss::dequantize_values(p.data(), n, s, out.data(), false);
  return out;
}

// Values of a named pattern: `mixed` (signs, ~10% zeros, magnitudes over six
// decades inside each block), `zero-block` (mixed with the second block all
// zeros), `zeros`, `huge` (up to 3e38), `tiny` (around 1e-30), `ramp`
// (-1..1 evenly, so many values sit between levels).
std::vector<float> pattern(const QString& name, int64_t n, int block, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double g = normal(rng);
    const double decade = std::pow(10.0, -3.0 + 6.0 * uni(rng));
    double v = 0;
    if (name == "mixed" || name == "zero-block")
      v = uni(rng) < 0.1 ? 0.0 : g * decade;
    else if (name == "huge")
      v = std::clamp(g * 1e37 * decade / 1e3, -3e38, 3e38);
    else if (name == "tiny")
      v = g * 1e-30 * decade;
    else if (name == "ramp")
      v = n == 1 ? 0.3 : -1.0 + 2.0 * double(i) / double(n - 1);
    x[size_t(i)] = float(v);
  }
  if (name == "zero-block")
    for (int64_t i = block; i < std::min<int64_t>(n, 2 * int64_t(block)); ++i) x[size_t(i)] = 0;
  if (name == "huge" && n > 0) x[0] = 3.0e38f;  // the largest magnitude of the test
  return x;
}

// The bound on |dequantize(quantize(x)) - x| for element i (see the header).
struct Bound {
  const std::vector<float>& x;
  const QuantSpec& s;
  std::vector<double> amax;  // per block

  Bound(const std::vector<float>& xs, const QuantSpec& spec) : x(xs), s(spec) {
    if (!s.is_block()) return;
    const int64_t n = int64_t(x.size());
    amax.assign(size_t((n + s.block - 1) / s.block), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      double& a = amax[size_t(i / s.block)];
      a = std::max(a, double(std::fabs(x[size_t(i)])));
    }
  }
  // The block's scale (bf16 and fp16 have none).
  double scale(int64_t i) const {
    return s.is_block() ? quant_bounds::block_scale(s.precision, amax[size_t(i / s.block)]) : 0.0;
  }
  // One step at element i: the distance between the two levels around it.
  double step(int64_t i) const {
    return quant_bounds::step(s.precision, scale(i), std::fabs(double(x[size_t(i)])));
  }
  double at(int64_t i) const {
    const double st = step(i);
    return quant_bounds::error_steps(s) * st + kSlack * st;
  }
};

}  // namespace

class TestQuant : public QObject {
  Q_OBJECT

 private slots:
  // --- round trip ----------------------------------------------------------

  void roundTrip_data() {
    QTest::addColumn<Precision>("precision");
    QTest::addColumn<int>("block");
    QTest::addColumn<Rounding>("rounding");
    QTest::addColumn<int>("n");
    QTest::addColumn<QString>("values");
    const struct {
      Precision p;
      const char* name;
    } blocks[] = {{Precision::INT8, "int8"}, {Precision::INT4, "int4"}, {Precision::FP8, "fp8"}};
    // Sizes that fill blocks exactly, leave a short last block, or are
    // smaller than one block; blocks of one value and of the 1M maximum.
    const struct {
      int n, block;
    } shapes[] = {{1000, 128},  {1, 128},  {129, 128},      {128, 128},   {1000, 1},
                  {5000, 4096}, {300, 32}, {3000, 1 << 20}, {1, 1 << 20}, {257, 7}};
    const char* patterns[] = {"mixed", "zero-block", "zeros", "huge", "tiny", "ramp"};
    for (const auto& b : blocks)
      for (Rounding r : {Rounding::Nearest, Rounding::Stochastic})
        for (const auto& sh : shapes)
          for (const char* pat : patterns)
            QTest::addRow("%s:%d:%s n=%d %s", b.name, sh.block,
                          r == Rounding::Nearest ? "rn" : "sr", sh.n, pat)
                << b.p << sh.block << r << sh.n << QString(pat);
    for (int n : {1, 129, 1000}) {
      for (const char* pat : {"mixed", "tiny", "ramp", "zeros"}) {
        QTest::addRow("bf16 n=%d %s", n, pat)
            << Precision::BF16 << 128 << Rounding::Nearest << n << QString(pat);
        QTest::addRow("fp16 n=%d %s", n, pat)
            << Precision::FP16 << 128 << Rounding::Nearest << n << QString(pat);
        QTest::addRow("fp32 n=%d %s", n, pat)
            << Precision::FP32 << 128 << Rounding::Nearest << n << QString(pat);
      }
      QTest::addRow("bf16 n=%d huge", n)
          << Precision::BF16 << 128 << Rounding::Nearest << n << QString("huge");
      QTest::addRow("fp32 n=%d huge", n)
          << Precision::FP32 << 128 << Rounding::Nearest << n << QString("huge");
    }
  }

  void roundTrip() {
    QFETCH(Precision, precision);
    QFETCH(int, block);
    QFETCH(Rounding, rounding);
    QFETCH(int, n);
    QFETCH(QString, values);
    const QuantSpec s = spec_of(precision, block, rounding, 11);
    std::vector<float> x = pattern(values, n, block, 1234 + uint64_t(n));
    if (precision == Precision::FP16 && values == "tiny") {
      // fp16 has no range for 1e-30; check its relative precision on its own
      // normal range instead.
      for (float& v : x) v = v == 0 ? 0.0f : std::copysign(1e-3f + std::fabs(v) * 1e27f, v);
    }
    const Packed q = quantize(x, s, 77);
    QVERIFY2(q.guard_intact(), "quantize_values wrote past quantized_bytes");
    const std::vector<float> y = dequantize(q, n, s);
    const Bound bound(x, s);
    for (int64_t i = 0; i < n; ++i) {
      const double xi = x[size_t(i)], yi = y[size_t(i)];
      const double err = std::fabs(yi - xi);
      QVERIFY2(std::isfinite(yi),
               qPrintable(QStringLiteral("element %1: %2 from %3").arg(i).arg(yi).arg(xi)));
      if (xi == 0) {
        QVERIFY2(yi == 0,
                 qPrintable(QStringLiteral("element %1: zero came back as %2").arg(i).arg(yi)));
        continue;
      }
      QVERIFY2(err <= bound.at(i), qPrintable(QStringLiteral("element %1: %2 came back as %3, "
                                                             "error %4 over the bound %5")
                                                  .arg(i)
                                                  .arg(xi, 0, 'g', 9)
                                                  .arg(yi, 0, 'g', 9)
                                                  .arg(err, 0, 'g', 4)
                                                  .arg(bound.at(i), 0, 'g', 4)));
      // Quantization never flips a sign.
      QVERIFY2(yi == 0 || (yi > 0) == (xi > 0),
               qPrintable(QStringLiteral("element %1: sign of %2 flipped").arg(i).arg(xi)));
    }
    // Under nearest rounding the block's absmax survives (up to rounding of
    // the scale): it is the value every other one is measured against.
    if (s.is_block() && s.rounding == Rounding::Nearest) {
      for (size_t b = 0; b < bound.amax.size(); ++b) {
        double got = 0;
        for (int64_t i = int64_t(b) * block; i < std::min<int64_t>(n, int64_t(b + 1) * block); ++i)
          got = std::max(got, double(std::fabs(y[size_t(i)])));
        QVERIFY2(std::fabs(got - bound.amax[b]) <= 1e-6 * bound.amax[b],
                 qPrintable(QStringLiteral("block %1: absmax %2 came back as %3")
                                .arg(b)
                                .arg(bound.amax[b])
                                .arg(got)));
      }
    }
  }

  // Blocks whose absmax is below FLT_MIN * qmax: a scale of A / qmax would be
  // subnormal (or zero) and its reciprocal overflow, turning zeros into NaN.
  // Values must come back finite, zeros as zeros, within the bounds of a
  // FLT_MIN scale.
  void subnormalBlocks_data() {
    QTest::addColumn<Precision>("precision");
    QTest::addColumn<Rounding>("rounding");
    QTest::addColumn<float>("magnitude");
    for (float mag : {1e-37f, 1e-39f, 1e-42f, FLT_TRUE_MIN}) {
      for (auto [p, name] : {std::pair{Precision::INT8, "int8"}, std::pair{Precision::INT4, "int4"},
                             std::pair{Precision::FP8, "fp8"}}) {
        QTest::addRow("%s rn %g", name, double(mag)) << p << Rounding::Nearest << mag;
        QTest::addRow("%s sr %g", name, double(mag)) << p << Rounding::Stochastic << mag;
      }
    }
  }
  void subnormalBlocks() {
    QFETCH(Precision, precision);
    QFETCH(Rounding, rounding);
    QFETCH(float, magnitude);
    const QuantSpec s = spec_of(precision, 16, rounding, 5);
    std::vector<float> x(40, 0.0f);
    for (size_t i = 0; i < x.size(); ++i)
      if (i % 3 != 0) x[i] = (i % 2 ? -1.0f : 1.0f) * magnitude * float(1 + (i % 5)) / 5.0f;
    const std::vector<float> y = dequantize(quantize(x, s, 3), int64_t(x.size()), s);
    const Bound bound(x, s);
    for (size_t i = 0; i < x.size(); ++i) {
      QVERIFY2(
          std::isfinite(y[i]),
          qPrintable(QStringLiteral("element %1: %2 came back as %3").arg(i).arg(x[i]).arg(y[i])));
      if (x[i] == 0) QVERIFY2(y[i] == 0, qPrintable(QString::number(y[i])));
      QVERIFY2(
          std::fabs(double(y[i]) - double(x[i])) <= bound.at(int64_t(i)),
          qPrintable(QStringLiteral("element %1: %2 came back as %3").arg(i).arg(x[i]).arg(y[i])));
    }
  }

  // The bf16 and fp16 casts round to nearest even: exactly representable
  // values come back unchanged, and a value half-way between two rounds to
  // the one with an even last bit.
  void castsRoundToNearestEven() {
    const QuantSpec bf = spec_of(Precision::BF16), hf = spec_of(Precision::FP16);
    // bf16 has 8 significant bits: 1 + 2^-7 is exact, 1 + 2^-8 a tie.
    const std::vector<float> x = {1.0f, 1.0f + 0x1p-7f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -2.5f,
                                  0.0f};
    const std::vector<float> want_bf = {1.0f, 1.0f + 0x1p-7f, 1.0f, 1.0f + 2 * 0x1p-7f, -2.5f,
                                        0.0f};
    QCOMPARE(dequantize(quantize(x, bf), 6, bf), want_bf);
    // fp16 has 11: 1 + 2^-10 exact, 1 + 2^-11 a tie, 65504 the largest.
    const std::vector<float> h = {1.0f + 0x1p-10f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65504.0f,
                                  -0x1p-24f};
    const std::vector<float> want_h = {1.0f + 0x1p-10f, 1.0f, 1.0f + 2 * 0x1p-10f, 65504.0f,
                                       -0x1p-24f};
    QCOMPARE(dequantize(quantize(h, hf), 5, hf), want_h);
  }

  // --- fp8 e4m3 codec -----------------------------------------------------

  void e4m3EveryCodeRoundTrips() {
    int finite = 0;
    for (int c = 0; c < 256; ++c) {
      const float f = ss::e4m3_to_f32(uint8_t(c));
      if (is_nan_code(c)) {
        QVERIFY2(std::isnan(f), qPrintable(QStringLiteral("code 0x%1 is not NaN").arg(c, 0, 16)));
        continue;
      }
      ++finite;
      QVERIFY(std::isfinite(f));
      QCOMPARE(int(ss::f32_to_e4m3(f)), c);
      // The code's value from the format's definition.
      const int e = (c >> 3) & 0xf, m = c & 7;
      const double want =
          (c & 0x80 ? -1 : 1) * (e == 0 ? std::ldexp(double(m), -9) : std::ldexp(8.0 + m, e - 10));
      QVERIFY2(
          double(f) == want,
          qPrintable(QStringLiteral("code 0x%1: %2, expected %3").arg(c, 0, 16).arg(f).arg(want)));
    }
    QCOMPARE(finite, 254);
  }

  void e4m3MaxAndClamp() {
    float mx = 0;
    for (int c = 0; c < 256; ++c)
      if (!is_nan_code(c)) mx = std::max(mx, ss::e4m3_to_f32(uint8_t(c)));
    QCOMPARE(mx, 448.0f);
    QCOMPARE(ss::e4m3_to_f32(0x7e), 448.0f);
    QCOMPARE(ss::e4m3_to_f32(0xfe), -448.0f);
    for (float v : {448.0f, 449.0f, 464.0f, 480.0f, 500.0f, 1e6f, FLT_MAX,
                    std::numeric_limits<float>::infinity()}) {
      QCOMPARE(ss::e4m3_to_f32(ss::f32_to_e4m3(v)), 448.0f);
      QCOMPARE(ss::e4m3_to_f32(ss::f32_to_e4m3(-v)), -448.0f);
      QCOMPARE(ss::e4m3_to_f32(ss::f32_to_e4m3(v, 0.999f)), 448.0f);  // stochastic too
    }
    QVERIFY(std::isnan(ss::e4m3_to_f32(ss::f32_to_e4m3(NAN))));
    QCOMPARE(ss::f32_to_e4m3(0.0f), uint8_t(0x00));
    QCOMPARE(ss::f32_to_e4m3(-0.0f), uint8_t(0x80));
  }

  // Nearest rounding picks a code at the least distance from v, found by
  // trying every finite code; stochastic rounding one of the two neighbours.
  void e4m3NearestIsClosest() {
    std::vector<double> codes;
    for (int c = 0; c < 256; ++c)
      if (!is_nan_code(c)) codes.push_back(ss::e4m3_to_f32(uint8_t(c)));
    std::vector<float> probes;
    // Every midpoint between neighbouring codes and a hair either side,
    // plus values spread log-uniformly over the whole range and beyond.
    std::vector<double> pos;
    for (double c : codes)
      if (c >= 0) pos.push_back(c);
    std::sort(pos.begin(), pos.end());
    pos.erase(std::unique(pos.begin(), pos.end()), pos.end());
    for (size_t k = 0; k + 1 < pos.size(); ++k) {
      const float mid = float((pos[k] + pos[k + 1]) / 2);
      probes.push_back(mid);
      probes.push_back(std::nextafter(mid, 0.0f));
      probes.push_back(std::nextafter(mid, 1000.0f));
      probes.push_back(float(pos[k] + (pos[k + 1] - pos[k]) * 0.3));
    }
    std::mt19937 rng(9);
    std::uniform_real_distribution<double> e(-14.0, 9.5);
    for (int i = 0; i < 20000; ++i) probes.push_back(float(std::exp2(e(rng))));
    const size_t positives = probes.size();
    for (size_t i = 0; i < positives; ++i) probes.push_back(-probes[i]);

    std::uniform_real_distribution<float> uni(0.0f, 1.0f);
    for (float v : probes) {
      double best = INFINITY;
      double below = -INFINITY, above = INFINITY;  // the neighbours of min(|v|, 448) with sign
      const double target = std::clamp(double(v), -448.0, 448.0);
      for (double c : codes) {
        best = std::min(best, std::fabs(c - target));
        if (c <= target) below = std::max(below, c);
        if (c >= target) above = std::min(above, c);
      }
      const double got = ss::e4m3_to_f32(ss::f32_to_e4m3(v));
      QVERIFY2(std::fabs(got - target) == best,
               qPrintable(QStringLiteral("%1 rounded to %2; a code %3 away exists")
                              .arg(double(v), 0, 'g', 9)
                              .arg(got, 0, 'g', 9)
                              .arg(best, 0, 'g', 4)));
      const double sr = ss::e4m3_to_f32(ss::f32_to_e4m3(v, std::min(uni(rng), 0.99999994f)));
      QVERIFY2(sr == below || sr == above,
               qPrintable(QStringLiteral("%1 rounded stochastically to %2, not %3 or %4")
                              .arg(double(v), 0, 'g', 9)
                              .arg(sr)
                              .arg(below)
                              .arg(above)));
    }
    // Below half the smallest subnormal (2^-10) is zero; just above is 2^-9.
    QCOMPARE(ss::e4m3_to_f32(ss::f32_to_e4m3(0x1p-11f)), 0.0f);
    QCOMPARE(ss::e4m3_to_f32(ss::f32_to_e4m3(std::nextafter(0x1p-10f, 1.0f))), 0x1p-9f);
  }

  // The same search through quantize_values, which encodes fp8 on its own
  // path under nearest rounding: blocks whose absmax is 448 have a scale of
  // exactly 1, so each value's code must be a closest one.
  void fp8BlocksPickClosestCodes() {
    std::vector<double> codes;
    for (int c = 0; c < 256; ++c)
      if (!is_nan_code(c)) codes.push_back(ss::e4m3_to_f32(uint8_t(c)));
    constexpr int kBlock = 64;
    std::vector<float> x;
    std::mt19937 rng(4);
    std::uniform_real_distribution<double> e(-13.0, std::log2(448.0));
    for (int k = 0; k < 40000; ++k) {
      if (k % kBlock == 0)
        x.push_back(k % 128 ? -448.0f : 448.0f);
      else if (k % 7 == 0)
        x.push_back(0.0f);
      else if (k % 5 == 0)
        x.push_back(ss::e4m3_to_f32(uint8_t(k % 0x7f)));  // exact codes
      else
        x.push_back(float((k % 2 ? -1 : 1) * std::exp2(e(rng))));
    }
    // Mid-way points between neighbouring codes (ties) in a block of their own.
    std::vector<double> pos;
    for (double c : codes)
      if (c >= 0) pos.push_back(c);
    std::sort(pos.begin(), pos.end());
    pos.erase(std::unique(pos.begin(), pos.end()), pos.end());
    while (x.size() % kBlock) x.push_back(0.0f);
    for (size_t k = 0; k + 1 < pos.size(); ++k) {
      if (x.size() % kBlock == 0) x.push_back(448.0f);
      x.push_back(float((pos[k] + pos[k + 1]) / 2));
    }
    const QuantSpec s = spec_of(Precision::FP8, kBlock);
    const std::vector<float> y = dequantize(quantize(x, s), int64_t(x.size()), s);
    for (size_t i = 0; i < x.size(); ++i) {
      double best = INFINITY;
      for (double c : codes) best = std::min(best, std::fabs(c - double(x[i])));
      QVERIFY2(std::fabs(double(y[i]) - double(x[i])) == best,
               qPrintable(QStringLiteral("element %1: %2 came back as %3; a code %4 away exists")
                              .arg(i)
                              .arg(double(x[i]), 0, 'g', 9)
                              .arg(double(y[i]), 0, 'g', 9)
                              .arg(best, 0, 'g', 4)));
    }
  }

  // Without accumulate, dequantize_values overwrites whatever the output
  // held (NaN and infinity included, as in a fresh buffer); with it, adds.
  void dequantizeOverwritesOrAdds_data() {
    QTest::addColumn<Precision>("precision");
    QTest::addColumn<Rounding>("rounding");
    QTest::newRow("fp32") << Precision::FP32 << Rounding::Nearest;
    QTest::newRow("bf16") << Precision::BF16 << Rounding::Nearest;
    QTest::newRow("fp16") << Precision::FP16 << Rounding::Nearest;
    for (auto r : {Rounding::Nearest, Rounding::Stochastic}) {
      const char* how = r == Rounding::Nearest ? "rn" : "sr";
      QTest::addRow("int8 %s", how) << Precision::INT8 << r;
      QTest::addRow("int4 %s", how) << Precision::INT4 << r;
      QTest::addRow("fp8 %s", how) << Precision::FP8 << r;
    }
  }
  void dequantizeOverwritesOrAdds() {
    QFETCH(Precision, precision);
    QFETCH(Rounding, rounding);
    const QuantSpec s = spec_of(precision, 32, rounding, 2);
    const int64_t n = 301;
    const std::vector<float> x = pattern("ramp", n, 32, 0);
    const Packed q = quantize(x, s, 9);
    const std::vector<float> y = dequantize(q, n, s);
    for (float junk : {NAN, INFINITY, -INFINITY, 7.0f}) {
      std::vector<float> out(size_t(n), junk);
      ss::dequantize_values(q.data(), n, s, out.data(), false);
      QVERIFY2(out == y,
               qPrintable(QStringLiteral("a buffer holding %1 was not overwritten").arg(junk)));
    }
    std::vector<float> sum(size_t(n), 1.0f);
    ss::dequantize_values(q.data(), n, s, sum.data(), true);
    for (int64_t i = 0; i < n; ++i) QCOMPARE(sum[size_t(i)], 1.0f + y[size_t(i)]);
  }

  // --- the vector kernels against one element at a time ------------------

  // quantize_values / dequantize_values run whole SIMD vectors where the
  // build allows and plain loops for the rest. Both must give the bytes and
  // values of the element-by-element definition, written here without the
  // library's kernels: per block absmax A, scale max(A/qmax, FLT_MIN), the
  // value x * (1/scale) rounded half to even or stochastically (down, or up
  // when its fraction exceeds the element's counter-based uniform), clamped
  // (int8, int4: low nibble first), or the e4m3 codec (f32_to_e4m3, checked
  // above by brute force); casts by f32_to_bf16 / f32_to_f16. Sizes and blocks
  // put vector bodies, remainders and odd int4 block starts at every offset.
  void vectorKernelsMatchTheDefinition_data() {
    QTest::addColumn<Precision>("precision");
    QTest::addColumn<int>("block");
    QTest::addColumn<int>("n");
    QTest::addColumn<Rounding>("rounding");
    for (auto [p, name] : {std::pair{Precision::INT8, "int8"}, std::pair{Precision::INT4, "int4"},
                           std::pair{Precision::FP8, "fp8"}})
      for (int block : {1, 7, 8, 33, 64, 128, 4096})
        for (int n : {1, 31, 32, 65, 1000, 4099}) {
          QTest::addRow("%s:%d n=%d", name, block, n) << p << block << n << Rounding::Nearest;
          if (p != Precision::FP8)
            QTest::addRow("%s:%d:sr n=%d", name, block, n) << p << block << n << Rounding::Stochastic;
        }
    for (int n : {1, 7, 8, 15, 16, 17, 1000, 1031}) {
      QTest::addRow("bf16 n=%d", n) << Precision::BF16 << 128 << n << Rounding::Nearest;
      QTest::addRow("fp16 n=%d", n) << Precision::FP16 << 128 << n << Rounding::Nearest;
    }
  }
  void vectorKernelsMatchTheDefinition() {
    QFETCH(Precision, precision);
    QFETCH(int, block);
    QFETCH(int, n);
    QFETCH(Rounding, rounding);
    const QuantSpec s = spec_of(precision, block, rounding, 0x5eed);
    const uint64_t counter0 = 1234567;
    // Stochastic rounding's uniform of element i: the splitmix64 finaliser of
    // seed * golden + counter0 + i + 0x632be59bd9b4e019, its top 24 bits / 2^24.
    auto uniform = [&](int64_t i) {
      uint64_t z = s.seed * 0x9e3779b97f4a7c15ull + counter0 + uint64_t(i) + 0x632be59bd9b4e019ull;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      return float(z >> 40) * 0x1p-24f;
    };
    std::vector<float> x = pattern("mixed", n, block, 99 + uint64_t(n));
    const std::vector<float> ramp = pattern("ramp", n, block, 0);
    for (int64_t i = 0; i < n; i += 3) x[size_t(i)] = ramp[size_t(i)] * 200.0f;  // ties and clamps
    if (!s.is_block()) {
      // Casts: their special values at varied lanes.
      const float special[] = {NAN, -NAN, INFINITY, -INFINITY, 0x1p-130f, -0x1p-140f, 65520.0f, 65519.0f,
                               1.0f + 0x1p-8f, 1.0f + 0x1p-11f, 3e38f, -0.0f, 0x1p-25f, 0x1p-24f * 1.5f};
      for (size_t k = 0; k < std::size(special); ++k)
        if (int64_t(k * 5) < n) x[k * 5] = special[k];
    }
    const Packed q = quantize(x, s, counter0);
    QVERIFY(q.guard_intact());
    std::vector<uint8_t> want(size_t(q.bytes), 0);
    if (precision == Precision::BF16 || precision == Precision::FP16) {
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = precision == Precision::BF16 ? ss::f32_to_bf16(x[size_t(i)]) : ss::f32_to_f16(x[size_t(i)]);
        std::memcpy(&want[size_t(2 * i)], &h, 2);
      }
    } else {
      const int64_t nb = (n + block - 1) / block;
      const float qm = float(qmax(precision));
      std::vector<float> scales(static_cast<size_t>(nb));
      for (int64_t b = 0; b < nb; ++b) {
        float a = 0;
        for (int64_t i = b * block; i < std::min<int64_t>(n, (b + 1) * block); ++i)
          a = std::max(a, std::fabs(x[size_t(i)]));
        const float scale = a > 0 ? std::max(a / qm, FLT_MIN) : 1.0f;
        scales[size_t(b)] = scale;
        const float inv = 1.0f / scale;
        for (int64_t i = b * block; i < std::min<int64_t>(n, (b + 1) * block); ++i) {
          const float v = x[size_t(i)] * inv;
          uint8_t& byte = want[size_t(4 * nb + (precision == Precision::INT4 ? i / 2 : i))];
          if (precision == Precision::FP8) byte = ss::f32_to_e4m3(v);
          else {
            // Stochastic: down, or up when the fraction is above the uniform.
            const float f = std::floor(v);
            const float rounded = rounding == Rounding::Nearest ? std::nearbyint(v) : (v - f > uniform(i) ? f + 1 : f);
            const int r = int(std::clamp(rounded, -qm, qm));
            if (precision == Precision::INT8) byte = uint8_t(int8_t(r));
            else byte |= uint8_t((r & 0xf) << (4 * (i & 1)));
          }
        }
      }
      std::memcpy(want.data(), scales.data(), scales.size() * 4);
    }
    for (int64_t k = 0; k < q.bytes; ++k)
      QVERIFY2(q.data()[k] == want[size_t(k)],
               qPrintable(QStringLiteral("byte %1: 0x%2, by definition 0x%3")
                              .arg(k)
                              .arg(q.data()[k], 0, 16)
                              .arg(want[size_t(k)], 0, 16)));
    // Back: each value from its own byte(s), then added onto 0.5 with accumulate.
    const std::vector<float> y = dequantize(q, n, s);
    std::vector<float> acc(size_t(n), 0.5f);
    ss::dequantize_values(q.data(), n, s, acc.data(), true);
    const int64_t nb = s.is_block() ? (n + block - 1) / block : 0;
    // Element i's code and scale (casts: the value and 1).
    auto scale_of = [&](int64_t i) {
      float scale = 1.0f;
      if (s.is_block()) std::memcpy(&scale, q.data() + 4 * (i / block), 4);
      return scale;
    };
    auto code_of = [&](int64_t i) -> float {
      uint16_t h;
      switch (precision) {
        case Precision::BF16:
          std::memcpy(&h, q.data() + 2 * i, 2);
          return ss::bf16_to_f32(h);
        case Precision::FP16:
          std::memcpy(&h, q.data() + 2 * i, 2);
          return ss::f16_to_f32(h);
        default: {
          const uint8_t byte = q.data()[4 * nb + (precision == Precision::INT4 ? i / 2 : i)];
          return precision == Precision::INT8   ? float(int8_t(byte))
                 : precision == Precision::INT4 ? float(((byte >> (4 * (i & 1))) & 0xf) ^ 8) - 8.0f
                                                : ss::e4m3_to_f32(byte);
        }
      }
    };
    for (int64_t i = 0; i < n; ++i) {
      const float v = code_of(i) * scale_of(i);
      const bool same = (std::isnan(v) && std::isnan(y[size_t(i)])) || v == y[size_t(i)];
      QVERIFY2(same, qPrintable(QStringLiteral("element %1: %2, by definition %3").arg(i).arg(y[size_t(i)]).arg(v)));
      // The product and the sum rounded apart or fused (FMA): either is the sum.
      const float a = 0.5f + v, fused = std::fma(code_of(i), scale_of(i), 0.5f);
      QVERIFY2((std::isnan(a) && std::isnan(acc[size_t(i)])) || a == acc[size_t(i)] || fused == acc[size_t(i)],
               qPrintable(QStringLiteral("element %1: accumulated %2, want %3").arg(i).arg(acc[size_t(i)]).arg(a)));
    }
  }

  // --- stochastic rounding -------------------------------------------------

  // Quantizes one vector `trials` times with distinct counters (or seeds);
  // the mean of the dequantized values converges to the input. Each trial's
  // error lies in an interval of one step, so by Hoeffding the mean of T
  // trials is further than 4 steps / sqrt(T) from its expectation with
  // probability below 2 exp(-32) per element. Values sit mid-way between
  // levels (where nearest rounding is off by half a step) and at random
  // fractions of a step.
  void stochasticIsUnbiased_data() {
    QTest::addColumn<Precision>("precision");
    QTest::addColumn<bool>("vary_seed");
    for (bool seeds : {false, true}) {
      const char* how = seeds ? "seeds" : "counters";
      QTest::addRow("int8 %s", how) << Precision::INT8 << seeds;
      QTest::addRow("int4 %s", how) << Precision::INT4 << seeds;
      QTest::addRow("fp8 %s", how) << Precision::FP8 << seeds;
    }
  }
  void stochasticIsUnbiased() {
    QFETCH(Precision, precision);
    QFETCH(bool, vary_seed);
    constexpr int kTrials = 2000, kBlock = 64, kBlocks = 8, n = kBlock * kBlocks;
    // Each block's first value is its absmax, a power of two times qmax (int)
    // or 448 (fp8), so the scale is exact and the levels are known exactly.
    std::mt19937_64 rng(21);
    std::uniform_real_distribution<double> uni(0.0, 1.0);
    std::vector<float> x(n);
    std::vector<double> step(n);
    for (int b = 0; b < kBlocks; ++b) {
      const double scale = std::ldexp(1.0, b - 4);
      x[size_t(b * kBlock)] = float((b % 2 ? -1 : 1) * qmax(precision) * scale);
      step[size_t(b * kBlock)] = 0;
      for (int k = 1; k < kBlock; ++k) {
        const int i = b * kBlock + k;
        const bool mid = k % 2 == 1;  // half the values mid-way between levels
        double v, st;
        if (precision == Precision::FP8) {
          const double code = ss::e4m3_to_f32(uint8_t(1 + (k * 37) % 125));  // 2^-9 .. 416
          st = e4m3_spacing(code);
          v = code + st * (mid ? 0.5 : uni(rng));
        } else {
          const int level = int((k * 13) % int(2 * qmax(precision))) - int(qmax(precision));
          st = 1;
          v = level + (mid ? 0.5 : uni(rng));
        }
        x[size_t(i)] = float((k % 3 ? 1 : -1) * v * scale);
        step[size_t(i)] = st * scale;
      }
    }
    const QuantSpec nearest = spec_of(precision, kBlock);
    std::vector<double> sum(n, 0.0);
    double single_abs = 0;  // mean |error| of single stochastic trials
    for (int t = 0; t < kTrials; ++t) {
      const QuantSpec s =
          spec_of(precision, kBlock, Rounding::Stochastic, vary_seed ? uint64_t(1000 + t) : 3);
      const uint64_t counter = vary_seed ? 0 : uint64_t(t) * n;
      const std::vector<float> y = dequantize(quantize(x, s, counter), n, s);
      for (int i = 0; i < n; ++i) {
        sum[size_t(i)] += y[size_t(i)];
        single_abs +=
            std::fabs(double(y[size_t(i)]) - x[size_t(i)]) / std::max(step[size_t(i)], 1e-30);
      }
    }
    single_abs /= double(kTrials) * n;
    const std::vector<float> yn = dequantize(quantize(x, nearest), n, nearest);
    double mean_abs = 0, nearest_mid = 0;
    int mids = 0;
    for (int i = 0; i < n; ++i) {
      if (step[size_t(i)] == 0) continue;  // the absmax: exact either way
      const double mean_err = sum[size_t(i)] / kTrials - x[size_t(i)];
      const double tol = 4 * step[size_t(i)] / std::sqrt(double(kTrials));
      QVERIFY2(std::fabs(mean_err) <= tol,
               qPrintable(QStringLiteral("element %1 (%2): mean error %3 over %4 trials, bound %5")
                              .arg(i)
                              .arg(x[size_t(i)])
                              .arg(mean_err)
                              .arg(kTrials)
                              .arg(tol)));
      mean_abs += std::fabs(mean_err) / step[size_t(i)];
      if ((i % kBlock) % 2 == 1) {
        nearest_mid += std::fabs(double(yn[size_t(i)]) - x[size_t(i)]) / step[size_t(i)];
        ++mids;
      }
    }
    mean_abs /= n - kBlocks;
    nearest_mid /= mids;
    // Nearest rounding is half a step off on every mid-way value; one
    // stochastic trial is off by about a third of a step on average; the
    // mean of 2000 is off by about 0.009 of a step (0.8 of its standard
    // deviation, at most step / (2 sqrt(2000))).
    QVERIFY2(std::fabs(nearest_mid - 0.5) < 1e-6, qPrintable(QString::number(nearest_mid)));
    QVERIFY2(single_abs > 0.2, qPrintable(QString::number(single_abs)));
    QVERIFY2(mean_abs < 0.02, qPrintable(QStringLiteral("average |mean error| %1 steps, single "
                                                        "trials %2, nearest on mid-way values %3")
                                             .arg(mean_abs)
                                             .arg(single_abs)
                                             .arg(nearest_mid)));
  }

  void roundingIsReproducible_data() {
    QTest::addColumn<Precision>("precision");
    QTest::newRow("int8") << Precision::INT8;
    QTest::newRow("int4") << Precision::INT4;
    QTest::newRow("fp8") << Precision::FP8;
  }
  void roundingIsReproducible() {
    QFETCH(Precision, precision);
    const std::vector<float> x = pattern("mixed", 1000, 128, 5);
    // Nearest ignores seed and counter.
    const QuantSpec rn1 = spec_of(precision, 128, Rounding::Nearest, 1);
    const QuantSpec rn2 = spec_of(precision, 128, Rounding::Nearest, 99);
    QVERIFY(quantize(x, rn1, 0) == quantize(x, rn2, 123456));
    // Stochastic: the same seed and counter give the same bytes; another
    // counter or another seed, different ones.
    const QuantSpec sr = spec_of(precision, 128, Rounding::Stochastic, 7);
    const QuantSpec sr_other = spec_of(precision, 128, Rounding::Stochastic, 8);
    QVERIFY(quantize(x, sr, 500) == quantize(x, sr, 500));
    QVERIFY(!(quantize(x, sr, 500) == quantize(x, sr, 501)));
    QVERIFY(!(quantize(x, sr, 500) == quantize(x, sr_other, 500)));
    // The counter is per element: quantizing a tail on its own with the
    // counter of its first element gives the same values as within the whole
    // (block-aligned, so the scales agree).
    const std::vector<float> tail(x.begin() + 256, x.end());
    const std::vector<float> whole = dequantize(quantize(x, sr, 500), 1000, sr);
    const std::vector<float> part = dequantize(quantize(tail, sr, 500 + 256), 744, sr);
    QVERIFY(std::equal(part.begin(), part.end(), whole.begin() + 256));
  }
};

QTEST_APPLESS_MAIN(TestQuant)
#include "tst_quant.moc"
