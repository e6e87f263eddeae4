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
// in RMS). Views are
// column windows of wider buffers whose padding holds NaN: a kernel that reads
// the padding poisons its result, one that writes it is caught directly.
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

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The compute dtype of this pass of the suite (main runs it once per dtype).
ss::DType g_dtype = ss::DType::F32;

double unit_roundoff(ss::DType t) {
  switch (t) {
    case ss::DType::BF16: return std::ldexp(1.0, -8);
    case ss::DType::F16: return std::ldexp(1.0, -11);
    default: return 0.0;
  }
}
// The bound for an output rounded `roundings` times (see the top of the file).
double tolerance(int roundings = 1) { return 1e-5 + roundings * unit_roundoff(g_dtype); }

// fp32 values made values of the dtype (exact on upload).
std::vector<float> representable(std::vector<float> v) {
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

std::vector<float> randn(std::mt19937& g, size_t n, double mean = 0.0, double sd = 1.0) {
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
std::vector<float> read(const Tensor& t) {
  std::vector<float> out(size_t(t.numel()));
  if (t.is_contiguous()) {
    ss::widen(t.raw(), t.dtype(), t.numel(), out.data());
    return out;
  }
  for (int64_t r = 0; r < t.rows(); ++r) ss::widen(t.row_ptr(r), t.dtype(), t.cols(), out.data() + r * t.cols());
  return out;
}

// True when every column outside the view still holds NaN.
bool padding_intact(const Mat& m) {
  const std::vector<float> all = read(m.full);
  const int64_t w = m.full.cols(), cols = m.view.cols();
  for (int64_t r = 0; r < m.full.rows(); ++r)
    for (int64_t c = 0; c < w; ++c)
      if ((c < m.pad || c >= m.pad + cols) && !std::isnan(all[size_t(r * w + c)])) return false;
  return true;
}

std::vector<int32_t> iota_pos(int64_t n, int32_t first = 0) {
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

struct TestKernels::MatmulCase {
  int M, N, K, pad;
  bool accumulate;
};

void TestKernels::matmul_data() {
  add_rows<MatmulCase>({
      {"contiguous", {17, 23, 31, 0, false}},
      {"contiguous accumulate", {17, 23, 31, 0, true}},
      {"strided rows", {33, 20, 48, 3, false}},
      {"strided rows accumulate", {33, 20, 48, 5, true}},
      {"one row accumulate", {1, 64, 64, 2, true}},
      {"larger", {130, 96, 200, 1, false}},
  });
}

void TestKernels::matmul() {
  const auto [M, N, K, pad, accumulate] = fetch<MatmulCase>();
  std::mt19937 g(uint32_t(M * 1000 + N * 10 + K));
  const auto xv = randn(g, size_t(M) * K), wv = randn(g, size_t(N) * K),
             yv = randn(g, size_t(M) * N);
  Rig r;
  Mat x = r.mat(M, K, pad, xv), w = r.mat(N, K, pad, wv), y = r.mat(M, N, pad, yv);
  r.be.matmul(y.view, x.view, w.view, accumulate);
  const ref::Vec y0 = ref::to_double(yv);
  const ref::Vec want =
      ref::matmul(ref::to_double(xv), ref::to_double(wv), M, N, K, accumulate ? &y0 : nullptr);
  VERIFY_MAT(y, want, "y");
}

// Projections that share their input (q, k, v) in one call: each output as
// the float64 reference and bit for bit as its own matmul, in one gemm span
// [M, sum N, K]. Decode rows take the one-pass GEMV (tasks of 64 columns run
// across the weights' ends: N = 70, 20, 20); 9 rows take the GEMM per weight.
// The last output is fp32 whatever the suite's dtype, as a cache of another
// dtype than the activations would be.
void TestKernels::matmul_group() {
  for (int64_t M : {1, 3, 9}) {
    const int64_t K = 100, Ns[3] = {70, 20, 20};
    std::mt19937 g(uint32_t(M * 31 + 5));
    const auto xv = randn(g, size_t(M) * K);
    Rig r;
    Mat x = r.mat(M, K, 2, xv);
    std::vector<std::vector<float>> wv;
    std::vector<Mat> w, y, alone;
    for (int i = 0; i < 3; ++i) {
      wv.push_back(randn(g, size_t(Ns[i] * K)));
      w.push_back(r.mat(Ns[i], K, 1, wv.back()));
      y.push_back(r.filled_mat(M, Ns[i], 3, 0.0f));
      alone.push_back(r.filled_mat(M, Ns[i], 3, 0.0f));
    }
    Tensor y_f32 = r.f32_filled({M, Ns[2]}, 0.0f), alone_f32 = r.f32_filled({M, Ns[2]}, 0.0f);
    r.rec.clear();
    r.be.matmul_group(std::array{y[0].view, y[1].view, y_f32}, x.view, std::array{w[0].view, w[1].view, w[2].view});
    const auto spans = r.rec.take_spans();
    QCOMPARE(int(spans.size()), 1);
    QCOMPARE(spans[0].op, std::string("gemm"));
    QCOMPARE(spans[0].dims, (std::vector<int64_t>{M, 110, K}));
    for (int i = 0; i < 3; ++i) {
      r.be.matmul(i < 2 ? alone[size_t(i)].view : alone_f32, x.view, w[size_t(i)].view);
      const ref::Vec want = ref::matmul(ref::to_double(xv), ref::to_double(wv[size_t(i)]), M, Ns[i], K, nullptr);
      const Tensor got = i < 2 ? y[size_t(i)].view : y_f32;
      if (i < 2) VERIFY_MAT(y[size_t(i)], want, "y");
      else VERIFY_CLOSE(read(got), want, "y (fp32)");
      QCOMPARE(read(got), read(i < 2 ? alone[size_t(i)].view : alone_f32));
    }
  }
}

void TestKernels::embedding() {
  std::mt19937 g(7);
  const int V = 50, d = 24, T = 40;
  const auto table = randn(g, size_t(V) * d);
  std::vector<int32_t> tokens(T);
  std::uniform_int_distribution<int> tok(0, V - 1);
  for (auto& t : tokens) t = tok(g);
  tokens[0] = 0;
  tokens[1] = V - 1;
  tokens[2] = tokens[3];  // a repeated token
  Rig r;
  Mat tab = r.mat(V, d, 2, table), y = r.filled_mat(T, d, 3, 0.0f);
  r.be.embedding(y.view, tab.view, tokens);
  const auto got = read(y.view);
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < d; ++c)
      QCOMPARE(got[size_t(t * d + c)], table[size_t(tokens[size_t(t)] * d + c)]);
  QVERIFY(padding_intact(y));
}

void TestKernels::argmax_row() {
  std::mt19937 g(11);
  const int rows = 5, cols = 300;
  const auto v = randn(g, size_t(rows) * cols);
  Rig r;
  Mat x = r.mat(rows, cols, 4, v);
  for (int row = 0; row < rows; ++row) {
    const auto first = v.begin() + row * cols;
    QCOMPARE(r.be.argmax_row(x.view, row), int32_t(std::max_element(first, first + cols) - first));
  }
}

struct TestKernels::RmsnormCase {
  int T, n, group;
  bool weight;
  int pad;
  bool in_place;
  double scale;  // of x; at 1e-3 the mean square is near eps
};

void TestKernels::rmsnorm_data() {
  add_rows<RmsnormCase>({
      {"plain", {7, 64, 64, true, 0, false, 1.0}},
      {"no weight", {7, 64, 64, false, 0, false, 1.0}},
      {"grouped", {9, 96, 24, true, 0, false, 1.0}},
      {"grouped no weight", {9, 96, 32, false, 0, false, 1.0}},
      {"strided", {13, 40, 40, true, 3, false, 1.0}},
      {"strided in place no weight", {13, 48, 16, false, 2, true, 1.0}},
      {"small values, grouped", {5, 64, 16, true, 0, false, 1e-3}},
  });
}

void TestKernels::rmsnorm() {
  const auto [T, n, group, weight, pad, in_place, scale] = fetch<RmsnormCase>();
  std::mt19937 g(uint32_t(T * 131 + n + group));
  const auto xv = randn(g, size_t(T) * n, 0.3 * scale, 2.0 * scale),
             wv = randn(g, size_t(n), 1.0, 0.2);
  Rig r;
  Mat x = r.mat(T, n, pad, xv);
  Mat y = in_place ? x : r.filled_mat(T, n, pad, 0.0f);
  const Tensor w = weight ? r.tensor({n}, wv) : Tensor{};
  const float eps = 1e-5f;
  r.be.rmsnorm(y.view, x.view, w, eps, group);
  const ref::Vec wd = ref::to_double(wv);
  const ref::Vec want =
      ref::rmsnorm(ref::to_double(xv), nullptr, weight ? &wd : nullptr, T, n, group, eps);
  VERIFY_MAT(y, want, "y");
}

struct TestKernels::GatedRmsnormCase {
  int T, n, group, pad;
  bool in_place;
};

void TestKernels::gated_rmsnorm_data() {
  add_rows<GatedRmsnormCase>({
      {"one group", {6, 64, 64, 0, false}},
      {"four groups", {11, 128, 32, 0, false}},
      {"strided z, in place", {10, 96, 48, 4, true}},
  });
}

void TestKernels::gated_rmsnorm() {
  const auto [T, n, group, pad, in_place] = fetch<GatedRmsnormCase>();
  std::mt19937 g(uint32_t(T * 17 + n + group));
  const auto xv = randn(g, size_t(T) * n), zv = randn(g, size_t(T) * n, 0.0, 2.0),
             wv = randn(g, size_t(n), 1.0, 0.2);
  Rig r;
  Mat x = r.mat(T, n, pad, xv), z = r.mat(T, n, pad, zv);
  Mat y = in_place ? x : r.filled_mat(T, n, pad, 0.0f);
  const Tensor w = r.tensor({n}, wv);
  const float eps = 1e-5f;
  r.be.gated_rmsnorm(y.view, x.view, z.view, w, eps, group);
  const ref::Vec zd = ref::to_double(zv), wd = ref::to_double(wv);
  const ref::Vec want = ref::rmsnorm(ref::to_double(xv), &zd, &wd, T, n, group, eps);
  VERIFY_MAT(y, want, "y");
}

struct TestKernels::RopeCase {
  int T, n_heads, head_dim;
  double theta;
  QString positions;
  int pad;
  bool scaled = false;  // frequencies slowed from the fourth on, as rope_scaling makes them
};

void TestKernels::rope_data() {
  add_rows<RopeCase>({
      {"from zero", {20, 4, 16, 10000.0, "from zero", 0}},
      {"decode at 4097", {1, 8, 64, 10000.0, "offset", 0}},
      {"scattered, theta 5e5", {33, 2, 128, 500000.0, "scattered", 0}},
      {"strided k heads", {17, 2, 32, 10000.0, "scattered", 5}},
      {"scaled frequencies", {21, 3, 16, 500000.0, "offset", 3, true}},
  });
}

void TestKernels::rope() {
  const auto [T, n_heads, head_dim, theta, positions, pad, scaled] = fetch<RopeCase>();
  std::mt19937 g(uint32_t(T * 7 + n_heads + head_dim));
  std::vector<int32_t> pos;
  if (positions == "from zero") {
    pos = iota_pos(T);
  } else if (positions == "offset") {
    pos = iota_pos(T, 4097);
  } else {
    std::uniform_int_distribution<int32_t> d(0, 200000);
    for (int t = 0; t < T; ++t) pos.push_back(d(g));
  }
  const int cols = n_heads * head_dim;
  const auto xv = randn(g, size_t(T) * cols);
  Rig r;
  Mat x = r.mat(T, cols, pad, xv);
  std::vector<double> freqs = ref::rope_freqs(theta, head_dim);
  if (scaled)
    for (size_t i = 3; i < freqs.size(); ++i) freqs[i] /= 8.0 + double(i);
  r.be.rope(x.view, n_heads, head_dim, pos, freqs);
  const ref::Vec want = ref::rope(ref::to_double(xv), T, n_heads, head_dim, pos, freqs);
  VERIFY_MAT(x, want, "x");
}

namespace {

// Query and key positions of an attention test row.
//   prefill:   Tq == Tk, both 0..T-1
//   suffix:    keys 0..Tk-1, queries the last Tq of them (chunked prefill, decode)
//   zigzag:    L = Tk tokens in 2D chunks, rank r holds chunks {r, 2D-1-r};
//              keys are all-gathered in rank order (so not sorted), the
//              queries are rank `rank`'s tokens
//   shuffled:  keys a random permutation of 0..Tk-1, queries random positions
//   gaps:      keys at 100 + 3j, queries anywhere in [0, 100 + 3Tk), some
//              before every key (they see nothing: o = 0, lse = -inf)
void make_positions(const QString& mode, int Tq, int Tk, std::mt19937& g,
                    std::vector<int32_t>& q_pos, std::vector<int32_t>& k_pos) {
  q_pos.clear();
  k_pos.clear();
  if (mode == "prefill") {
    q_pos = k_pos = iota_pos(Tk);
  } else if (mode == "suffix") {
    k_pos = iota_pos(Tk);
    q_pos = iota_pos(Tq, Tk - Tq);
  } else if (mode == "zigzag") {
    const int D = 3, rank = 1, chunk = Tk / (2 * D);
    auto chunk_pos = [&](int c, std::vector<int32_t>& out) {
      for (int i = 0; i < chunk; ++i) out.push_back(c * chunk + i);
    };
    for (int r = 0; r < D; ++r) {
      chunk_pos(r, k_pos);
      chunk_pos(2 * D - 1 - r, k_pos);
    }
    chunk_pos(rank, q_pos);
    chunk_pos(2 * D - 1 - rank, q_pos);
  } else if (mode == "shuffled") {
    k_pos = iota_pos(Tk);
    std::shuffle(k_pos.begin(), k_pos.end(), g);
    std::uniform_int_distribution<int32_t> d(0, Tk - 1);
    for (int i = 0; i < Tq; ++i) q_pos.push_back(d(g));
  } else if (mode == "gaps") {
    for (int j = 0; j < Tk; ++j) k_pos.push_back(100 + 3 * j);
    std::uniform_int_distribution<int32_t> d(0, 100 + 3 * Tk);
    for (int i = 0; i < Tq; ++i) q_pos.push_back(i < 3 ? 40 * i : d(g));
  }
}

// Attention with the scale 1/sqrt(head_dim); the arguments view q_pos and
// k_pos, which must outlive them.
ss::AttentionArgs attention_args(int n_heads, int n_kv_heads, int head_dim,
                                 const std::vector<int32_t>& q_pos,
                                 const std::vector<int32_t>& k_pos) {
  ss::AttentionArgs a;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads;
  a.head_dim = head_dim;
  a.scale = 1.0f / std::sqrt(float(head_dim));
  a.q_pos = q_pos;
  a.k_pos = k_pos;
  return a;
}

// lse values compared where finite; where the reference is -inf the kernel must be too.
void verify_lse(const std::vector<float>& got, const ref::Vec& want) {
  QCOMPARE(got.size(), want.size());
  std::vector<float> g;
  ref::Vec w;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i])) {
      QVERIFY2(std::isinf(got[i]) && got[i] < 0, "a query that sees no key must get lse = -inf");
    } else {
      g.push_back(got[i]);
      w.push_back(want[i]);
    }
  }
  VERIFY_CLOSE(g, w, "lse");
}

}  // namespace

struct TestKernels::AttentionCase {
  int Tq, Tk, n_heads, n_kv_heads, head_dim;
  QString positions;
  bool packed;  // q, k, v column windows of one [T, q|k|v] buffer
};

void TestKernels::attention_data() {
  add_rows<AttentionCase>({
      {"prefill 200, GQA", {200, 200, 4, 2, 32, "prefill", false}},
      {"prefill 600, MHA", {600, 600, 2, 2, 16, "prefill", false}},
      {"prefill 150, packed qkv", {150, 150, 4, 1, 16, "prefill", true}},
      {"decode Tq=1 Tk=777, MQA", {1, 777, 8, 1, 64, "suffix", false}},
      {"decode Tq=3 Tk=600, head_dim 128", {3, 600, 4, 2, 128, "suffix", false}},
      {"decode Tq=2 Tk=70, head_dim 24", {2, 70, 2, 1, 24, "suffix", false}},
      {"decode Tq=1 Tk=300, groups of 6", {1, 300, 12, 2, 64, "suffix", false}},
      {"decode Tq=4 over shuffled keys", {4, 500, 8, 2, 64, "shuffled", false}},
      {"decode Tq=4, three queries before all keys", {4, 333, 4, 1, 128, "gaps", false}},
      {"chunk Tq=37 Tk=1100", {37, 1100, 4, 2, 32, "suffix", false}},
      {"zigzag rank 1 of 3, L=1200", {400, 1200, 4, 2, 32, "zigzag", false}},
      {"shuffled keys 300/700", {300, 700, 2, 1, 16, "shuffled", false}},
      {"gaps, queries before all keys", {50, 530, 3, 3, 8, "gaps", false}},
  });
}

void TestKernels::attention() {
  const auto [Tq, Tk, n_heads, n_kv_heads, head_dim, positions, packed] = fetch<AttentionCase>();
  std::mt19937 g(uint32_t(Tq * 31 + Tk + n_heads * 7 + head_dim));
  std::vector<int32_t> q_pos, k_pos;
  make_positions(positions, Tq, Tk, g, q_pos, k_pos);
  QCOMPARE(int(q_pos.size()), Tq);
  QCOMPARE(int(k_pos.size()), Tk);
  const int hq = n_heads * head_dim, hkv = n_kv_heads * head_dim;
  // Spread scores so the softmax is far from uniform.
  const auto qv = randn(g, size_t(Tq) * hq, 0.0, 1.5), kv = randn(g, size_t(Tk) * hkv, 0.0, 1.5),
             vv = randn(g, size_t(Tk) * hkv);
  Rig r;
  Tensor q, k, v;
  Mat qkv;
  if (packed) {  // one fused projection output [T, q | k | v], as a QKV GEMM writes it
    qkv = r.mat(Tq, hq + 2 * hkv, 1, side_by_side<float>(Tq, {{qv, hq}, {kv, hkv}, {vv, hkv}}));
    q = qkv.view.slice(1, 0, hq);
    k = qkv.view.slice(1, hq, hkv);
    v = qkv.view.slice(1, hq + hkv, hkv);
  } else {
    q = r.mat(Tq, hq, 0, qv).view;
    k = r.mat(Tk, hkv, 0, kv).view;
    v = r.mat(Tk, hkv, 0, vv).view;
  }
  Mat o = r.filled_mat(Tq, hq, packed ? 2 : 0, kNaN);
  const Tensor lse = r.f32_filled({Tq, n_heads}, kNaN);
  const ss::AttentionArgs a = attention_args(n_heads, n_kv_heads, head_dim, q_pos, k_pos);
  r.be.attention(o.view, q, k, v, a, lse);

  ref::Vec want_lse;
  const ref::Vec want =
      ref::attention(ref::to_double(qv), ref::to_double(kv), ref::to_double(vv), Tq, Tk, n_heads,
                     n_kv_heads, head_dim, a.scale, q_pos, k_pos, &want_lse);
  VERIFY_CLOSE(read(o.view), want, "o");
  verify_lse(read(lse), want_lse);
  if (packed) QVERIFY(padding_intact(o));

  // Without lse the output is the same.
  Mat o2 = r.filled_mat(Tq, hq, 0, kNaN);
  r.be.attention(o2.view, q, k, v, a);
  VERIFY_CLOSE(read(o2.view), want, "o without lse");
}

struct TestKernels::AttentionMergeCase {
  int T;
  QString split;
};

void TestKernels::attention_merge_data() {
  add_rows<AttentionMergeCase>({
      {"random split of 300", {300, "random"}},
      {"halves of 700 (late queries see both)", {700, "halves"}},
      {"zigzag ranks 0 and 1 of 2", {256, "zigzag"}},
  });
}

// Attention over keys split into two disjoint sets, each attended with its
// lse and merged, equals attention over all keys.
void TestKernels::attention_merge() {
  const auto [T, split] = fetch<AttentionMergeCase>();
  const int n_heads = 4, n_kv_heads = 2, head_dim = 16, hq = n_heads * head_dim,
            hkv = n_kv_heads * head_dim;
  std::mt19937 g(uint32_t(T) + uint32_t(split.size()));
  const std::vector<int32_t> pos = iota_pos(T);
  std::vector<char> in_first(static_cast<size_t>(T));
  if (split == "random") {
    std::bernoulli_distribution b(0.4);
    for (auto& f : in_first) f = b(g);
  } else if (split == "halves") {
    for (int t = 0; t < T; ++t) in_first[size_t(t)] = t < T / 2;
  } else {  // zigzag: 4 chunks, rank 0 holds {0, 3}, rank 1 holds {1, 2}
    for (int t = 0; t < T; ++t) in_first[size_t(t)] = (t / (T / 4)) % 3 == 0;
  }
  const auto qv = randn(g, size_t(T) * hq, 0.0, 1.5), kv = randn(g, size_t(T) * hkv, 0.0, 1.5),
             vv = randn(g, size_t(T) * hkv);
  // Gather each set's keys and values (rows of kv, vv) with their positions.
  std::vector<float> k_set[2], v_set[2];
  std::vector<int32_t> pos_set[2];
  for (int t = 0; t < T; ++t) {
    const int s = in_first[size_t(t)] ? 0 : 1;
    k_set[s].insert(k_set[s].end(), kv.begin() + t * hkv, kv.begin() + (t + 1) * hkv);
    v_set[s].insert(v_set[s].end(), vv.begin() + t * hkv, vv.begin() + (t + 1) * hkv);
    pos_set[s].push_back(t);
  }
  QVERIFY(!pos_set[0].empty() && !pos_set[1].empty());

  Rig r;
  const Tensor q = r.tensor({T, hq}, qv);
  Tensor o[2], lse[2];
  for (int s = 0; s < 2; ++s) {
    const int64_t Tk = int64_t(pos_set[s].size());
    const Tensor k = r.tensor({Tk, hkv}, k_set[s]), v = r.tensor({Tk, hkv}, v_set[s]);
    o[s] = r.be.alloc({T, hq}, Category::Workspace, "o");
    lse[s] = r.be.alloc({T, n_heads}, Category::Workspace, "lse");
    const ss::AttentionArgs a = attention_args(n_heads, n_kv_heads, head_dim, pos, pos_set[s]);
    r.be.attention(o[s], q, k, v, a, lse[s]);
  }
  r.be.attention_merge(o[0], lse[0], o[1], lse[1], n_heads, head_dim);

  ref::Vec want_lse;
  const ref::Vec want = ref::attention(
      ref::to_double(qv), ref::to_double(kv), ref::to_double(vv), T, T, n_heads, n_kv_heads,
      head_dim, 1.0 / std::sqrt(double(float(head_dim))), pos, pos, &want_lse);
  VERIFY_CLOSE(read(o[0]), want, "merged o");
  verify_lse(read(lse[0]), want_lse);
}

void TestKernels::silu_mul() {
  std::mt19937 g(3);
  const int T = 19, n = 70;
  const auto gv = randn(g, size_t(T) * n, 0.0, 3.0), uv = randn(g, size_t(T) * n);
  ref::Vec want(gv.size());
  for (size_t i = 0; i < gv.size(); ++i) want[i] = ref::silu(gv[i]) * double(uv[i]);
  {
    Rig r;
    Mat gate = r.mat(T, n, 2, gv), up = r.mat(T, n, 1, uv), y = r.filled_mat(T, n, 3, 0.0f);
    r.be.silu_mul(y.view, gate.view, up.view);
    VERIFY_MAT(y, want, "y");
  }
  {  // in place into the gate, as the MLP does
    Rig r;
    Mat gate = r.mat(T, n, 0, gv), up = r.mat(T, n, 0, uv);
    r.be.silu_mul(gate.view, gate.view, up.view);
    VERIFY_CLOSE(read(gate.view), want, "y aliasing gate");
  }
}

void TestKernels::add() {
  std::mt19937 g(5);
  const int T = 23, n = 45;
  const auto av = randn(g, size_t(T) * n), bv = randn(g, size_t(T) * n);
  ref::Vec want(av.size());
  for (size_t i = 0; i < av.size(); ++i) want[i] = double(av[i]) + double(bv[i]);
  {
    Rig r;
    Mat a = r.mat(T, n, 1, av), b = r.mat(T, n, 4, bv), y = r.filled_mat(T, n, 2, 0.0f);
    r.be.add(y.view, a.view, b.view);
    VERIFY_MAT(y, want, "y");
  }
  {  // y aliasing a (a residual update)
    Rig r;
    Mat a = r.mat(T, n, 3, av), b = r.mat(T, n, 0, bv);
    r.be.add(a.view, a.view, b.view);
    VERIFY_MAT(a, want, "y aliasing a");
  }
}

void TestKernels::copy() {
  std::mt19937 g(9);
  const int T = 17, n = 33;
  const auto sv = randn(g, size_t(T) * n);
  const ref::Vec want = ref::to_double(sv);
  Rig r;
  {  // contiguous, any rank
    const Tensor src = r.tensor({T, n}, sv).reshape({T, 1, n});
    const Tensor dst = r.be.alloc({T, 1, n}, Category::Workspace, "dst");
    r.be.copy(dst, src);
    QCOMPARE(ref::rel_l2(read(dst), want), 0.0);
  }
  {  // strided views on both sides
    Mat src = r.mat(T, n, 2, sv), dst = r.filled_mat(T, n, 5, 0.0f);
    r.be.copy(dst.view, src.view);
    QCOMPARE(ref::rel_l2(read(dst.view), want), 0.0);
    QVERIFY(padding_intact(dst));
  }
  {  // a row range of a buffer (a KV cache slice) into a contiguous tensor
    Mat src = r.mat(T, n, 0, sv);
    const Tensor dst = r.be.alloc({5, n}, Category::Workspace, "dst");
    r.be.copy(dst, src.view.slice(0, 7, 5));
    QCOMPARE(ref::rel_l2(read(dst), ref::Vec(want.begin() + 7 * n, want.begin() + 12 * n)), 0.0);
  }
}

// Attention's FLOP count rests on the visible (query, key) pairs: counted run
// against run in closed form, it must equal a brute-force count over every
// pair, for sorted, zigzag, shuffled, repeated and many-run position lists.
void TestKernels::visible_pairs() {
  std::mt19937 rng(7);
  auto brute = [](const std::vector<int32_t>& q, const std::vector<int32_t>& k) {
    double n = 0;
    for (int32_t a : q)
      for (int32_t b : k) n += b <= a ? 1 : 0;
    return n;
  };
  auto range = [](int32_t a, int32_t b) {
    std::vector<int32_t> v(size_t(b - a));
    std::iota(v.begin(), v.end(), a);
    return v;
  };
  auto cat = [](std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> cases = {
      {range(0, 300), range(0, 300)},                                         // one sequence
      {cat(range(0, 50), range(350, 400)), range(0, 400)},                    // zigzag chunks vs gathered keys
      {range(100, 200), cat(range(300, 400), range(0, 150))},                 // keys out of order
      {range(0, 10), range(50, 90)},                                          // nothing visible
      {{7}, range(0, 1000)},                                                  // a decode step
      {{}, range(0, 10)},
      {range(0, 10), {}},
      {{3, 3, 5, 5, 4}, {4, 4, 3, 9, 0}},                                     // repeats
  };
  std::vector<int32_t> many(500), shuffled = range(0, 500);
  for (auto& v : many) v = int32_t(rng() % 400);  // hundreds of runs: the sorting path
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  cases.push_back({many, shuffled});
  cases.push_back({shuffled, many});
  for (auto& [q, k] : cases)
    QCOMPARE(ss::detail::visible_pairs(q, k), brute(q, k));
  // The simulator's query runs: consecutive ascending positions, each with
  // the keys its last query sees and its own pairs, which add up to the call's.
  for (auto& [q, k] : cases) {
    const auto runs = ss::detail::attention_runs(q, k);
    if (runs.empty()) {
      QVERIFY(q.empty() || q == many || q == shuffled);  // past the 64 runs: the call is costed whole
      continue;
    }
    size_t first = 0;
    double pairs = 0;
    for (const auto& r : runs) {
      const std::vector<int32_t> run(q.begin() + long(first), q.begin() + long(first) + r.queries);
      for (size_t i = 1; i < run.size(); ++i) QCOMPARE(run[i], run[i - 1] + 1);
      QCOMPARE(double(r.keys), brute({run.back()}, k));
      QCOMPARE(r.pairs, brute(run, k));
      pairs += r.pairs;
      first += size_t(r.queries);
    }
    QCOMPARE(first, q.size());
    QCOMPARE(pairs, brute(q, k));
  }
  // Zigzag's chunks 0 and 3 of 4 against keys gathered rank by rank: a causal
  // block of 128 over 128 keys and one of 128 at the end of 512.
  const auto zz = ss::detail::attention_runs(cat(range(0, 128), range(384, 512)),
                                             cat(cat(range(0, 128), range(384, 512)), range(128, 384)));
  QCOMPARE(zz.size(), size_t(2));
  QCOMPARE(zz[0].keys, int64_t(128));
  QCOMPARE(zz[1].keys, int64_t(512));
  QCOMPARE(zz[0].pairs, 128.0 * 129 / 2);
  QCOMPARE(zz[1].pairs, 128.0 * 384 + 128.0 * 129 / 2);
}

struct TestKernels::Conv1dCase {
  int T, C, K;
  bool bias, state, silu;
  int pad;
};

void TestKernels::conv1d_causal_data() {
  add_rows<Conv1dCase>({
      {"no bias, no state", {30, 24, 4, false, false, false, 0}},
      {"bias", {30, 24, 4, true, false, false, 0}},
      {"bias, state, silu", {29, 40, 4, true, true, true, 0}},
      {"no bias, state, silu", {29, 40, 4, false, true, true, 0}},
      {"T < K-1, state", {2, 16, 4, true, true, true, 0}},
      {"decode T=1, state", {1, 48, 4, true, true, true, 0}},
      {"K=2, state", {11, 8, 2, true, true, false, 0}},
      {"strided x, K=3, state", {21, 36, 3, true, true, true, 3}},
  });
}

void TestKernels::conv1d_causal() {
  const auto [T, C, K, bias, state, silu, pad] = fetch<Conv1dCase>();
  std::mt19937 g(uint32_t(T * 13 + C + K));
  const auto xv = randn(g, size_t(T) * C), wv = randn(g, size_t(C) * K, 0.0, 0.5),
             bv = randn(g, size_t(C), 0.0, 0.1), sv = randn(g, size_t(K - 1) * C);
  Rig r;
  Mat x = r.mat(T, C, pad, xv), y = r.filled_mat(T, C, pad, kNaN);
  const Tensor w = r.tensor({C, K}, wv);
  const Tensor b = bias ? r.tensor({C}, bv) : Tensor{};
  const Tensor st = state ? r.tensor({K - 1, C}, sv) : Tensor{};
  r.be.conv1d_causal(y.view, x.view, w, b, st, silu);
  const ref::Vec bd = ref::to_double(bv), sd = ref::to_double(sv);
  ref::Vec want_state;
  const ref::Vec want =
      ref::conv1d_causal(ref::to_double(xv), ref::to_double(wv), bias ? &bd : nullptr,
                         state ? &sd : nullptr, T, C, K, silu, &want_state);
  VERIFY_MAT(y, want, "y");
  if (state) VERIFY_CLOSE(read(st), want_state, "conv state");
}

struct TestKernels::Conv1dCarriesCase {
  int T, split;
  bool bias;
};

void TestKernels::conv1d_state_carries_data() {
  add_rows<Conv1dCarriesCase>({
      {"21 = 10 + 11, bias", {21, 10, true}},
      {"21 = 1 + 20, no bias", {21, 1, false}},
      {"9 = 7 + 2, bias", {9, 7, true}},
  });
}

// Running x in two pieces with the state carried equals one run on all of x,
// and both equal the reference from a zero state.
void TestKernels::conv1d_state_carries() {
  const auto [T, split, bias] = fetch<Conv1dCarriesCase>();
  const int C = 20, K = 4;
  std::mt19937 g(uint32_t(T * 3 + split));
  const auto xv = randn(g, size_t(T) * C), wv = randn(g, size_t(C) * K, 0.0, 0.5),
             bv = randn(g, size_t(C), 0.0, 0.1);
  Rig r;
  const Tensor x = r.tensor({T, C}, xv), w = r.tensor({C, K}, wv);
  const Tensor b = bias ? r.tensor({C}, bv) : Tensor{};
  const Tensor y = r.be.alloc({T, C}, Category::Workspace, "y");
  const Tensor st = r.filled({K - 1, C}, 0.0f);
  r.be.conv1d_causal(y.slice(0, 0, split), x.slice(0, 0, split), w, b, st, true);
  r.be.conv1d_causal(y.slice(0, split, T - split), x.slice(0, split, T - split), w, b, st, true);

  const Tensor y1 = r.be.alloc({T, C}, Category::Workspace, "y1");
  const Tensor st1 = r.filled({K - 1, C}, 0.0f);
  r.be.conv1d_causal(y1, x, w, b, st1, true);
  VERIFY_CLOSE(read(y), ref::to_double(read(y1)), "two pieces vs one run");
  VERIFY_CLOSE(read(st), ref::to_double(read(st1)), "state after two pieces vs one run");

  const ref::Vec bd = ref::to_double(bv);
  ref::Vec want_state;
  const ref::Vec want =
      ref::conv1d_causal(ref::to_double(xv), ref::to_double(wv), bias ? &bd : nullptr, nullptr, T,
                         C, K, true, &want_state);
  VERIFY_CLOSE(read(y), want, "y");
  VERIFY_CLOSE(read(st), want_state, "conv state");
}

namespace {

struct SsdCase {
  int T, H, P, G, N, chunk;
  double dt_min = 0, dt_max = std::numeric_limits<double>::infinity();
};

// A random dt_bias: the inverse softplus of dt ~ logU[1e-3, 1e-1].
float random_dt_bias(std::mt19937& g, std::uniform_real_distribution<double>& u) {
  const double dt = std::exp(std::log(1e-3) + u(g) * (std::log(1e-1) - std::log(1e-3)));
  return float(dt + std::log(-std::expm1(-dt)));
}

// Random SSD inputs in the ranges of real Mamba2 layers: dt_bias the inverse
// softplus of dt ~ logU[1e-3, 1e-1], A_log = log U[1, 16], D near 1.
ref::SsdProblem random_ssd(const SsdCase& c, std::mt19937& g) {
  ref::SsdProblem p;
  p.T = c.T;
  p.n_heads = c.H;
  p.head_dim = c.P;
  p.n_groups = c.G;
  p.d_state = c.N;
  p.dt_min = c.dt_min;
  p.dt_max = c.dt_max;
  // Values are rounded to the dtype first: kernel and reference see the same inputs.
  auto f = [](const std::vector<float>& v) { return ref::to_double(representable(v)); };
  p.x = f(randn(g, size_t(c.T) * c.H * c.P));
  p.dt = f(randn(g, size_t(c.T) * c.H, 0.0, 0.5));
  std::vector<float> bias(size_t(c.H)), alog(size_t(c.H));
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int h = 0; h < c.H; ++h) {
    bias[size_t(h)] = random_dt_bias(g, u);
    alog[size_t(h)] = float(std::log(1.0 + 15.0 * u(g)));
  }
  p.dt_bias = f(bias);
  p.A_log = f(alog);
  p.D = f(randn(g, size_t(c.H), 1.0, 0.1));
  p.B = f(randn(g, size_t(c.T) * c.G * c.N));
  p.C = f(randn(g, size_t(c.T) * c.G * c.N));
  return p;
}

std::vector<float> to_float(const ref::Vec& v) {
  return std::vector<float>(v.begin(), v.end());
}

// The SSD scan of p on the backend in chunks of `chunk` (contiguous; y
// uninitialised; no state).
ss::SsdArgs ssd_args(Rig& r, const ref::SsdProblem& p, int chunk) {
  const int64_t T = p.T, H = p.n_heads, HP = H * p.head_dim, GN = int64_t(p.n_groups) * p.d_state;
  ss::SsdArgs a;
  a.x = r.tensor({T, HP}, to_float(p.x));
  a.B = r.tensor({T, GN}, to_float(p.B));
  a.C = r.tensor({T, GN}, to_float(p.C));
  a.dt = r.tensor({T, H}, to_float(p.dt));
  a.y = r.be.alloc({T, HP}, Category::Workspace, "y");
  a.dt_bias = r.tensor({H}, to_float(p.dt_bias));
  a.A_log = r.tensor({H}, to_float(p.A_log));
  a.D = r.tensor({H}, to_float(p.D));
  a.n_heads = p.n_heads;
  a.head_dim = p.head_dim;
  a.n_groups = p.n_groups;
  a.d_state = p.d_state;
  a.chunk = chunk;
  a.dt_min = float(p.dt_min);
  a.dt_max = float(p.dt_max);
  return a;
}

}  // namespace

struct TestKernels::SsdScanCase {
  int T, H, P, G, N, chunk;
  bool state;
  bool packed;  // x, B, C, dt as column windows of one in_proj-like buffer
  double dt_min, dt_max;
};

void TestKernels::ssd_scan_data() {
  const double inf = std::numeric_limits<double>::infinity();
  add_rows<SsdScanCase>({
      {"chunk 1", {23, 4, 8, 1, 16, 1, false, false, 0.0, inf}},
      {"chunk 7, 2 groups, T=50", {50, 4, 8, 2, 16, 7, true, false, 0.0, inf}},
      {"chunk 16, state, T=37", {37, 4, 16, 1, 16, 16, true, false, 0.0, inf}},
      {"chunk 16, packed, 2 groups", {45, 8, 16, 2, 16, 16, true, true, 0.0, inf}},
      {"chunk 64, 4 groups, T=150", {150, 8, 8, 4, 16, 64, true, false, 0.0, inf}},
      {"chunk 256, T=300", {300, 4, 16, 2, 32, 256, true, false, 0.0, inf}},
      {"chunk 256, head_dim 64, d_state 128 (mamba2-130m)",
       {300, 4, 64, 1, 128, 256, true, false, 0.0, inf}},
      {"chunk 256, T=100 < chunk", {100, 2, 16, 1, 16, 256, false, false, 0.0, inf}},
      {"dt clamped to [0.01, 0.05]", {70, 4, 8, 2, 16, 16, true, false, 0.01, 0.05}},
      {"decode T=1, state", {1, 8, 16, 2, 16, 256, true, false, 0.0, inf}},
  });
}

void TestKernels::ssd_scan() {
  const auto [T, H, P, G, N, chunk, state, packed, dt_min, dt_max] = fetch<SsdScanCase>();
  std::mt19937 g(uint32_t(T * 101 + H * 11 + G * 3 + chunk));
  const ref::SsdProblem p = random_ssd({T, H, P, G, N, chunk, dt_min, dt_max}, g);
  const auto s0 = randn(g, size_t(H) * P * N, 0.0, 0.5);

  Rig r;
  ss::SsdArgs a = ssd_args(r, p, chunk);
  const int64_t HP = int64_t(H) * P, GN = int64_t(G) * N;
  Mat buf;
  if (packed) {  // [x | B | C | dt] per row, like the conv output and in_proj slices the model
                 // passes
    buf = r.mat(T, HP + 2 * GN + H, 2,
                side_by_side<double>(T, {{p.x, HP}, {p.B, GN}, {p.C, GN}, {p.dt, H}}));
    a.x = buf.view.slice(1, 0, HP);
    a.B = buf.view.slice(1, HP, GN);
    a.C = buf.view.slice(1, HP + GN, GN);
    a.dt = buf.view.slice(1, HP + 2 * GN, H);
  }
  Mat y = r.filled_mat(T, HP, packed ? 1 : 0, kNaN);
  a.y = y.view;
  if (state) a.state = r.f32({H, P, N}, s0);
  r.be.ssd_scan(a);

  ref::SsdProblem pr = p;
  pr.dt_min = double(float(dt_min));
  pr.dt_max = double(float(dt_max));
  ref::Vec want_state = state ? ref::to_double(s0) : ref::Vec{};
  const ref::Vec want = ref::ssd_scan(pr, want_state);
  VERIFY_MAT(y, want, "y");
  if (state) VERIFY_CLOSE(read(a.state), want_state, "ssm state");
}

// A scan in pieces with the state carried (prefill, then more prefill, then
// decode steps) equals the reference over the whole sequence.
void TestKernels::ssd_scan_state_carries() {
  const int T = 61, H = 4, P = 8, G = 2, N = 16;
  std::mt19937 g(2024);
  const ref::SsdProblem p = random_ssd({T, H, P, G, N, 16}, g);
  Rig r;
  const ss::SsdArgs whole = ssd_args(r, p, 16);
  ss::SsdArgs a = whole;
  a.state = r.f32_filled({H, P, N}, 0.0f);
  const int pieces[][2] = {{0, 21}, {21, 37}, {58, 1}, {59, 1}, {60, 1}};
  for (const auto& [t0, len] : pieces) {
    a.x = whole.x.slice(0, t0, len);
    a.B = whole.B.slice(0, t0, len);
    a.C = whole.C.slice(0, t0, len);
    a.dt = whole.dt.slice(0, t0, len);
    a.y = whole.y.slice(0, t0, len);
    r.be.ssd_scan(a);
  }
  ref::Vec want_state;
  const ref::Vec want = ref::ssd_scan(p, want_state);
  VERIFY_CLOSE(read(whole.y), want, "y");
  VERIFY_CLOSE(read(a.state), want_state, "ssm state");
}

struct TestKernels::SelectiveScanCase {
  int T, channels, N;
  bool gate, state;
  bool packed;  // z, B, C as column windows, as the Mamba mixer passes them
};

void TestKernels::selective_scan_data() {
  add_rows<SelectiveScanCase>({
      {"no gate", {40, 24, 8, false, false, false}},
      {"gate", {40, 24, 8, true, false, false}},
      {"gate, state", {33, 48, 16, true, true, false}},
      {"no gate, state", {33, 48, 16, false, true, false}},
      {"decode T=1, gate, state", {1, 64, 16, true, true, false}},
      {"packed, gate, state", {29, 32, 8, true, true, true}},
  });
}

namespace {

// Random Mamba (v1) inputs: dt_bias as in random_ssd, A_log = log(n + 1)
// (S4D-real) with noise, z always drawn (the same draws with or without a
// gate) and cleared without one.
ref::SelectiveProblem random_selective(int T, int Ch, int N, bool gate, std::mt19937& g) {
  ref::SelectiveProblem p;
  p.T = T;
  p.channels = Ch;
  p.d_state = N;
  auto f = [](const std::vector<float>& v) { return ref::to_double(representable(v)); };
  p.x = f(randn(g, size_t(T) * Ch));
  p.dt = f(randn(g, size_t(T) * Ch, 0.0, 0.5));
  p.z = f(randn(g, size_t(T) * Ch, 0.0, 2.0));
  p.B = f(randn(g, size_t(T) * N));
  p.C = f(randn(g, size_t(T) * N));
  p.D = f(randn(g, size_t(Ch), 1.0, 0.1));
  std::vector<float> bias(static_cast<size_t>(Ch)), alog(static_cast<size_t>(Ch) * N);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int c = 0; c < Ch; ++c) {
    bias[size_t(c)] = random_dt_bias(g, u);
    for (int n = 0; n < N; ++n)
      alog[size_t(c * N + n)] = float(std::log(n + 1.0) + 0.1 * (u(g) - 0.5));
  }
  p.dt_bias = f(bias);
  p.A_log = f(alog);
  if (!gate) p.z.clear();
  return p;
}

// The scan's inputs on the backend (contiguous; y uninitialised; no state).
ss::SelectiveScanArgs selective_args(Rig& r, const ref::SelectiveProblem& p) {
  const int64_t T = p.T, Ch = p.channels, N = p.d_state;
  ss::SelectiveScanArgs a;
  a.x = r.tensor({T, Ch}, to_float(p.x));
  if (!p.z.empty()) a.z = r.tensor({T, Ch}, to_float(p.z));
  a.B = r.tensor({T, N}, to_float(p.B));
  a.C = r.tensor({T, N}, to_float(p.C));
  a.y = r.be.alloc({T, Ch}, Category::Workspace, "y");
  a.dt = r.tensor({T, Ch}, to_float(p.dt));
  a.dt_bias = r.tensor({Ch}, to_float(p.dt_bias));
  a.D = r.tensor({Ch}, to_float(p.D));
  a.A_log = r.tensor({Ch, N}, to_float(p.A_log));
  return a;
}

}  // namespace

void TestKernels::selective_scan() {
  const auto [T, Ch, N, gate, state, packed] = fetch<SelectiveScanCase>();
  std::mt19937 g(uint32_t(T * 37 + Ch + N));
  const ref::SelectiveProblem p = random_selective(T, Ch, N, gate, g);
  const auto s0 = randn(g, size_t(Ch) * N, 0.0, 0.5);

  Rig r;
  ss::SelectiveScanArgs a = selective_args(r, p);
  Mat xz, bc, y;
  if (packed) {  // [x | z] from in_proj and [B | C] from x_proj, with padding
    xz = r.mat(T, 2 * Ch, 1, side_by_side<double>(T, {{p.x, Ch}, {p.z, Ch}}));
    bc = r.mat(T, 2 * N, 3, side_by_side<double>(T, {{p.B, N}, {p.C, N}}));
    a.x = xz.view.slice(1, 0, Ch);
    a.z = xz.view.slice(1, Ch, Ch);
    a.B = bc.view.slice(1, 0, N);
    a.C = bc.view.slice(1, N, N);
  }
  y = r.filled_mat(T, Ch, packed ? 2 : 0, kNaN);
  a.y = y.view;
  if (state) a.state = r.f32({Ch, N}, s0);
  r.be.selective_scan(a);

  ref::Vec want_state = state ? ref::to_double(s0) : ref::Vec{};
  const ref::Vec want = ref::selective_scan(p, want_state);
  VERIFY_MAT(y, want, "y");
  if (state) VERIFY_CLOSE(read(a.state), want_state, "ssm state");
}

struct TestKernels::SelectivePassingCase {
  int T, channels, N;
  bool gate;
};

void TestKernels::selective_state_passing_data() {
  add_rows<SelectivePassingCase>({
      {"gate, T=37", {37, 32, 16, true}},
      {"no gate, T=20", {20, 24, 8, false}},
      {"gate, T=1", {1, 16, 16, true}},
  });
}

// Sequence-parallel state passing for Mamba (v1), one rank's view: scan the
// rank's tokens from a zero state (keeping the chunk state and sum of dt),
// then correct the outputs for the incoming state and advance that state over
// the chunk. Together they equal one scan that starts from the incoming state.
void TestKernels::selective_state_passing() {
  const auto [T, Ch, N, gate] = fetch<SelectivePassingCase>();
  std::mt19937 g(uint32_t(T * 5 + Ch + N));
  const ref::SelectiveProblem p = random_selective(T, Ch, N, gate, g);
  const auto incoming = randn(g, size_t(Ch) * N, 0.0, 0.5);

  Rig r;
  ss::SelectiveScanArgs a = selective_args(r, p);
  a.state = r.f32_filled({Ch, N}, 0.0f);
  a.dt_sum = r.f32_filled({Ch}, kNaN);
  r.be.selective_scan(a);
  ref::Vec want_dt_sum(size_t(Ch), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int c = 0; c < Ch; ++c)
      want_dt_sum[size_t(c)] += ref::softplus(p.dt[size_t(t * Ch + c)] + p.dt_bias[size_t(c)]);
  VERIFY_CLOSE(read(a.dt_sum), want_dt_sum, "dt_sum");

  const Tensor state = r.f32({Ch, N}, incoming);
  ss::SelectiveScanArgs c = a;
  c.state = state;
  r.be.selective_state_correction(c);
  r.be.selective_state_advance(state, a.A_log, a.state, a.dt_sum);

  ref::Vec want_state = ref::to_double(incoming);
  const ref::Vec want = ref::selective_scan(p, want_state);
  VERIFY_CLOSE_TOL(read(a.y), want, "corrected y", tolerance(2));  // stored by the scan, then added to
  VERIFY_CLOSE(read(state), want_state, "advanced state");
}

struct TestKernels::SsdPassingCase {
  int T, H, G, chunk;
  double dt_min, dt_max;
};

void TestKernels::ssd_state_passing_data() {
  const double inf = std::numeric_limits<double>::infinity();
  add_rows<SsdPassingCase>({
      {"chunk 16, T=37, 2 groups", {37, 4, 2, 16, 0.0, inf}},
      {"chunk 7, T=50, 1 group", {50, 4, 1, 7, 0.0, inf}},
      {"chunk 256, T=300, clamped", {300, 4, 2, 256, 0.01, 0.05}},
      {"T=1", {1, 8, 4, 16, 0.0, inf}},
  });
}

// Sequence-parallel state passing for Mamba2 (ranks as SSD chunks), one
// rank's view: scan from a zero state keeping the chunk state and log decay,
// correct the outputs for the incoming state, advance the incoming state.
// Together they equal one scan that starts from the incoming state.
void TestKernels::ssd_state_passing() {
  const auto [T, H, G, chunk, dt_min, dt_max] = fetch<SsdPassingCase>();
  const int P = 8, N = 16;
  std::mt19937 g(uint32_t(T * 3 + H + G + chunk));
  ref::SsdProblem p = random_ssd({T, H, P, G, N, chunk, dt_min, dt_max}, g);
  p.dt_min = double(float(dt_min));
  p.dt_max = double(float(dt_max));
  const auto incoming = randn(g, size_t(H) * P * N, 0.0, 0.5);

  Rig r;
  ss::SsdArgs a = ssd_args(r, p, chunk);
  a.state = r.f32_filled({H, P, N}, 0.0f);
  a.log_decay = r.f32_filled({H}, kNaN);
  r.be.ssd_scan(a);
  ref::Vec want_log_decay(size_t(H), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      const double dt = ref::softplus(p.dt[size_t(t * H + h)] + p.dt_bias[size_t(h)]);
      want_log_decay[size_t(h)] -=
          std::clamp(dt, p.dt_min, p.dt_max) * std::exp(p.A_log[size_t(h)]);
    }
  VERIFY_CLOSE(read(a.log_decay), want_log_decay, "log_decay");

  const Tensor state = r.f32({H, P, N}, incoming);
  ss::SsdArgs c = a;
  c.state = state;
  r.be.ssd_state_correction(c);
  r.be.ssd_state_advance(state, a.state, a.log_decay);

  ref::Vec want_state = ref::to_double(incoming);
  const ref::Vec want = ref::ssd_scan(p, want_state);
  VERIFY_CLOSE_TOL(read(a.y), want, "corrected y", tolerance(2));  // stored by the scan, then added to
  VERIFY_CLOSE(read(state), want_state, "advanced state");
}

struct TestKernels::GatedNormRanksCase {
  int n, groups, ranks;
};

void TestKernels::gated_norm_across_ranks_data() {
  add_rows<GatedNormRanksCase>({
      {"1 group over 2 ranks", {64, 1, 2}},
      {"1 group over 3 ranks", {96, 1, 3}},
      {"2 groups over 4 ranks", {128, 2, 4}},
      {"4 groups over 2 ranks", {128, 4, 2}},
  });
}

// The gated norm with its columns split over ranks (Mamba2 under tp when a
// norm group spans ranks): each rank's sums of squares into its groups' slots,
// summed over the ranks (the all-reduce, done here on the host), then each
// rank normalises its columns. The result equals gated_rmsnorm on all columns.
void TestKernels::gated_norm_across_ranks() {
  const auto [n, groups, ranks] = fetch<GatedNormRanksCase>();
  const int T = 9, group = n / groups, cols = n / ranks, local_group = std::min(group, cols);
  const float eps = 1e-5f;
  std::mt19937 g(uint32_t(n + groups * 10 + ranks));
  const auto xv = randn(g, size_t(T) * n), zv = randn(g, size_t(T) * n, 0.0, 2.0),
             wv = randn(g, size_t(n), 1.0, 0.2);
  Rig r;
  Mat x = r.mat(T, n, 1, xv), z = r.mat(T, n, 2, zv), y = r.filled_mat(T, n, 0, kNaN);
  const Tensor w = r.tensor({n}, wv);
  std::vector<float> total(size_t(T) * groups, 0.0f);
  for (int k = 0; k < ranks; ++k) {
    const Tensor ss = r.f32_filled({T, groups}, kNaN);
    r.be.gated_norm_sumsq(ss, x.view.slice(1, k * cols, cols), z.view.slice(1, k * cols, cols),
                          local_group, (k * cols) / group);
    const auto part = read(ss);
    for (size_t i = 0; i < total.size(); ++i) total[i] += part[i];
  }
  const Tensor ss = r.f32({T, groups}, total);
  for (int k = 0; k < ranks; ++k)
    r.be.gated_rmsnorm_apply(y.view.slice(1, k * cols, cols), x.view.slice(1, k * cols, cols),
                             z.view.slice(1, k * cols, cols), w.slice(0, k * cols, cols), ss, eps,
                             local_group, group, (k * cols) / group);
  const ref::Vec zd = ref::to_double(zv), wd = ref::to_double(wv);
  VERIFY_CLOSE(read(y.view), ref::rmsnorm(ref::to_double(xv), &zd, &wd, T, n, group, eps), "y");
}

// The suite once per compute dtype.
int main(int argc, char** argv) {
  QCoreApplication app(argc, argv);
  int failed = 0;
  for (ss::DType dt : {ss::DType::F32, ss::DType::BF16, ss::DType::F16}) {
    g_dtype = dt;
    std::printf("********* compute dtype %s *********\n", std::string(ss::compute_dtype_name(dt)).c_str());
    TestKernels t;
    failed += QTest::qExec(&t, argc, argv);
  }
  return failed ? 1 : 0;
}
#include "tst_kernels.moc"
