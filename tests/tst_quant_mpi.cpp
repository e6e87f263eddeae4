// The quantized all-reduce (comm/quantized_all_reduce.h) over the MPI
// communicator on the cpu backend, run under mpiexec with 2, 3 and 4 ranks
// (and alone, as a singleton world where it must leave the buffer as is).
// Every rank can generate every rank's input (input(rank, i)), so each rank
// checks its result against an exact sum built without MPI.
//
// Error bound of element i, in block b of chunk c (blocks start at each
// chunk's first element), h = 1/2 for nearest rounding and 1 for stochastic:
//   hop 1   every rank r other than c quantizes its chunk c: |e1_r| <=
//           h step(x_r,i; A_rb), A_rb the absmax of r's values in block b;
//           step = A/qmax for int8 and int4, (A/448) sp(|x|/(A/448)) for fp8
//           (sp: e4m3 spacing), an ulp of x for bf16 / fp16. The owner's own
//           values never travel and stay exact (e1_c = 0).
//   sum     the owner of chunk c adds D dequantized values in fp32: at most
//           D 2^-24 of the sum of their magnitudes.
//   hop 2   the owner requantizes the sum S_i, |S_i| <= |exact_i| + e1 + sum
//           =: U_i, with absmax A2 <= max over the block of U_j: |e2| <= h A2/qmax
//           (int), h max(U_i/8, A2/448 2^-9) (fp8: an e4m3 step is at most an
//           eighth of the value, or the subnormal spacing), h ulp(U_i) (casts).
//   bound   e1 + sum + e2, each step with a relative slack of 1e-4 for the
//           single f32 roundings of scales and products.
// fp32 is the ordinary all-reduce; inputs are multiples of 2^-6 below 2^14,
// so every sum of up to 4 of them is exact in f32 in any order and the fp32
// result must equal the exact sum.
//
// Checks are local verdicts combined across ranks (mpi_harness.h).
#include <mpi.h>

#include <QtTest>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "comm/quantize.h"
#include "comm/quantized_all_reduce.h"
#include "cpu/cpu_backend.h"
#include "mpi_harness.h"
#include "quant_bounds.h"

using mpi_harness::Verdict;
using quant_bounds::kSlack;
using ss::Precision;
using ss::QuantSpec;
using ss::Rounding;
using ss::Tensor;

namespace {

// Every call here draws its stochastic rounding from this seed.
constexpr uint64_t kSeed = 17;

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// What rank `rank` contributes at index i: m 2^e with |m| <= 1023 and e in
// [-6, 4], about one in eight a zero, and the exponent range of each stretch
// of 97 values shifted so blocks see both narrow and wide ranges.
float input(int rank, int64_t i) {
  const uint64_t h = mix(uint64_t(rank) * 0x100000001b3ull + uint64_t(i));
  if ((h & 7) == 0) return 0.0f;
  const int m = int((h >> 8) % 1023) + 1;
  const int lo = int((i / 97) % 6) - 6;                  // -6 .. -1
  const int e = lo + int((h >> 24) % uint64_t(5 - lo));  // lo .. 4
  return float(((h >> 40) & 1 ? -1 : 1) * std::ldexp(double(m), e));
}

QuantSpec spec_of(Precision p, int block, Rounding r) {
  return quant_bounds::spec_of(p, block, r, kSeed);
}

// The exact sums over `ranks` ranks and the bound on each element's error
// (see the header).
struct Expected {
  std::vector<double> sum, bound;
};

Expected expected(int64_t n, int ranks, const QuantSpec& s) {
  Expected out;
  out.sum.assign(size_t(n), 0.0);
  out.bound.assign(size_t(n), 0.0);
  std::vector<double> sum_abs(size_t(n), 0.0), e1(size_t(n), 0.0);
  const double hs = quant_bounds::error_steps(s) + kSlack;
  auto begin = [&](int c) { return n * c / ranks; };
  for (int r = 0; r < ranks; ++r) {
    for (int c = 0; c < ranks; ++c) {
      for (int64_t b0 = begin(c); b0 < begin(c + 1); b0 += s.block) {
        const int64_t b1 = s.is_block() ? std::min(begin(c + 1), b0 + s.block) : begin(c + 1);
        double amax = 0;
        for (int64_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(double(input(r, i))));
        const double scale = quant_bounds::block_scale(s.precision, amax);
        for (int64_t i = b0; i < b1; ++i) {
          const double x = input(r, i), a = std::fabs(x);
          out.sum[size_t(i)] += x;
          sum_abs[size_t(i)] += a;
          const double step = quant_bounds::step(s.precision, scale, a);
          if (r != c) e1[size_t(i)] += (x == 0 ? 0.0 : hs * step);  // the owner's own values stay fp32
        }
        if (!s.is_block()) break;
      }
    }
  }
  if (s.precision == Precision::FP32 || ranks == 1) return out;  // exact
  for (int c = 0; c < ranks; ++c) {
    for (int64_t b0 = begin(c); b0 < begin(c + 1); b0 += s.block) {
      const int64_t b1 = s.is_block() ? std::min(begin(c + 1), b0 + s.block) : begin(c + 1);
      std::vector<double> upper(size_t(b1 - b0));
      double a2 = 0;
      for (int64_t i = b0; i < b1; ++i) {
        const double roundoff = ranks * std::ldexp(sum_abs[size_t(i)] + e1[size_t(i)], -24);
        upper[size_t(i - b0)] = std::fabs(out.sum[size_t(i)]) + e1[size_t(i)] + roundoff;
        out.bound[size_t(i)] = e1[size_t(i)] + roundoff;
        a2 = std::max(a2, upper[size_t(i - b0)]);
      }
      const double scale2 = quant_bounds::block_scale(s.precision, a2);
      for (int64_t i = b0; i < b1; ++i) {
        const double u = upper[size_t(i - b0)];
        double e2 = 0;
        switch (s.precision) {
          case Precision::INT8:
          case Precision::INT4:
            e2 = hs * scale2;
            break;
          case Precision::FP8:
            e2 = hs * std::max(u / 8, scale2 * std::ldexp(1.0, -9));
            break;
          case Precision::BF16:
          case Precision::FP16:
            e2 = hs * quant_bounds::cast_ulp(s.precision, u);
            break;
          case Precision::FP32:
            break;
        }
        out.bound[size_t(i)] += e2;
      }
      if (!s.is_block()) break;
    }
  }
  return out;
}

// The bytes each rank sends, from the algorithm rather than the library:
// all-to-all and all-gather each move D-1 carriers of the largest chunk,
// padded to whole f32 words; fp32 is the ring all-reduce, 2 (D-1)/D of 4n.
double wire_closed_form(int64_t n, int d, const QuantSpec& s) {
  if (d <= 1) return 0;
  if (s.precision == Precision::FP32) return 2.0 * (d - 1) / d * 4.0 * double(n);
  const int64_t chunk = (n + d - 1) / d;
  int64_t bytes = 0;
  if (s.is_block()) {
    const int64_t values = s.precision == Precision::INT4 ? (chunk + 1) / 2 : chunk;
    bytes = values + 4 * ((chunk + s.block - 1) / s.block);
  } else {
    bytes = 2 * chunk;
  }
  return 2.0 * (d - 1) * 4.0 * double((bytes + 3) / 4);
}

bool close(double a, double b) {
  return std::fabs(a - b) <= 1e-12 * std::max(1.0, std::fabs(b));
}

}  // namespace

class TestQuantMpi : public QObject, private mpi_harness::World {
  Q_OBJECT

 private:
  // True on every rank iff every rank holds the same values as this one.
  bool same_everywhere(const std::vector<float>& v) {
    std::vector<float> lo = v, hi = v;
    const int n = int(v.size());
    m_stream
        ->enqueue([&] {
          ss::check_mpi(
              MPI_Allreduce(MPI_IN_PLACE, lo.data(), n, MPI_FLOAT, MPI_MIN, MPI_COMM_WORLD),
              "MPI_Allreduce", "world");
          ss::check_mpi(
              MPI_Allreduce(MPI_IN_PLACE, hi.data(), n, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD),
              "MPI_Allreduce", "world");
        })
        ->wait();
    return lo == v && hi == v;
  }

  std::vector<float> my_input(int64_t n) const {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = input(m_rank, i);
    return v;
  }

  // Runs one quantized all-reduce of this rank's input; returns the result,
  // checks the wire bytes against the closed form and the recorded spans.
  std::vector<float> reduce(int64_t n, const QuantSpec& s, uint64_t counter, Verdict& v) {
    Tensor buf = tensor(my_input(n));
    m_rec->take_spans();
    const ss::WireBytes w = ss::quantized_all_reduce(*m_comm, *m_be, buf, s, counter);
    double span_bytes = 0;
    QStringList ops;
    for (const auto& sp : m_rec->take_spans()) {
      if (sp.stream != "comm") continue;
      span_bytes += sp.bytes;
      ops << QString::fromStdString(sp.op);
    }
    const double library = ss::quantized_all_reduce_wire(n, m_size, s);
    const double mine = wire_closed_form(n, m_size, s);
    const QString what = QString::fromStdString(s.str()) + QStringLiteral(" n=%1").arg(n);
    v.expect(
        w.sent == library,
        what + QStringLiteral(": sent %1, quantized_all_reduce_wire %2").arg(w.sent).arg(library));
    v.expect(library == mine,
             what + QStringLiteral(": quantized_all_reduce_wire %1, closed form %2")
                        .arg(library)
                        .arg(mine));
    // The spans' (D-1)/D factor is rounded in double, hence close(), not ==.
    v.expect(close(span_bytes, w.sent),
             what + QStringLiteral(": spans carry %1 bytes, sent %2").arg(span_bytes).arg(w.sent));
    const QString want_ops = m_size == 1    ? QString()
                             : s.is_plain() ? QStringLiteral("all_reduce")
                                            : QStringLiteral("all_to_all,all_gather");
    v.expect(ops.join(",") == want_ops, what + ": comm spans " + ops.join(","));
    v.expect(close(w.fp32, ss::wire_bytes("all_reduce", 4.0 * double(n), m_size)) &&
                 close(w.bf16, ss::wire_bytes("all_reduce", 2.0 * double(n), m_size)),
             what + QStringLiteral(": baselines %1 / %2").arg(w.fp32).arg(w.bf16));
    return host(buf);
  }

 private slots:
  void initTestCase() { set_up(); }
  void cleanupTestCase() { tear_down(); }

  void withinBound_data() {
    QTest::addColumn<Precision>("precision");
    QTest::addColumn<int>("block");
    QTest::addColumn<Rounding>("rounding");
    QTest::addColumn<int>("n");
    const int sizes[] = {1, 7, 1000, 4099, 65537};
    const struct {
      Precision p;
      const char* name;
    } blocks[] = {{Precision::INT8, "int8"}, {Precision::INT4, "int4"}, {Precision::FP8, "fp8"}};
    for (const auto& b : blocks)
      for (int block : {32, 128, 4096})
        for (Rounding r : {Rounding::Nearest, Rounding::Stochastic})
          for (int n : sizes)
            QTest::addRow("%s:%d:%s n=%d", b.name, block, r == Rounding::Nearest ? "rn" : "sr", n)
                << b.p << block << r << n;
    for (int n : sizes) {
      QTest::addRow("bf16 n=%d", n) << Precision::BF16 << 128 << Rounding::Nearest << n;
      QTest::addRow("fp16 n=%d", n) << Precision::FP16 << 128 << Rounding::Nearest << n;
      QTest::addRow("fp32 n=%d", n) << Precision::FP32 << 128 << Rounding::Nearest << n;
    }
  }

  // Every rank ends with the same values, each within its bound of the exact
  // sum (equal to it for fp32, and on a single rank); the bytes sent match
  // the closed form and the recorded spans.
  void withinBound() {
    QFETCH(Precision, precision);
    QFETCH(int, block);
    QFETCH(Rounding, rounding);
    QFETCH(int, n);
    const QuantSpec s = spec_of(precision, block, rounding);
    Verdict v;
    const std::vector<float> got = reduce(n, s, uint64_t(n) << 32, v);
    const Expected want = expected(n, m_size, s);
    for (int64_t i = 0; i < n && v.ok; ++i) {
      const double err = std::fabs(double(got[size_t(i)]) - want.sum[size_t(i)]);
      v.expect(std::isfinite(got[size_t(i)]) && err <= want.bound[size_t(i)],
               QStringLiteral("element %1: %2, exact %3, error %4 over the bound %5")
                   .arg(i)
                   .arg(double(got[size_t(i)]), 0, 'g', 9)
                   .arg(want.sum[size_t(i)], 0, 'g', 9)
                   .arg(err, 0, 'g', 4)
                   .arg(want.bound[size_t(i)], 0, 'g', 4));
    }
    // A quantized reduction that changed nothing would pass any bound: with
    // more than one rank, int4 must visibly move some value.
    if (m_size > 1 && precision == Precision::INT4 && n >= 1000) {
      int64_t moved = 0;
      for (int64_t i = 0; i < n; ++i) moved += double(got[size_t(i)]) != want.sum[size_t(i)];
      v.expect(moved > n / 10,
               QStringLiteral("only %1 of %2 values moved under int4").arg(moved).arg(n));
    }
    v.expect(same_everywhere(got), "ranks ended with different results");
    VERIFY_EVERYWHERE(v);
  }

  // int8 with blocks of 128 sends about a quarter of the fp32 all-reduce:
  // one byte per value plus 4 bytes per 128 (ratio 1.03125 / 4 ~ 0.258).
  void int8SendsAQuarter() {
    if (m_size == 1) QSKIP("a single rank sends nothing");
    const int64_t n = int64_t(1) << 20;
    Verdict v;
    Tensor buf = tensor(my_input(n));
    const ss::WireBytes w = ss::quantized_all_reduce(
        *m_comm, *m_be, buf, spec_of(Precision::INT8, 128, Rounding::Nearest), 1);
    const double ratio = w.sent / w.fp32;
    v.expect(ratio <= 0.27 && ratio > 0.25, QStringLiteral("int8:128 sends %1 of fp32").arg(ratio));
    v.expect(std::fabs(w.bf16 / w.fp32 - 0.5) < 1e-12,
             QStringLiteral("bf16 baseline %1").arg(w.bf16));
    VERIFY_EVERYWHERE(v);
  }

  // Stochastic rounding with a distinct counter per call: each call is off by
  // up to its bound, but the errors average out. The mean of 200 calls is
  // within half the bound of each element (by Hoeffding, failing with
  // probability about 2 exp(-25)), and on average far closer to the exact
  // sum than a single call.
  void stochasticAveragesOut_data() {
    QTest::addColumn<Precision>("precision");
    QTest::newRow("int4:32:sr") << Precision::INT4;
    QTest::newRow("int8:32:sr") << Precision::INT8;
    QTest::newRow("fp8:32:sr") << Precision::FP8;
  }
  void stochasticAveragesOut() {
    QFETCH(Precision, precision);
    if (m_size == 1) QSKIP("a single rank does not quantize");
    constexpr int kCalls = 200;
    const int64_t n = 1000;
    const QuantSpec s = spec_of(precision, 32, Rounding::Stochastic);
    const Expected want = expected(n, m_size, s);
    std::vector<double> mean(size_t(n), 0.0);
    double single = 0;
    Verdict v;
    for (int call = 0; call < kCalls; ++call) {
      Tensor buf = tensor(my_input(n));
      ss::quantized_all_reduce(*m_comm, *m_be, buf, s, uint64_t(call) << 32);
      const std::vector<float> got = host(buf);
      for (int64_t i = 0; i < n; ++i) {
        mean[size_t(i)] += got[size_t(i)] / double(kCalls);
        single += std::fabs(got[size_t(i)] - want.sum[size_t(i)]);
      }
    }
    m_rec->take_spans();
    single /= double(kCalls) * double(n);
    double averaged = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double err = std::fabs(mean[size_t(i)] - want.sum[size_t(i)]);
      averaged += err / double(n);
      v.expect(err <= 0.5 * want.bound[size_t(i)],
               QStringLiteral("element %1: mean of %2 calls %3, exact %4, bound %5")
                   .arg(i)
                   .arg(kCalls)
                   .arg(mean[size_t(i)], 0, 'g', 9)
                   .arg(want.sum[size_t(i)], 0, 'g', 9)
                   .arg(0.5 * want.bound[size_t(i)]));
    }
    // Independent errors shrink as 1/sqrt(200) ~ 0.07; allow 0.2.
    v.expect(averaged <= 0.2 * single,
             QStringLiteral("mean |error| %1 after %2 calls, single calls %3")
                 .arg(averaged)
                 .arg(kCalls)
                 .arg(single));
    VERIFY_EVERYWHERE(v);
  }
};

QTEST_APPLESS_MAIN(TestQuantMpi)
#include "tst_quant_mpi.moc"
