// What the cuda kernel suites share (tst_cuda_ops.cpp, cuda_train_ops.cpp,
// one executable): the cpu backend and the device under test side by side
// (Rigs), tensors with the same values on both (Twin), the tolerance of a
// dtype, and the comparison macros.
#pragma once

#include <QtTest>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"
#include "cuda/runtime.h"

namespace dev = ss::SS_CUDA_NS;
using ss::Category;
using ss::DType;
using ss::Tensor;

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline DType g_dtype = DType::F32;  // this pass of the suite

inline double unit_roundoff(DType t) {
  return t == DType::BF16 ? std::ldexp(1.0, -8) : t == DType::F16 ? std::ldexp(1.0, -11) : 0.0;
}
// Two backends, each within 1e-5 + k u of exact (k roundings), differ by at most twice that.
inline double tolerance(int roundings = 1) {
  return g_dtype == DType::F32 ? 1e-5 : 2.0 * (1e-5 + roundings * unit_roundoff(g_dtype));
}

inline double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = double(got[i]) - double(want[i]);
    num += d * d;
    den += double(want[i]) * want[i];
  }
  if (!std::isfinite(num)) return std::numeric_limits<double>::infinity();
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Values made values of `dt` (exact on upload to either backend).
inline std::vector<float> representable(std::vector<float> v, DType dt) {
  if (dt == DType::F32) return v;
  std::vector<uint16_t> bits(v.size());
  ss::narrow(v.data(), int64_t(v.size()), dt, bits.data());
  ss::widen(bits.data(), dt, int64_t(v.size()), v.data());
  return v;
}

// One tensor on each backend with the same values; for views, the buffers
// they are windows of.
struct Twin {
  Tensor c, d;
  Tensor c_full, d_full;
  int64_t pad = 0;
  // The cpu's tensor or the device's.
  const Tensor& on(bool cpu) const { return cpu ? c : d; }
};

// The cpu backend and the device under test, side by side.
struct Rigs {
  ss::Allocator ca, da;
  ss::Recorder cr, dr;
  ss::CpuBackend cpu{ca, cr};
  dev::CudaBackend gpu{da, dr};
  std::mt19937 rng{20261202};

  std::vector<float> randn(int64_t n, double sd = 1.0, double mean = 0.0, DType dt = g_dtype) {
    std::normal_distribution<double> g(mean, sd);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = float(g(rng));
    return representable(std::move(v), dt);
  }
  Twin make(const ss::Shape& shape, const std::vector<float>& values, DType dt = g_dtype) {
    Twin t;
    t.c = cpu.alloc(shape, Category::Workspace, "test", dt);
    t.d = gpu.alloc(shape, Category::Workspace, "test", dt);
    cpu.upload(t.c, values.data(), DType::F32);
    gpu.upload(t.d, values.data(), DType::F32);
    t.c_full = t.c;
    t.d_full = t.d;
    return t;
  }
  Twin random(const ss::Shape& shape, double sd = 1.0, DType dt = g_dtype) {
    return make(shape, randn(ss::numel(shape), sd, 0.0, dt), dt);
  }
  Twin filled(const ss::Shape& shape, float v, DType dt = g_dtype) {
    return make(shape, std::vector<float>(size_t(ss::numel(shape)), v), dt);
  }
  // rows x cols as the column window [pad, pad + cols) of a buffer whose other columns hold NaN.
  Twin mat(int64_t rows, int64_t cols, int64_t pad, const std::vector<float>& values, DType dt = g_dtype) {
    const int64_t w = cols + 2 * pad;
    std::vector<float> host(size_t(rows * w), kNaN);
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(values.begin() + r * cols, cols, host.begin() + r * w + pad);
    Twin t = make({rows, w}, host, dt);
    t.c = t.c_full.slice(1, pad, cols);
    t.d = t.d_full.slice(1, pad, cols);
    t.pad = pad;
    return t;
  }
  Twin random_mat(int64_t rows, int64_t cols, int64_t pad, double sd = 1.0, DType dt = g_dtype) {
    return mat(rows, cols, pad, randn(rows * cols, sd, 0.0, dt), dt);
  }

  std::vector<float> read(ss::Backend& be, const Tensor& t) {
    Tensor src = t;
    if (!t.is_contiguous()) {
      src = be.alloc(t.shape(), Category::Workspace, "read", t.dtype());
      be.copy(src, t);
    }
    std::vector<float> out(static_cast<size_t>(src.numel()));
    be.download(src, out.data());
    return out;
  }
  std::vector<float> cpu_values(const Twin& t) { return read(cpu, t.c); }
  std::vector<float> gpu_values(const Twin& t) { return read(gpu, t.d); }
  // Every column of the device buffer outside the view still NaN.
  bool padding_intact(const Twin& t) {
    if (t.pad == 0) return true;
    const std::vector<float> all = read(gpu, t.d_full);
    const int64_t w = t.d_full.cols(), cols = t.d.cols();
    for (int64_t r = 0; r < t.d_full.rows(); ++r)
      for (int64_t c = 0; c < w; ++c)
        if ((c < t.pad || c >= t.pad + cols) && !std::isnan(all[size_t(r * w + c)])) return false;
    return true;
  }
};

// An SSD scan's inputs on both sides, forward and backward: H heads of P
// channels, G groups of B and C with N states each.
struct SsdTwins {
  int H, G, P, N;
  Twin x, dt, dt_bias, A_log, D, B, C;
  SsdTwins(Rigs& r, int64_t T, int heads, int groups, int head_dim, int d_state)
      : H(heads), G(groups), P(head_dim), N(d_state),
        x(r.random_mat(T, int64_t(H) * P, 1)), dt(r.random_mat(T, H, 2, 1.0)), dt_bias(r.random({H}, 0.5)),
        A_log(r.random({H}, 0.5)), D(r.random({H})), B(r.random_mat(T, int64_t(G) * N, 3)),
        C(r.random_mat(T, int64_t(G) * N, 1)) {}
  // One side's arguments, without outputs or states; dt clamped to [0.001, dt_max].
  ss::SsdArgs args(bool cpu, float dt_max) const {
    ss::SsdArgs a;
    a.x = x.on(cpu);
    a.dt = dt.on(cpu);
    a.dt_bias = dt_bias.on(cpu);
    a.A_log = A_log.on(cpu);
    a.D = D.on(cpu);
    a.B = B.on(cpu);
    a.C = C.on(cpu);
    a.n_heads = H;
    a.head_dim = P;
    a.n_groups = G;
    a.d_state = N;
    a.dt_min = 0.001f;
    a.dt_max = dt_max;
    return a;
  }
};

#define VERIFY_TWIN_TOL(rigs, twin, what, tol)                                                                     \
  do {                                                                                                           \
    const double err_ = rel_l2((rigs).gpu_values(twin), (rigs).cpu_values(twin)), tol_ = (tol);                 \
    QVERIFY2(err_ <= tol_, qPrintable(QStringLiteral("%1: cuda vs cpu relative L2 %2 > %3")                      \
                                          .arg(QStringLiteral(what))                                           \
                                          .arg(err_)                                                           \
                                          .arg(tol_)));                                                        \
    QVERIFY2((rigs).padding_intact(twin), qPrintable(QStringLiteral("%1: wrote outside its view").arg(what))); \
  } while (0)
#define VERIFY_TWIN(rigs, twin, what) VERIFY_TWIN_TOL(rigs, twin, what, tolerance())

inline std::vector<int32_t> iota_pos(int64_t n, int32_t first = 0) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), first);
  return p;
}

// zigzag chunks {r, 2S-1-r} of a sequence of T tokens, for rank r of S.
inline std::vector<int32_t> zigzag_pos(int64_t T, int S, int r) {
  std::vector<int32_t> p;
  const int64_t chunk = T / (2 * S);
  for (int64_t c : {int64_t(r), int64_t(2 * S - 1 - r)})
    for (int64_t i = 0; i < chunk; ++i) p.push_back(int32_t(c * chunk + i));
  return p;
}

// "skipped: no CUDA device (why)" where this build's device cannot be used
// (the emulated build's always can), else "".
inline QString no_device() {
  const std::string why = dev::unavailable_reason();
  return why.empty() ? QString() : QStringLiteral("skipped: no CUDA device (%1)").arg(QString::fromStdString(why));
}

// Runs test object `t` on the command line's options and those of its
// function names that `t` has ("name" or "name:tag"), returning QTest's
// count of failures; kNotItsFunctions without running it when functions were
// named and none is its. The suites of one executable each take their own.
inline constexpr int kNotItsFunctions = -1;
inline int exec_own_functions(QObject& t, int argc, char** argv) {
  std::vector<char*> args = {argv[0]};
  bool named = false, own = false;
  for (int i = 1; i < argc; ++i) {
    const QByteArray a = argv[i];
    if (a.startsWith('-')) {
      args.push_back(argv[i]);
      if ((a == "-o" || a == "-maxwarnings" || a == "-eventdelay" || a == "-keydelay" || a == "-mousedelay") &&
          i + 1 < argc)
        args.push_back(argv[++i]);
      continue;
    }
    named = true;
    const QByteArray fn = a.left(a.indexOf(':') < 0 ? a.size() : a.indexOf(':'));
    if (t.metaObject()->indexOfMethod(fn + "()") >= 0) {
      args.push_back(argv[i]);
      own = true;
    }
  }
  if (named && !own) return kNotItsFunctions;
  return QTest::qExec(&t, int(args.size()), args.data());
}
