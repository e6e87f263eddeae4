// The kernels suite (tst_kernels.cpp, kernels_scan.cpp): its helpers and the
// test class, whose tests the two files define.
//
// Every kernel of the cpu backend, called through the public Backend methods,
// against the naive float64 references of reference.h, in each compute dtype
// (the suite runs three times: fp32, bf16, fp16). Inputs are random (seeded)
// and drawn as values of the dtype, so kernel and reference see the same
// numbers; tensors the engine keeps in fp32 (SSM states, lse, chunk decays,
// norm sums) are fp32 here too.
//
// Tolerance. The kernels compute in fp32 and round each output once to the
// dtype, to nearest even: |stored - exact| <= u |exact| per element, so the
// relative L2 error is at most u, the dtype's unit roundoff (bf16: 8
// significant bits, u = 2^-8; fp16: 11, u = 2^-11; fp32: the fp32 arithmetic
// itself, 1e-5 as before), plus the fp32 arithmetic's 1e-5. An output that is
// stored and then added to (a state-passing correction into y) is rounded
// twice: 2u. In bf16, attention's P·V and the SSD scan's products also round
// an fp32 operand (the probabilities; the decay mask, weighted B and state)
// to bf16: each such error, at most 2^-9 relative per term, enters a sum of
// many terms of mixed sign and adds about u/sqrt(3)/sqrt(terms) to the RMS
// error, well inside the same bound (the output rounding alone is u/sqrt(3)
// in RMS). Views are column windows of wider buffers whose padding holds NaN:
// a kernel that reads the padding poisons its result, one that writes it is
// caught directly.
#pragma once

#include <QtTest>
#include <algorithm>
#include <array>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/backend_checks.h"
#include "cpu/cpu_backend.h"
#include "reference.h"

using ss::Category;
using ss::Tensor;

// The compute dtype of this pass of the suite (main runs it once per dtype).
inline ss::DType g_dtype = ss::DType::F32;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

inline double unit_roundoff(ss::DType t) {
  switch (t) {
    case ss::DType::BF16: return std::ldexp(1.0, -8);
    case ss::DType::F16: return std::ldexp(1.0, -11);
    default: return 0.0;
  }
}
// The bound for an output rounded `roundings` times (see the top of the file).
inline double tolerance(int roundings = 1) { return 1e-5 + roundings * unit_roundoff(g_dtype); }

// fp32 values made values of the dtype (exact on upload).
inline std::vector<float> representable(std::vector<float> v) {
  if (g_dtype == ss::DType::F32) return v;
  std::vector<uint16_t> bits(v.size());
  ss::narrow(v.data(), int64_t(v.size()), g_dtype, bits.data());
  ss::widen(bits.data(), g_dtype, int64_t(v.size()), v.data());
  return v;
}

#define VERIFY_CLOSE_TOL(got, want, what, tol)                                       \
  do {                                                                               \
    const double err_ = ref::rel_l2(got, want), tol_ = (tol);                        \
    QVERIFY2(err_ <= tol_, qPrintable(QStringLiteral("%1: relative L2 error %2 > %3") \
                                          .arg(QStringLiteral(what))                 \
                                          .arg(err_)                                 \
                                          .arg(tol_)));                              \
  } while (0)
#define VERIFY_CLOSE(got, want, what) VERIFY_CLOSE_TOL(got, want, what, tolerance())

// A result in the view of a Mat: close to its reference, and the padding
// around the view untouched.
#define VERIFY_MAT(mat, want, what)             \
  do {                                          \
    VERIFY_CLOSE(read((mat).view), want, what); \
    QVERIFY(padding_intact(mat));               \
  } while (0)

// The rows of a data-driven test: one Case (a struct of the test's
// parameters) a row, in the column "c", which the test reads with fetch().
template <class Case>
void add_rows(std::initializer_list<std::pair<const char*, Case>> rows) {
  QTest::addColumn<Case>("c");
  for (const auto& [name, c] : rows) QTest::newRow(name) << c;
}

template <class Case>
Case fetch() {
  QFETCH(Case, c);
  return c;
}

inline std::vector<float> randn(std::mt19937& g, size_t n, double mean = 0.0, double sd = 1.0) {
  std::normal_distribution<double> d(mean, sd);
  std::vector<float> v(n);
  for (float& x : v) x = float(d(g));
  return representable(std::move(v));
}

// A 2-D matrix on the backend: `view` is rows x cols; with pad > 0 it is the
// column window [pad, pad + cols) of a [rows, cols + 2 pad] buffer whose other
// columns hold NaN.
struct Mat {
  Tensor full, view;
  int64_t pad = 0;
};

// One device: an unlimited allocator, a recorder and the cpu backend.
struct Rig {
  ss::Allocator alloc;
  ss::Recorder rec;
  ss::CpuBackend be{alloc, rec};

  // A tensor in the suite's dtype ...
  Tensor tensor(const ss::Shape& shape, const std::vector<float>& values) { return make(shape, values, g_dtype); }
  // ... and one the engine keeps in fp32 whatever the dtype (states, lse, sums).
  Tensor f32(const ss::Shape& shape, const std::vector<float>& values) { return make(shape, values, ss::DType::F32); }
  Tensor f32_filled(const ss::Shape& shape, float fill) {
    return f32(shape, std::vector<float>(size_t(ss::numel(shape)), fill));
  }
  Tensor make(const ss::Shape& shape, const std::vector<float>& values, ss::DType dt) {
    Tensor t = be.alloc(shape, Category::Workspace, "test", dt);
    be.upload(t, values.data(), ss::DType::F32);
    return t;
  }
  // A tensor with every element `fill`.
  Tensor filled(const ss::Shape& shape, float fill) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return tensor(shape, std::vector<float>(size_t(n), fill));
  }

  Mat mat(int64_t rows, int64_t cols, int64_t pad, const std::vector<float>& values) {
    const int64_t w = cols + 2 * pad;
    std::vector<float> host(size_t(rows * w), kNaN);
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(values.begin() + r * cols, cols, host.begin() + r * w + pad);
    Mat m;
    m.full = tensor({rows, w}, host);
    m.view = m.full.slice(1, pad, cols);
    m.pad = pad;
    return m;
  }
  // A Mat whose view holds `fill` everywhere (an output).
  Mat filled_mat(int64_t rows, int64_t cols, int64_t pad, float fill) {
    return mat(rows, cols, pad, std::vector<float>(size_t(rows * cols), fill));
  }
};

// The values of a tensor (a 2-D view of any row stride, or a contiguous tensor).
inline std::vector<float> read(const Tensor& t) {
  std::vector<float> out(size_t(t.numel()));
  if (t.is_contiguous()) {
    ss::widen(t.raw(), t.dtype(), t.numel(), out.data());
    return out;
  }
  for (int64_t r = 0; r < t.rows(); ++r) ss::widen(t.row_ptr(r), t.dtype(), t.cols(), out.data() + r * t.cols());
  return out;
}

// True when every column outside the view still holds NaN.
inline bool padding_intact(const Mat& m) {
  const std::vector<float> all = read(m.full);
  const int64_t w = m.full.cols(), cols = m.view.cols();
  for (int64_t r = 0; r < m.full.rows(); ++r)
    for (int64_t c = 0; c < w; ++c)
      if ((c < m.pad || c >= m.pad + cols) && !std::isnan(all[size_t(r * w + c)])) return false;
  return true;
}

inline std::vector<int32_t> iota_pos(int64_t n, int32_t first = 0) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), first);
  return p;
}

// One of the row-major matrices that side_by_side() joins: `width` columns.
template <class T>
struct Part {
  const std::vector<T>& values;
  int64_t width;
};

// Row t of every part in turn, for each of `rows` rows: the matrices side by
// side, as one fused projection writes them (q | k | v, x | B | C | dt).
template <class T>
std::vector<float> side_by_side(int64_t rows, std::initializer_list<Part<T>> parts) {
  std::vector<float> all;
  for (int64_t t = 0; t < rows; ++t)
    for (const Part<T>& p : parts)
      all.insert(all.end(), p.values.begin() + t * p.width, p.values.begin() + (t + 1) * p.width);
  return all;
}

}  // namespace

class TestKernels : public QObject {
  Q_OBJECT

  // The parameters of the data-driven tests, one struct a row (add_rows).
  struct MatmulCase;
  struct RmsnormCase;
  struct GatedRmsnormCase;
  struct RopeCase;
  struct AttentionCase;
  struct AttentionMergeCase;
  struct Conv1dCase;
  struct Conv1dCarriesCase;
  struct SsdScanCase;
  struct SelectiveScanCase;
  struct SelectivePassingCase;
  struct SsdPassingCase;
  struct GatedNormRanksCase;

 private slots:
  void matmul_data();
  void matmul();
  void matmul_group();
  void embedding();
  void argmax_row();
  void rmsnorm_data();
  void rmsnorm();
  void gated_rmsnorm_data();
  void gated_rmsnorm();
  void rope_data();
  void rope();
  void attention_data();
  void attention();
  void attention_merge_data();
  void attention_merge();
  void visible_pairs();
  void silu_mul();
  void add();
  void copy();
  void conv1d_causal_data();
  void conv1d_causal();
  void conv1d_state_carries_data();
  void conv1d_state_carries();
  void ssd_scan_data();
  void ssd_scan();
  void ssd_scan_state_carries();
  void selective_scan_data();
  void selective_scan();
  void selective_state_passing_data();
  void selective_state_passing();
  void ssd_state_passing_data();
  void ssd_state_passing();
  void gated_norm_across_ranks_data();
  void gated_norm_across_ranks();
};
