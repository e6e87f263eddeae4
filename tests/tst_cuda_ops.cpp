// Every kernel of the cuda backend against the cpu backend, in the style of
// ggml's test-backend-ops: the same random inputs on both, the op through the
// public Backend methods on each, the results compared. Shapes include odd
// sizes, lengths that are not a multiple of a tile or chunk, strided views
// whose padding holds NaN (a kernel that reads it poisons its result; one
// that writes it is caught directly), and every compute dtype (the suite
// runs three times: fp32, bf16, fp16).
//
// Built twice (tests/CMakeLists.txt): tst_cuda_ops_emu runs the kernels'
// own source on the host under the thread-model emulator (engine/cuda/emu)
// on every machine; tst_cuda_ops runs the nvcc build on a GPU and, without
// one, says "skipped: no CUDA device".
//
// Tolerance: tst_kernels bounds the cpu backend's relative L2 error against
// float64 at u + 1e-5 for an output rounded once to the dtype (u = 2^-8 for
// bf16, 2^-11 for fp16) and 2u + 1e-5 for one rounded twice; the cuda
// kernels round their outputs the same way, so the two backends differ by at
// most twice that. fp32 is held to 1e-5. Quantized bytes must be equal.
#include <QtTest>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "comm/quantize.h"
#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"
#include "cuda/runtime.h"

namespace dev = ss::SS_CUDA_NS;
using ss::Category;
using ss::DType;
using ss::Tensor;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
DType g_dtype = DType::F32;  // this pass of the suite

double unit_roundoff(DType t) {
  return t == DType::BF16 ? std::ldexp(1.0, -8) : t == DType::F16 ? std::ldexp(1.0, -11) : 0.0;
}
// Two backends, each within 1e-5 + k u of exact (k roundings), differ by at most twice that.
double tolerance(int roundings = 1) {
  return g_dtype == DType::F32 ? 1e-5 : 2.0 * (1e-5 + roundings * unit_roundoff(g_dtype));
}

double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
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
std::vector<float> representable(std::vector<float> v, DType dt) {
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

std::vector<int32_t> iota_pos(int64_t n, int32_t first = 0) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), first);
  return p;
}

// zigzag chunks {r, 2S-1-r} of a sequence of T tokens, for rank r of S.
std::vector<int32_t> zigzag_pos(int64_t T, int S, int r) {
  std::vector<int32_t> p;
  const int64_t chunk = T / (2 * S);
  for (int64_t c : {int64_t(r), int64_t(2 * S - 1 - r)})
    for (int64_t i = 0; i < chunk; ++i) p.push_back(int32_t(c * chunk + i));
  return p;
}

}  // namespace

class TestCudaOps : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase() {
    const std::string why = dev::unavailable_reason();
    if (!why.empty()) QSKIP(qPrintable(QStringLiteral("skipped: no CUDA device (%1)").arg(QString::fromStdString(why))));
  }

  void matmul_data() {
    QTest::addColumn<int>("M");
    QTest::addColumn<int>("N");
    QTest::addColumn<int>("K");
    QTest::addColumn<bool>("accumulate");
    QTest::addColumn<bool>("f32_out");
    QTest::addColumn<bool>("aligned");  // x's rows 16-byte aligned: a few rows take gemv.cu, not cuBLAS
    QTest::newRow("square") << 64 << 64 << 64 << false << false << false;
    QTest::newRow("odd") << 37 << 53 << 29 << false << false << false;
    QTest::newRow("decode row") << 1 << 300 << 96 << false << false << false;
    QTest::newRow("decode row, aligned") << 1 << 300 << 96 << false << false << true;
    QTest::newRow("3 rows, accumulate, aligned") << 3 << 257 << 136 << true << false << true;
    QTest::newRow("2 rows, long K, aligned") << 2 << 70 << 4104 << false << false << true;
    QTest::newRow("one output, aligned") << 1 << 1 << 64 << false << false << true;
    QTest::newRow("logits in fp32, aligned") << 1 << 130 << 48 << false << true << true;
    QTest::newRow("accumulate") << 17 << 40 << 24 << true << false << false;
    QTest::newRow("logits in fp32") << 9 << 130 << 48 << false << true << false;
  }
  void matmul() {
    QFETCH(int, M);
    QFETCH(int, N);
    QFETCH(int, K);
    QFETCH(bool, accumulate);
    QFETCH(bool, f32_out);
    QFETCH(bool, aligned);
    Rigs r;
    const Twin x = r.random_mat(M, K, aligned ? 8 : 3), w = r.random({N, K}, 0.2);
    Twin y = r.random_mat(M, N, 2, 1.0, f32_out ? DType::F32 : g_dtype);
    r.cpu.matmul(y.c, x.c, w.c, accumulate);
    r.gpu.matmul(y.d, x.d, w.d, accumulate);
    VERIFY_TWIN_TOL(r, y, "matmul", tolerance(accumulate ? 2 : 1));
  }

  void elementwise_data() {
    QTest::addColumn<bool>("aligned");  // 16-byte aligned rows of whole pieces: the vectorised kernels
    QTest::newRow("strided") << false;
    QTest::newRow("aligned") << true;
  }
  void elementwise() {
    QFETCH(bool, aligned);
    Rigs r;
    const int64_t T = 23, C = aligned ? 80 : 77;
    const Twin a = r.random_mat(T, C, aligned ? 8 : 1), b = r.random_mat(T, C, aligned ? 16 : 2);
    Twin y = r.mat(T, C, aligned ? 8 : 3, std::vector<float>(size_t(T * C), 0.0f));
    r.cpu.add(y.c, a.c, b.c);
    r.gpu.add(y.d, a.d, b.d);
    VERIFY_TWIN(r, y, "add");
    r.cpu.silu_mul(y.c, a.c, b.c);
    r.gpu.silu_mul(y.d, a.d, b.d);
    VERIFY_TWIN(r, y, "silu_mul");
    const Twin bias = r.random({C});
    r.cpu.add_bias(y.c, bias.c);
    r.gpu.add_bias(y.d, bias.d);
    VERIFY_TWIN_TOL(r, y, "add_bias", tolerance(2));
    // copy: strided within a dtype, and across dtypes (rounding once)
    Twin z = r.mat(T, C, aligned ? 8 : 2, std::vector<float>(size_t(T * C), 0.0f));
    r.cpu.copy(z.c, a.c);
    r.gpu.copy(z.d, a.d);
    VERIFY_TWIN(r, z, "copy");
    Twin wide = r.filled({T, C}, 0.0f, DType::F32);
    r.cpu.copy(wide.c, a.c);
    r.gpu.copy(wide.d, a.d);
    VERIFY_TWIN(r, wide, "copy to fp32");
    Twin narrow = r.filled({T, C}, 0.0f, DType::BF16);
    r.cpu.copy(narrow.c, wide.c);
    r.gpu.copy(narrow.d, wide.d);
    VERIFY_TWIN_TOL(r, narrow, "copy to bf16", 0.0);  // both round to nearest even: equal
    r.cpu.fill(z.c, 0.375f);
    r.gpu.fill(z.d, 0.375f);
    VERIFY_TWIN_TOL(r, z, "fill", 0.0);
    // embedding and argmax
    const int64_t V = 50;
    const Twin table = r.random({V, C});
    const std::vector<int32_t> tokens = {3, 0, 49, 3, 17, 22, 8};
    Twin e = r.filled({int64_t(tokens.size()), C}, 0.0f);
    r.cpu.embedding(e.c, table.c, tokens);
    r.gpu.embedding(e.d, table.d, tokens);
    VERIFY_TWIN_TOL(r, e, "embedding", 0.0);
    const Twin logits = r.random({3, 1000}, 1.0, DType::F32);
    for (int64_t row = 0; row < 3; ++row) QCOMPARE(r.gpu.argmax_row(logits.d, row), r.cpu.argmax_row(logits.c, row));
    // ties go to the lowest index, as the cpu's scan does
    std::vector<float> tie(1000, 0.0f);
    tie[911] = tie[12] = tie[500] = 4.0f;
    const Twin t = r.make({1, 1000}, tie, DType::F32);
    QCOMPARE(r.gpu.argmax_row(t.d, 0), 12);
  }

  void norms_data() {
    QTest::addColumn<int>("T");
    QTest::addColumn<int>("cols");
    QTest::addColumn<int>("group");
    QTest::addColumn<bool>("gated");
    QTest::addColumn<bool>("weight");
    QTest::addColumn<bool>("aligned");  // whole rows in 16-byte pieces: the vectorised kernel
    QTest::newRow("rmsnorm") << 19 << 96 << 96 << false << true << false;
    QTest::newRow("rmsnorm, aligned") << 19 << 96 << 96 << false << true << true;
    QTest::newRow("rmsnorm wide") << 3 << 1100 << 1100 << false << true << false;
    QTest::newRow("rmsnorm 4096, aligned") << 3 << 4096 << 4096 << false << true << true;
    QTest::newRow("rmsnorm 9000, aligned (too wide)") << 2 << 9000 << 9000 << false << true << true;
    QTest::newRow("no weight") << 5 << 64 << 64 << false << false << false;
    QTest::newRow("no weight, aligned") << 5 << 64 << 64 << false << false << true;
    QTest::newRow("groups") << 7 << 120 << 40 << false << true << false;
    QTest::newRow("gated") << 11 << 128 << 128 << true << true << false;
    QTest::newRow("gated, aligned") << 11 << 136 << 136 << true << true << true;
    QTest::newRow("gated groups") << 6 << 96 << 24 << true << true << false;
  }
  void norms() {
    QFETCH(int, T);
    QFETCH(int, cols);
    QFETCH(int, group);
    QFETCH(bool, gated);
    QFETCH(bool, weight);
    QFETCH(bool, aligned);
    Rigs r;
    const Twin x = r.random_mat(T, cols, aligned ? 8 : 2), z = r.random_mat(T, cols, aligned ? 16 : 1);
    const Twin w = r.make({cols}, r.randn(cols, 0.2, 1.0));
    Twin y = r.mat(T, cols, aligned ? 8 : 1, std::vector<float>(size_t(T * cols), 0.0f));
    if (gated) {
      r.cpu.gated_rmsnorm(y.c, x.c, z.c, w.c, 1e-5f, group);
      r.gpu.gated_rmsnorm(y.d, x.d, z.d, w.d, 1e-5f, group);
    } else {
      r.cpu.rmsnorm(y.c, x.c, weight ? w.c : Tensor{}, 1e-5f, group);
      r.gpu.rmsnorm(y.d, x.d, weight ? w.d : Tensor{}, 1e-5f, group);
    }
    VERIFY_TWIN(r, y, "rmsnorm");
  }

  // The gated norm whose groups span ranks: sums of squares, then apply.
  void gated_norm_spanning() {
    Rigs r;
    const int64_t T = 9, n = 48, local = 16, n_slots = 6, slot0 = 2;
    const Twin x = r.random_mat(T, n, 1), z = r.random_mat(T, n, 2), w = r.random({n}, 0.3);
    Twin ss = r.filled({T, n_slots}, kNaN, DType::F32);
    r.cpu.gated_norm_sumsq(ss.c, x.c, z.c, local, slot0);
    r.gpu.gated_norm_sumsq(ss.d, x.d, z.d, local, slot0);
    VERIFY_TWIN_TOL(r, ss, "gated_norm_sumsq", 1e-5);
    Twin y = r.filled({T, n}, 0.0f);
    r.cpu.gated_rmsnorm_apply(y.c, x.c, z.c, w.c, ss.c, 1e-5f, local, 2 * local, slot0);
    r.gpu.gated_rmsnorm_apply(y.d, x.d, z.d, w.d, ss.d, 1e-5f, local, 2 * local, slot0);
    VERIFY_TWIN(r, y, "gated_rmsnorm_apply");
  }

  void rope_data() {
    QTest::addColumn<int>("nh");
    QTest::addColumn<int>("hd");
    QTest::addColumn<int>("pad");  // 8: 16-byte aligned rows, the kernel that takes 8 pairs a thread
    QTest::newRow("width 12, strided") << 3 << 12 << 2;
    QTest::newRow("width 32, aligned") << 3 << 32 << 8;
    QTest::newRow("width 128, aligned") << 2 << 128 << 8;
  }
  void rope() {
    QFETCH(int, nh);
    QFETCH(int, hd);
    QFETCH(int, pad);
    Rigs r;
    const std::vector<int32_t> pos = {0, 5, 6, 7, 100, 4097, 65000};
    std::vector<double> inv_freq(size_t(hd / 2));
    for (int i = 0; i < hd / 2; ++i) inv_freq[size_t(i)] = std::pow(10000.0, -2.0 * i / hd);
    Twin x = r.random_mat(int64_t(pos.size()), nh * hd, pad);
    r.cpu.rope(x.c, nh, hd, pos, inv_freq);
    r.gpu.rope(x.d, nh, hd, pos, inv_freq);
    VERIFY_TWIN(r, x, "rope");
  }

  // A Mamba's fp32 residual normed into the block's dtype (the vectorised
  // kernel's mixed form).
  void rmsnormFp32Residual() {
    Rigs r;
    const int64_t T = 5, cols = 136;
    const Twin x = r.random_mat(T, cols, 8, 1.0, DType::F32);
    const Twin w = r.make({cols}, r.randn(cols, 0.2, 1.0));
    Twin y = r.mat(T, cols, 8, std::vector<float>(size_t(T * cols), 0.0f));
    r.cpu.rmsnorm(y.c, x.c, w.c, 1e-5f, cols);
    r.gpu.rmsnorm(y.d, x.d, w.d, 1e-5f, cols);
    VERIFY_TWIN(r, y, "rmsnorm fp32 -> dtype");
  }

  void attention_data() {
    QTest::addColumn<int>("Tq");
    QTest::addColumn<int>("Tk");
    QTest::addColumn<int>("heads");
    QTest::addColumn<int>("kv_heads");
    QTest::addColumn<int>("head_dim");
    // causal, zigzag, decode, all-visible; sharp: causal with scores 8x
    // larger, so a row's max keeps jumping and the prefill rescales O
    QTest::addColumn<QString>("positions");
    // K and V views: 16-byte aligned rows (as the caches are) take the decode
    // and the vectorised prefill loads; the padded ones the scalar paths.
    QTest::addColumn<bool>("aligned");
    QTest::newRow("prefill 64") << 100 << 100 << 4 << 2 << 64 << "causal" << false;
    QTest::newRow("prefill 64, aligned") << 100 << 100 << 4 << 2 << 64 << "causal" << true;
    QTest::newRow("prefill 128") << 70 << 70 << 2 << 1 << 128 << "causal" << false;
    QTest::newRow("prefill 128, aligned") << 150 << 150 << 2 << 1 << 128 << "causal" << true;
    QTest::newRow("odd width 12") << 37 << 37 << 4 << 4 << 12 << "causal" << false;
    QTest::newRow("sharp, aligned") << 150 << 150 << 2 << 1 << 128 << "sharp" << true;
    QTest::newRow("sharp 64") << 130 << 130 << 2 << 2 << 64 << "sharp" << false;
    QTest::newRow("width 80") << 45 << 45 << 2 << 2 << 80 << "causal" << false;
    QTest::newRow("width 160") << 20 << 20 << 2 << 1 << 160 << "causal" << false;
    QTest::newRow("zigzag rank") << 64 << 128 << 4 << 2 << 64 << "zigzag" << false;
    QTest::newRow("zigzag rank, aligned") << 64 << 200 << 4 << 2 << 128 << "zigzag" << true;
    QTest::newRow("decode, keys split") << 1 << 700 << 4 << 2 << 64 << "decode" << false;
    QTest::newRow("decode, aligned, split") << 1 << 700 << 4 << 2 << 64 << "decode" << true;
    QTest::newRow("decode 3, width 128") << 3 << 520 << 2 << 2 << 128 << "decode" << false;
    QTest::newRow("decode 3, width 128, aligned") << 3 << 1500 << 4 << 2 << 128 << "decode" << true;
    QTest::newRow("decode, width 256, aligned") << 1 << 333 << 2 << 1 << 256 << "decode" << true;
    QTest::newRow("short cache") << 2 << 9 << 2 << 1 << 32 << "decode" << false;
    QTest::newRow("short cache, aligned") << 2 << 9 << 2 << 1 << 32 << "decode" << true;
    QTest::newRow("all visible") << 66 << 80 << 2 << 2 << 64 << "all" << false;
    QTest::newRow("all visible, aligned") << 5 << 80 << 2 << 2 << 64 << "all" << true;
  }
  void attention() {
    QFETCH(int, Tq);
    QFETCH(int, Tk);
    QFETCH(int, heads);
    QFETCH(int, kv_heads);
    QFETCH(int, head_dim);
    QFETCH(QString, positions);
    QFETCH(bool, aligned);
    Rigs r;
    std::vector<int32_t> qp, kp;
    if (positions == "causal" || positions == "sharp") {
      qp = kp = iota_pos(Tq);
    } else if (positions == "zigzag") {
      qp = zigzag_pos(2 * Tq, 2, 1);
      kp = iota_pos(Tk);
    } else if (positions == "decode") {
      kp = iota_pos(Tk);
      qp = iota_pos(Tq, Tk - Tq);
    } else {
      kp = iota_pos(Tk);
      qp = std::vector<int32_t>(size_t(Tq), Tk);
    }
    const Twin q = r.random_mat(Tq, heads * head_dim, aligned ? 8 : 4), k = r.random_mat(Tk, kv_heads * head_dim, aligned ? 8 : 2),
               v = r.random_mat(Tk, kv_heads * head_dim, aligned ? 8 : 1);
    Twin o = r.mat(Tq, heads * head_dim, 3, std::vector<float>(size_t(Tq * heads * head_dim), 0.0f));
    Twin lse = r.filled({Tq, heads}, 0.0f, DType::F32);
    ss::AttentionArgs a;
    a.n_heads = heads;
    a.n_kv_heads = kv_heads;
    a.head_dim = head_dim;
    a.scale = float((positions == "sharp" ? 8.0 : 1.0) / std::sqrt(double(head_dim)));
    a.q_pos = qp;
    a.k_pos = kp;
    r.cpu.attention(o.c, q.c, k.c, v.c, a, lse.c);
    r.gpu.attention(o.d, q.d, k.d, v.d, a, lse.d);
    VERIFY_TWIN(r, o, "attention");
    VERIFY_TWIN_TOL(r, lse, "lse", g_dtype == DType::F32 ? 1e-5 : 1e-3);
  }

  void attention_merge() {
    Rigs r;
    const int64_t T = 13;
    const int nh = 3, hd = 20;
    Twin o = r.random_mat(T, nh * hd, 1);
    const Twin o2 = r.random_mat(T, nh * hd, 2);
    std::vector<float> l1 = r.randn(T * nh, 2.0, 0.0, DType::F32), l2 = r.randn(T * nh, 2.0, 0.0, DType::F32);
    l1[4] = -INFINITY;
    l1[5] = l2[5] = -INFINITY;  // nothing visible in either
    Twin lse = r.make({T, nh}, l1, DType::F32);
    const Twin lse2 = r.make({T, nh}, l2, DType::F32);
    r.cpu.attention_merge(o.c, lse.c, o2.c, lse2.c, nh, hd);
    r.gpu.attention_merge(o.d, lse.d, o2.d, lse2.d, nh, hd);
    VERIFY_TWIN_TOL(r, o, "attention_merge", tolerance(2));
    QCOMPARE(r.gpu_values(lse)[5], -INFINITY);
    std::vector<float> a = r.gpu_values(lse), b = r.cpu_values(lse);
    a[4] = a[5] = b[4] = b[5] = 0;
    QVERIFY(rel_l2(a, b) <= 1e-6);
  }

  void conv1d_data() {
    QTest::addColumn<int>("T");
    QTest::addColumn<int>("K");
    QTest::addColumn<bool>("state");
    QTest::addColumn<bool>("silu");
    QTest::addColumn<bool>("aligned");  // 16-byte aligned rows of 8-value pieces: the windowed kernel (K 2 to 4)
    QTest::newRow("prefill") << 33 << 4 << true << true << false;
    QTest::newRow("no state, no bias") << 20 << 4 << false << false << false;
    QTest::newRow("decode 1") << 1 << 4 << true << true << false;
    QTest::newRow("decode 2, width 3") << 2 << 3 << true << true << false;
    QTest::newRow("prefill, 3 tiles, aligned") << 37 << 4 << true << true << true;
    QTest::newRow("no state, no bias, aligned") << 20 << 4 << false << false << true;
    QTest::newRow("decode 1, aligned") << 1 << 4 << true << true << true;
    QTest::newRow("decode 2, width 3, aligned") << 2 << 3 << true << true << true;
    QTest::newRow("width 2, aligned") << 17 << 2 << true << false << true;
    QTest::newRow("width 5, aligned (too wide)") << 9 << 5 << true << true << true;
  }
  void conv1d() {
    QFETCH(int, T);
    QFETCH(int, K);
    QFETCH(bool, state);
    QFETCH(bool, silu);
    QFETCH(bool, aligned);
    Rigs r;
    const int64_t C = aligned ? 88 : 70;
    const Twin x = r.random_mat(T, C, aligned ? 8 : 2), w = r.random({C, K}, 0.4), b = r.random({C}, 0.1);
    Twin st = r.random({K - 1, C});
    Twin y = r.mat(T, C, aligned ? 16 : 1, std::vector<float>(size_t(T * C), 0.0f));
    r.cpu.conv1d_causal(y.c, x.c, w.c, silu ? b.c : Tensor{}, state ? st.c : Tensor{}, silu);
    r.gpu.conv1d_causal(y.d, x.d, w.d, silu ? b.d : Tensor{}, state ? st.d : Tensor{}, silu);
    VERIFY_TWIN(r, y, "conv1d");
    if (state) VERIFY_TWIN_TOL(r, st, "conv state", 0.0);
  }

  void ssd_scan_data() {
    QTest::addColumn<int>("T");
    QTest::addColumn<bool>("state");
    QTest::addColumn<int>("head_dim");
    QTest::addColumn<int>("d_state");
    QTest::newRow("decode") << 1 << true << 16 << 32;
    QTest::newRow("few tokens, no state") << 5 << false << 16 << 32;
    QTest::newRow("one chunk") << 64 << true << 16 << 32;
    QTest::newRow("chunks and a tail") << 150 << true << 24 << 40;
    QTest::newRow("wide state") << 70 << false << 8 << 96;
    // Past one tile of 64 state rows p and one piece of 64 state columns n,
    // each ending partway (a piece of 6: the sums' steps of 4 read zeros).
    QTest::newRow("wide heads, two pieces") << 130 << true << 80 << 70;
    QTest::newRow("mamba2's head and state") << 100 << true << 64 << 128;
  }
  void ssd_scan() {
    QFETCH(int, T);
    QFETCH(bool, state);
    QFETCH(int, head_dim);
    QFETCH(int, d_state);
    Rigs r;
    const int H = 4, G = 2, P = head_dim, N = d_state;
    const Twin x = r.random_mat(T, H * P, 1), dt = r.random_mat(T, H, 2, 1.0), B = r.random_mat(T, G * N, 3),
               C = r.random_mat(T, G * N, 1);
    const Twin dt_bias = r.random({H}, 0.5), A_log = r.random({H}, 0.5), D = r.random({H});
    Twin st = r.random({H, P, N}, 0.5, DType::F32);
    Twin y = r.mat(T, H * P, 2, std::vector<float>(size_t(T * H * P), 0.0f));
    Twin log_decay = r.filled({H}, 0.0f, DType::F32);
    auto args = [&](bool cpu) {
      ss::SsdArgs a;
      a.y = cpu ? y.c : y.d;
      a.x = cpu ? x.c : x.d;
      a.dt = cpu ? dt.c : dt.d;
      a.dt_bias = cpu ? dt_bias.c : dt_bias.d;
      a.A_log = cpu ? A_log.c : A_log.d;
      a.D = cpu ? D.c : D.d;
      a.B = cpu ? B.c : B.d;
      a.C = cpu ? C.c : C.d;
      if (state) a.state = cpu ? st.c : st.d;
      a.log_decay = cpu ? log_decay.c : log_decay.d;
      a.n_heads = H;
      a.head_dim = P;
      a.n_groups = G;
      a.d_state = N;
      a.dt_min = 0.001f;
      a.dt_max = 0.5f;
      return a;
    };
    r.cpu.ssd_scan(args(true));
    r.gpu.ssd_scan(args(false));
    VERIFY_TWIN(r, y, "ssd_scan y");
    if (state) VERIFY_TWIN_TOL(r, st, "ssd_scan state", g_dtype == DType::F32 ? 1e-5 : 4 * unit_roundoff(g_dtype));
    VERIFY_TWIN_TOL(r, log_decay, "log_decay", 1e-6);
  }

  // Sequence-parallel state passing: the correction for an incoming state and the advance.
  void ssd_state_passing() {
    Rigs r;
    const int64_t T = 90;
    const int H = 2, G = 1, P = 8, N = 16;
    const Twin dt = r.random_mat(T, H, 1), C = r.random_mat(T, G * N, 2);
    const Twin dt_bias = r.random({H}, 0.5), A_log = r.random({H}, 0.5);
    Twin st = r.random({H, P, N}, 0.5, DType::F32);
    Twin y = r.random_mat(T, H * P, 1);
    auto args = [&](bool cpu) {
      ss::SsdArgs a;
      a.y = cpu ? y.c : y.d;
      a.dt = cpu ? dt.c : dt.d;
      a.dt_bias = cpu ? dt_bias.c : dt_bias.d;
      a.A_log = cpu ? A_log.c : A_log.d;
      a.C = cpu ? C.c : C.d;
      a.state = cpu ? st.c : st.d;
      a.n_heads = H;
      a.head_dim = P;
      a.n_groups = G;
      a.d_state = N;
      a.dt_max = 1.0f;
      return a;
    };
    r.cpu.ssd_state_correction(args(true));
    r.gpu.ssd_state_correction(args(false));
    VERIFY_TWIN_TOL(r, y, "ssd_state_correction", tolerance(2));
    const Twin chunk = r.random({H, P, N}, 0.5, DType::F32);
    const Twin decay = r.make({H}, {-0.3f, -2.0f}, DType::F32);
    r.cpu.ssd_state_advance(st.c, chunk.c, decay.c);
    r.gpu.ssd_state_advance(st.d, chunk.d, decay.d);
    VERIFY_TWIN_TOL(r, st, "ssd_state_advance", 1e-6);
  }

  void selective_scan_data() {
    QTest::addColumn<int>("T");
    QTest::addColumn<bool>("gate");
    QTest::addColumn<bool>("state");
    QTest::addColumn<int>("d_state");  // 8 or less: 4 channels a warp; 16 or less: 2; else 1
    QTest::addColumn<int>("channels");
    QTest::newRow("prefill") << 45 << true << true << 16 << 40;
    QTest::newRow("no gate, no state") << 30 << false << false << 16 << 40;
    QTest::newRow("decode") << 1 << true << true << 16 << 40;
    QTest::newRow("odd channels (a dead segment)") << 19 << true << true << 16 << 37;
    QTest::newRow("small state, 4 channels a warp") << 21 << true << true << 6 << 35;
    QTest::newRow("wide state, 2 a lane") << 13 << true << true << 40 << 9;
  }
  void selective_scan() {
    QFETCH(int, T);
    QFETCH(bool, gate);
    QFETCH(bool, state);
    QFETCH(int, d_state);
    QFETCH(int, channels);
    Rigs r;
    const int64_t Di = channels, N = d_state;
    const Twin x = r.random_mat(T, Di, 1), dt = r.random_mat(T, Di, 2), z = r.random_mat(T, Di, 1),
               B = r.random_mat(T, N, 2), C = r.random_mat(T, N, 1);
    const Twin dt_bias = r.random({Di}, 0.5), D = r.random({Di}), A_log = r.random({Di, N}, 0.5);
    Twin st = r.random({Di, N}, 0.5, DType::F32);
    Twin dt_sum = r.filled({Di}, 0.0f, DType::F32);
    Twin y = r.mat(T, Di, 3, std::vector<float>(size_t(T * Di), 0.0f));
    auto args = [&](bool cpu) {
      ss::SelectiveScanArgs a;
      a.y = cpu ? y.c : y.d;
      a.x = cpu ? x.c : x.d;
      a.dt = cpu ? dt.c : dt.d;
      if (gate) a.z = cpu ? z.c : z.d;
      a.dt_bias = cpu ? dt_bias.c : dt_bias.d;
      a.D = cpu ? D.c : D.d;
      a.A_log = cpu ? A_log.c : A_log.d;
      a.B = cpu ? B.c : B.d;
      a.C = cpu ? C.c : C.d;
      if (state) a.state = cpu ? st.c : st.d;
      a.dt_sum = cpu ? dt_sum.c : dt_sum.d;
      return a;
    };
    r.cpu.selective_scan(args(true));
    r.gpu.selective_scan(args(false));
    VERIFY_TWIN(r, y, "selective_scan y");
    if (state) VERIFY_TWIN_TOL(r, st, "selective_scan state", 1e-5);
    VERIFY_TWIN_TOL(r, dt_sum, "dt_sum", 1e-6);
    // the incoming-state correction and the advance
    Twin st_in = r.random({Di, N}, 0.5, DType::F32);
    auto corr = args(true);
    corr.state = st_in.c;
    r.cpu.selective_state_correction(corr);
    corr = args(false);
    corr.state = st_in.d;
    r.gpu.selective_state_correction(corr);
    VERIFY_TWIN_TOL(r, y, "selective_state_correction", tolerance(2));
    r.cpu.selective_state_advance(st_in.c, A_log.c, st.c, dt_sum.c);
    r.gpu.selective_state_advance(st_in.d, A_log.d, st.d, dt_sum.d);
    VERIFY_TWIN_TOL(r, st_in, "selective_state_advance", 1e-5);
  }

  // The quantized formats, byte for byte the cpu's (comm/quantize.cpp).
  void quantize_data() {
    QTest::addColumn<QString>("spec");
    QTest::addColumn<int>("n");
    for (const char* s : {"int8:128", "int8:32", "int8:tensor", "int8:2000", "int4:128", "int4:33", "int4:tensor",
                          "fp8:128", "fp8:tensor", "bf16", "fp16", "fp32", "int8:64:sr", "int4:64:sr", "fp8:32:sr"})
      for (int n : {1000, 4999}) QTest::newRow(qPrintable(QStringLiteral("%1 n=%2").arg(s).arg(n))) << s << n;
  }
  void quantize() {
    QFETCH(QString, spec);
    QFETCH(int, n);
    ss::QuantSpec q = ss::parse_quant_spec(spec.toStdString());
    q.seed = 7;
    Rigs r;
    std::vector<float> values = r.randn(n, 3.0);
    for (int i = 0; i < n; i += 97) values[size_t(i)] = 0.0f;  // zeros, and a zero block below
    if (n > 300)
      for (int i = 128; i < 256; ++i) values[size_t(i)] = 0.0f;
    const Twin in = r.make({n}, values);
    const int64_t bytes = ss::quantized_bytes(n, q);
    const int64_t carrier = (bytes + 3) / 4;
    Twin out = r.filled({carrier}, 0.0f, DType::F32);
    r.cpu.quantize(out.c, in.c, q, 12345);
    r.gpu.quantize(out.d, in.d, q, 12345);
    std::vector<float> gc(static_cast<size_t>(carrier)), cc(static_cast<size_t>(carrier));
    r.gpu.download(out.d, gc.data());
    r.cpu.download(out.c, cc.data());
    QVERIFY2(std::memcmp(gc.data(), cc.data(), size_t(bytes)) == 0, "quantized bytes differ from the cpu's");
    Twin back = r.random({n});
    r.cpu.dequantize(back.c, out.c, q, true);
    r.gpu.dequantize(back.d, out.d, q, true);
    VERIFY_TWIN_TOL(r, back, "dequantize (accumulate)", tolerance(1));
  }

  void transfers() {
    Rigs r;
    const std::vector<float> v = r.randn(333, 1.0, 0.0, DType::F32);  // not representable: rounded on upload
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      const Twin t = r.make({333}, v, dt);
      QCOMPARE(r.gpu_values(t), r.cpu_values(t));  // both round once to nearest even
    }
    std::vector<uint16_t> bits(333);
    ss::narrow(v.data(), 333, DType::BF16, bits.data());
    Tensor d = r.gpu.alloc({333}, Category::Weights, "w", DType::BF16);
    r.gpu.upload(d, bits.data(), DType::BF16);  // a bf16 checkpoint into a bf16 run: copied
    std::vector<float> back(333), want(333);
    r.gpu.download(d, back.data());
    ss::widen(bits.data(), DType::BF16, 333, want.data());
    QCOMPARE(back, want);
  }

  // ---- training: backward kernels, the loss and the optimizer

  void matmul_grads() {
    Rigs r;
    const int64_t M = 23, N = 37, K = 19;
    const Twin dy = r.random_mat(M, N, 2), w = r.random({N, K}, 0.3), x = r.random_mat(M, K, 1);
    Twin dx = r.random_mat(M, K, 3), dw = r.random({N, K}, 1.0, DType::F32);
    r.cpu.matmul_dx(dx.c, dy.c, w.c, true);
    r.gpu.matmul_dx(dx.d, dy.d, w.d, true);
    VERIFY_TWIN_TOL(r, dx, "matmul_dx", tolerance(2));
    r.cpu.matmul_dw(dw.c, dy.c, x.c, true);
    r.gpu.matmul_dw(dw.d, dy.d, x.d, true);
    VERIFY_TWIN_TOL(r, dw, "matmul_dw (fp32 gradient)", tolerance(1));
  }

  void row_grads() {
    Rigs r;
    const int64_t T = 13, C = 96;
    const Twin dy = r.random_mat(T, C, 1), x = r.random_mat(T, C, 2), z = r.random_mat(T, C, 1);
    const Twin w = r.make({C}, r.randn(C, 0.2, 1.0));
    for (int64_t group : {C, int64_t(32)}) {
      Twin dx = r.random_mat(T, C, 1);
      Twin dw = r.random({C}, 1.0, DType::F32);
      r.cpu.rmsnorm_backward(dx.c, dw.c, dy.c, x.c, w.c, 1e-5f, group);
      r.gpu.rmsnorm_backward(dx.d, dw.d, dy.d, x.d, w.d, 1e-5f, group);
      VERIFY_TWIN_TOL(r, dx, "rmsnorm_backward dx", tolerance(2));
      VERIFY_TWIN_TOL(r, dw, "rmsnorm_backward dw", 1e-5);
      r.cpu.rmsnorm_backward(dx.c, Tensor{}, dy.c, x.c, Tensor{}, 1e-5f, group);
      r.gpu.rmsnorm_backward(dx.d, Tensor{}, dy.d, x.d, Tensor{}, 1e-5f, group);
      VERIFY_TWIN_TOL(r, dx, "rmsnorm_backward without weight", tolerance(3));
      Twin dz = r.filled({T, C}, 0.0f), gdx = r.filled({T, C}, 0.0f);
      r.cpu.gated_rmsnorm_backward(gdx.c, dz.c, dw.c, dy.c, x.c, z.c, w.c, 1e-5f, group);
      r.gpu.gated_rmsnorm_backward(gdx.d, dz.d, dw.d, dy.d, x.d, z.d, w.d, 1e-5f, group);
      VERIFY_TWIN(r, gdx, "gated_rmsnorm_backward dx");
      VERIFY_TWIN(r, dz, "gated_rmsnorm_backward dz");
      VERIFY_TWIN_TOL(r, dw, "gated_rmsnorm_backward dw", 1e-5);
    }
    Twin db = r.random({C}, 1.0, DType::F32);
    r.cpu.bias_backward(db.c, dy.c);
    r.gpu.bias_backward(db.d, dy.d);
    VERIFY_TWIN_TOL(r, db, "bias_backward", 1e-5);
    Twin dgate = r.filled({T, C}, 0.0f), dup = r.filled({T, C}, 0.0f);
    r.cpu.silu_mul_backward(dgate.c, dup.c, dy.c, x.c, z.c);
    r.gpu.silu_mul_backward(dgate.d, dup.d, dy.d, x.d, z.d);
    VERIFY_TWIN(r, dgate, "silu_mul_backward dgate");
    VERIFY_TWIN(r, dup, "silu_mul_backward dup");
    // Repeated tokens add up in their row.
    Twin table = r.random({40, C}, 1.0, DType::F32);
    const std::vector<int32_t> tokens = {3, 7, 3, 0, 39, 7, 7, 12, 3, 1, 2, 5, 6};
    r.cpu.embedding_backward(table.c, dy.c, tokens);
    r.gpu.embedding_backward(table.d, dy.d, tokens);
    VERIFY_TWIN_TOL(r, table, "embedding_backward", 1e-5);
  }

  void loss_and_optimizer() {
    Rigs r;
    const int64_t R = 6, V = 300;
    Twin logits = r.random({R, V}, 3.0, DType::F32);
    Twin loss = r.filled({R}, 0.0f, DType::F32);
    const std::vector<int32_t> targets = {4, 299, -1, 0, 17, 150};
    r.cpu.cross_entropy(logits.c, loss.c, targets, 0.25f);
    r.gpu.cross_entropy(logits.d, loss.d, targets, 0.25f);
    VERIFY_TWIN_TOL(r, logits, "cross_entropy gradient", 1e-5);
    VERIFY_TWIN_TOL(r, loss, "cross_entropy loss", 1e-5);
    std::vector<float> v = r.randn(5000, 2.0);
    v[17] = INFINITY;
    v[4000] = kNaN;
    const Twin t = r.make({5000}, v);
    Twin out = r.make({2}, {1.5f, 0.0f}, DType::F32);
    r.cpu.count_nonfinite(out.c, t.c);
    r.gpu.count_nonfinite(out.d, t.d);
    QCOMPARE(r.gpu_values(out), r.cpu_values(out));
    QCOMPARE(r.gpu_values(out)[0], 3.5f);
    v[17] = v[4000] = 1.0f;
    const Twin finite = r.make({5000}, v);
    r.cpu.sum_squares(out.c, finite.c);
    r.gpu.sum_squares(out.d, finite.d);
    VERIFY_TWIN_TOL(r, out, "sum_squares", 1e-5);  // fp32 sums in another order
    // AdamW on a 16-bit parameter with its fp32 master copy, or on fp32 itself.
    const int64_t n = 777;
    const std::vector<float> p0 = r.randn(n, 1.0, 0.0, DType::F32);
    Twin param = r.make({n}, p0), master = r.make({n}, p0, DType::F32), grad = r.random({n});
    Twin m = r.random({n}, 0.1, DType::F32), var = r.make({n}, std::vector<float>(size_t(n), 0.01f), DType::F32);
    ss::AdamWArgs a;
    a.lr = 1e-2f;
    a.weight_decay = 0.1f;
    a.grad_scale = 0.5f;
    a.step = 3;
    const bool wide = g_dtype == DType::F32;
    r.cpu.adamw(param.c, wide ? Tensor{} : master.c, grad.c, m.c, var.c, a);
    r.gpu.adamw(param.d, wide ? Tensor{} : master.d, grad.d, m.d, var.d, a);
    VERIFY_TWIN_TOL(r, param, "adamw parameter", tolerance());
    VERIFY_TWIN_TOL(r, m, "adamw m", 1e-6);
    VERIFY_TWIN_TOL(r, var, "adamw v", 1e-6);
    if (!wide) VERIFY_TWIN_TOL(r, master, "adamw master", 1e-6);
  }

  void attention_backward_data() {
    QTest::addColumn<int>("Tq");
    QTest::addColumn<int>("Tk");
    QTest::addColumn<int>("heads");
    QTest::addColumn<int>("kv_heads");
    QTest::addColumn<int>("head_dim");
    QTest::addColumn<bool>("zigzag");
    QTest::newRow("causal, grouped") << 45 << 45 << 4 << 2 << 16 << false;
    QTest::newRow("width 64, two tiles") << 70 << 70 << 2 << 1 << 64 << false;
    QTest::newRow("zigzag rank over gathered keys") << 24 << 48 << 2 << 2 << 12 << true;
  }
  void attention_backward() {
    QFETCH(int, Tq);
    QFETCH(int, Tk);
    QFETCH(int, heads);
    QFETCH(int, kv_heads);
    QFETCH(int, head_dim);
    QFETCH(bool, zigzag);
    Rigs r;
    const std::vector<int32_t> qp = zigzag ? zigzag_pos(2 * Tq, 2, 0) : iota_pos(Tq), kp = iota_pos(Tk);
    const int64_t hq = int64_t(heads) * head_dim, hkv = int64_t(kv_heads) * head_dim;
    const Twin q = r.random_mat(Tq, hq, 1), k = r.random_mat(Tk, hkv, 2), v = r.random_mat(Tk, hkv, 1),
               dout = r.random_mat(Tq, hq, 2);
    ss::AttentionArgs a;
    a.n_heads = heads;
    a.n_kv_heads = kv_heads;
    a.head_dim = head_dim;
    a.scale = float(1.0 / std::sqrt(double(head_dim)));
    a.q_pos = qp;
    a.k_pos = kp;
    // The forward's output and lse from the cpu, the same on both sides.
    Twin o = r.filled({Tq, hq}, 0.0f), lse = r.filled({Tq, heads}, 0.0f, DType::F32);
    r.cpu.attention(o.c, q.c, k.c, v.c, a, lse.c);
    const std::vector<float> ov = r.cpu_values(o), lv = r.cpu_values(lse);
    o = r.make({Tq, hq}, ov);
    lse = r.make({Tq, heads}, lv, DType::F32);
    Twin dq = r.mat(Tq, hq, 1, std::vector<float>(size_t(Tq * hq), 0.0f)),
         dk = r.mat(Tk, hkv, 2, std::vector<float>(size_t(Tk * hkv), 0.0f)), dv = r.filled({Tk, hkv}, 0.0f);
    r.cpu.attention_backward(dq.c, dk.c, dv.c, dout.c, q.c, k.c, v.c, o.c, lse.c, a);
    r.gpu.attention_backward(dq.d, dk.d, dv.d, dout.d, q.d, k.d, v.d, o.d, lse.d, a);
    VERIFY_TWIN(r, dq, "attention_backward dq");
    VERIFY_TWIN(r, dk, "attention_backward dk");
    VERIFY_TWIN(r, dv, "attention_backward dv");
  }

  void conv1d_backward() {
    Rigs r;
    const int64_t T = 21, C = 40, K = 4;
    const Twin x = r.random_mat(T, C, 1), dy = r.random_mat(T, C, 2), w = r.random({C, K}, 0.4),
               b = r.random({C}, 0.1), state = r.random({K - 1, C});
    for (bool with_state : {true, false}) {
      Twin dx = r.filled({T, C}, 0.0f), dw = r.random({C, K}, 1.0, DType::F32), db = r.random({C}, 1.0, DType::F32);
      Twin dstate = r.filled({K - 1, C}, 0.0f);
      r.cpu.conv1d_backward(dx.c, dw.c, db.c, with_state ? dstate.c : Tensor{}, dy.c, x.c, w.c, b.c,
                            with_state ? state.c : Tensor{}, true);
      r.gpu.conv1d_backward(dx.d, dw.d, db.d, with_state ? dstate.d : Tensor{}, dy.d, x.d, w.d, b.d,
                            with_state ? state.d : Tensor{}, true);
      VERIFY_TWIN(r, dx, "conv1d_backward dx");
      VERIFY_TWIN_TOL(r, dw, "conv1d_backward dw", 1e-5);
      VERIFY_TWIN_TOL(r, db, "conv1d_backward db", 1e-5);
      if (with_state) VERIFY_TWIN(r, dstate, "conv1d_backward dstate");
    }
  }

  void ssd_scan_backward_data() {
    QTest::addColumn<int>("T");
    QTest::addColumn<bool>("states");
    QTest::newRow("one chunk, states in and out") << 40 << true;
    QTest::newRow("chunks and a tail, no states") << 150 << false;
  }
  void ssd_scan_backward() {
    QFETCH(int, T);
    QFETCH(bool, states);
    Rigs r;
    const int H = 4, G = 2, P = 8, N = 16;
    const Twin x = r.random_mat(T, H * P, 1), dt = r.random_mat(T, H, 1), B = r.random_mat(T, G * N, 2),
               C = r.random_mat(T, G * N, 1), dy = r.random_mat(T, H * P, 2);
    const Twin dt_bias = r.random({H}, 0.5), A_log = r.random({H}, 0.5), D = r.random({H});
    const Twin st = r.random({H, P, N}, 0.5, DType::F32), dst_out = r.random({H, P, N}, 0.5, DType::F32);
    Twin dx = r.filled({T, H * P}, 0.0f), ddt = r.filled({T, H}, 0.0f), dB = r.filled({T, G * N}, 0.0f),
         dC = r.filled({T, G * N}, 0.0f);
    Twin dbias = r.random({H}, 1.0, DType::F32), dA = r.random({H}, 1.0, DType::F32), dD = r.random({H}, 1.0, DType::F32);
    Twin dst_in = r.filled({H, P, N}, 0.0f, DType::F32);
    auto run = [&](bool cpu) {
      ss::SsdArgs a;
      a.x = cpu ? x.c : x.d;
      a.dt = cpu ? dt.c : dt.d;
      a.dt_bias = cpu ? dt_bias.c : dt_bias.d;
      a.A_log = cpu ? A_log.c : A_log.d;
      a.D = cpu ? D.c : D.d;
      a.B = cpu ? B.c : B.d;
      a.C = cpu ? C.c : C.d;
      if (states) a.state = cpu ? st.c : st.d;
      a.n_heads = H;
      a.head_dim = P;
      a.n_groups = G;
      a.d_state = N;
      a.chunk = 32;
      a.dt_min = 0.001f;
      a.dt_max = 0.8f;
      ss::SsdGrads g;
      g.dx = cpu ? dx.c : dx.d;
      g.ddt = cpu ? ddt.c : ddt.d;
      g.dB = cpu ? dB.c : dB.d;
      g.dC = cpu ? dC.c : dC.d;
      g.d_dt_bias = cpu ? dbias.c : dbias.d;
      g.dA_log = cpu ? dA.c : dA.d;
      g.dD = cpu ? dD.c : dD.d;
      if (states) {
        g.dstate_out = cpu ? dst_out.c : dst_out.d;
        g.dstate_in = cpu ? dst_in.c : dst_in.d;
      }
      (cpu ? static_cast<ss::Backend&>(r.cpu) : r.gpu).ssd_scan_backward(a, cpu ? dy.c : dy.d, g);
    };
    run(true);
    run(false);
    VERIFY_TWIN(r, dx, "ssd dx");
    VERIFY_TWIN(r, ddt, "ssd ddt");
    VERIFY_TWIN(r, dB, "ssd dB");
    VERIFY_TWIN(r, dC, "ssd dC");
    VERIFY_TWIN_TOL(r, dbias, "ssd d_dt_bias", 1e-4);
    VERIFY_TWIN_TOL(r, dA, "ssd dA_log", 1e-4);
    VERIFY_TWIN_TOL(r, dD, "ssd dD", 1e-5);
    if (states) VERIFY_TWIN_TOL(r, dst_in, "ssd dstate_in", 1e-5);
  }

  void selective_scan_backward() {
    Rigs r;
    const int64_t T = 37, Di = 24, N = 8;
    const Twin x = r.random_mat(T, Di, 1), dt = r.random_mat(T, Di, 2), z = r.random_mat(T, Di, 1),
               B = r.random_mat(T, N, 1), C = r.random_mat(T, N, 2), dy = r.random_mat(T, Di, 1);
    const Twin dt_bias = r.random({Di}, 0.5), D = r.random({Di}), A_log = r.random({Di, N}, 0.5);
    const Twin st = r.random({Di, N}, 0.5, DType::F32), dst_out = r.random({Di, N}, 0.5, DType::F32);
    Twin dx = r.filled({T, Di}, 0.0f), ddt = r.filled({T, Di}, 0.0f), dz = r.filled({T, Di}, 0.0f),
         dB = r.filled({T, N}, 0.0f), dC = r.filled({T, N}, 0.0f);
    Twin dbias = r.random({Di}, 1.0, DType::F32), dA = r.random({Di, N}, 1.0, DType::F32),
         dD = r.random({Di}, 1.0, DType::F32), dst_in = r.filled({Di, N}, 0.0f, DType::F32);
    auto run = [&](bool cpu) {
      ss::SelectiveScanArgs a;
      a.x = cpu ? x.c : x.d;
      a.dt = cpu ? dt.c : dt.d;
      a.z = cpu ? z.c : z.d;
      a.dt_bias = cpu ? dt_bias.c : dt_bias.d;
      a.D = cpu ? D.c : D.d;
      a.A_log = cpu ? A_log.c : A_log.d;
      a.B = cpu ? B.c : B.d;
      a.C = cpu ? C.c : C.d;
      a.state = cpu ? st.c : st.d;
      a.chunk = 16;
      ss::SelectiveGrads g;
      g.dx = cpu ? dx.c : dx.d;
      g.ddt = cpu ? ddt.c : ddt.d;
      g.dz = cpu ? dz.c : dz.d;
      g.dB = cpu ? dB.c : dB.d;
      g.dC = cpu ? dC.c : dC.d;
      g.d_dt_bias = cpu ? dbias.c : dbias.d;
      g.dA_log = cpu ? dA.c : dA.d;
      g.dD = cpu ? dD.c : dD.d;
      g.dstate_out = cpu ? dst_out.c : dst_out.d;
      g.dstate_in = cpu ? dst_in.c : dst_in.d;
      (cpu ? static_cast<ss::Backend&>(r.cpu) : r.gpu).selective_scan_backward(a, cpu ? dy.c : dy.d, g);
    };
    run(true);
    run(false);
    VERIFY_TWIN(r, dx, "selective dx");
    VERIFY_TWIN(r, ddt, "selective ddt");
    VERIFY_TWIN(r, dz, "selective dz");
    VERIFY_TWIN(r, dB, "selective dB");
    VERIFY_TWIN(r, dC, "selective dC");
    VERIFY_TWIN_TOL(r, dbias, "selective d_dt_bias", 1e-5);
    VERIFY_TWIN_TOL(r, dA, "selective dA_log", 1e-5);
    VERIFY_TWIN_TOL(r, dD, "selective dD", 1e-5);
    VERIFY_TWIN_TOL(r, dst_in, "selective dstate_in", 1e-5);
  }

  // Every kernel leaves one compute span, with the ops' names, in order.
  void spans() {
    Rigs r;
    const Twin a = r.random({8, 16}), b = r.random({8, 16});
    Twin y = r.filled({8, 16}, 0.0f);
    r.dr.take_spans();
    r.gpu.add(y.d, a.d, b.d);
    r.gpu.silu_mul(y.d, a.d, b.d);
    const auto spans = r.dr.take_spans();
    QCOMPARE(int(spans.size()), 2);
    QCOMPARE(QString::fromStdString(spans[0].op), QStringLiteral("add"));
    QCOMPARE(QString::fromStdString(spans[1].op), QStringLiteral("silu_mul"));
    QVERIFY(spans[0].t0 <= spans[0].t1 && spans[0].t1 <= spans[1].t0 && spans[1].t0 <= spans[1].t1);
    QCOMPARE(spans[0].stream, std::string("compute"));
  }
};

int main(int argc, char** argv) {
  QCoreApplication app(argc, argv);
  int failed = 0;
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    g_dtype = dt;
    std::printf("********* compute dtype %s *********\n", std::string(ss::compute_dtype_name(dt)).c_str());
    TestCudaOps t;
    failed += QTest::qExec(&t, argc, argv);
  }
  return failed ? 1 : 0;
}

#include "tst_cuda_ops.moc"
