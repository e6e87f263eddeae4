// Every backward kernel of the cpu backend against a float64 gradient that
// knows nothing of the kernel's formulas: the central finite difference, one
// input element at a time, of L = <dy, f(x)> with f the naive float64 forward
// of reference.h and dy a fixed random cotangent. In double, with step 1e-6,
// the difference's truncation error is ~1e-12 and its rounding ~1e-10
// relative, far below the 1e-5 bound the kernels (fp32 arithmetic) are held
// to. The optimizer step is checked against a float64 AdamW written from the
// paper's formulas.
#include <QtTest>

#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "core/backend.h"
#include "cpu/cpu_backend.h"
#include "reference.h"

using ss::Category;
using ss::Tensor;
using ref::Vec;

namespace {

constexpr double kTol = 1e-5;

std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// dL/dx by central differences, L(x) = <dy, f(x)>, f in float64.
Vec finite_difference(const std::function<Vec(const Vec&)>& f, Vec x, const Vec& dy) {
  constexpr double h = 1e-6;
  Vec g(x.size());
  auto loss = [&](const Vec& at) {
    const Vec y = f(at);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * dy[i];
    return s;
  };
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = loss(x);
    x[i] = keep - h;
    const double down = loss(x);
    x[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

#define VERIFY_GRAD(got, want, what)                                                   \
  do {                                                                                 \
    const double err_ = ref::rel_l2(got, want);                                        \
    QVERIFY2(err_ <= kTol, qPrintable(QStringLiteral("%1: relative L2 error %2 > %3")  \
                                          .arg(QStringLiteral(what))                   \
                                          .arg(err_)                                   \
                                          .arg(kTol)));                                \
  } while (0)

}  // namespace

class TestBackward : public QObject {
  Q_OBJECT
  ss::Allocator m_alloc;
  ss::Recorder m_rec;
  ss::CpuBackend m_be{m_alloc, m_rec};

  Tensor make(const std::vector<float>& v, ss::Shape shape) {
    Tensor t = m_be.alloc(shape, Category::Activations, "t");
    m_be.upload(t, v.data(), ss::DType::F32);
    return t;
  }
  std::vector<float> read(const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    m_be.download(t, v.data());
    return v;
  }

 private slots:
  void matmulGradients() {
    const int64_t M = 37, N = 29, K = 53;
    const auto x = random_vec(size_t(M * K), 1), w = random_vec(size_t(N * K), 2), dy = random_vec(size_t(M * N), 3);
    const Vec xd = ref::to_double(x), wd = ref::to_double(w), dyd = ref::to_double(dy);
    const Vec want_dx = finite_difference([&](const Vec& a) { return ref::matmul(a, wd, M, N, K); }, xd, dyd);
    const Vec want_dw = finite_difference([&](const Vec& b) { return ref::matmul(xd, b, M, N, K); }, wd, dyd);
    Tensor tx = make(x, {M, K}), tw = make(w, {N, K}), tdy = make(dy, {M, N});
    Tensor dx = m_be.alloc({M, K}, Category::Activations, "dx"), dw = m_be.alloc({N, K}, Category::Grads, "dw");
    m_be.matmul_dx(dx, tdy, tw, false);
    m_be.matmul_dw(dw, tdy, tx, false);
    VERIFY_GRAD(read(dx), want_dx, "matmul dx");
    VERIFY_GRAD(read(dw), want_dw, "matmul dw");
    // Accumulating forms add to what is there (micro-batches, residual gradients).
    m_be.matmul_dw(dw, tdy, tx, true);
    Vec twice = want_dw;
    for (auto& v : twice) v *= 2;
    VERIFY_GRAD(read(dw), twice, "matmul dw accumulated");
  }

  void embeddingGradient() {
    const int64_t V = 11, d = 7;
    const std::vector<int32_t> tokens = {3, 5, 3, 0, 10, 3};
    const int64_t T = int64_t(tokens.size());
    const auto table = random_vec(size_t(V * d), 4), dy = random_vec(size_t(T * d), 5);
    auto f = [&](const Vec& tab) {
      Vec y(size_t(T * d));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < d; ++c) y[size_t(t * d + c)] = tab[size_t(tokens[size_t(t)] * d + c)];
      return y;
    };
    const Vec want = finite_difference(f, ref::to_double(table), ref::to_double(dy));
    Tensor dtab = m_be.alloc({V, d}, Category::Grads, "dtable");
    m_be.fill(dtab, 0.0f);
    m_be.embedding_backward(dtab, make(dy, {T, d}), tokens);
    VERIFY_GRAD(read(dtab), want, "embedding");
  }

  void rmsnormGradients_data() {
    QTest::addColumn<int>("group");
    QTest::addColumn<bool>("weighted");
    QTest::newRow("whole row, weighted") << 24 << true;
    QTest::newRow("groups of 8, weighted") << 8 << true;
    QTest::newRow("whole row, no weight") << 24 << false;
  }
  void rmsnormGradients() {
    QFETCH(int, group);
    QFETCH(bool, weighted);
    const int64_t T = 9, n = 24;
    const double eps = 1e-5;
    const auto x = random_vec(size_t(T * n), 6), w = random_vec(size_t(n), 7), dy = random_vec(size_t(T * n), 8);
    const Vec xd = ref::to_double(x), wd = ref::to_double(w), dyd = ref::to_double(dy);
    const Vec want_dx = finite_difference(
        [&](const Vec& a) { return ref::rmsnorm(a, nullptr, weighted ? &wd : nullptr, T, n, group, eps); }, xd, dyd);
    const Vec want_dw =
        finite_difference([&](const Vec& b) { return ref::rmsnorm(xd, nullptr, &b, T, n, group, eps); }, wd, dyd);
    // dx accumulates into a residual gradient that already holds a value.
    const auto base = random_vec(size_t(T * n), 9);
    Tensor dx = make(base, {T, n});
    Tensor tw = weighted ? make(w, {n}) : Tensor{};
    Tensor dw = weighted ? m_be.alloc({n}, Category::Grads, "dw") : Tensor{};
    if (weighted) m_be.fill(dw, 0.0f);
    m_be.rmsnorm_backward(dx, dw, make(dy, {T, n}), make(x, {T, n}), tw, float(eps), group);
    Vec want_acc = want_dx;
    for (size_t i = 0; i < want_acc.size(); ++i) want_acc[i] += base[i];
    VERIFY_GRAD(read(dx), want_acc, "rmsnorm dx (accumulated)");
    if (weighted) VERIFY_GRAD(read(dw), want_dw, "rmsnorm dw");
  }

  void ropeGradient() {
    const int64_t T = 6;
    const int nh = 3, hd = 8;
    const std::vector<int32_t> pos = {0, 7, 2, 13, 4, 100};
    const auto x = random_vec(size_t(T * nh * hd), 10), dy = random_vec(x.size(), 11);
    const Vec want = finite_difference([&](const Vec& a) { return ref::rope(a, T, nh, hd, pos, 10000.0); },
                                       ref::to_double(x), ref::to_double(dy));
    Tensor g = make(dy, {T, nh * hd});
    m_be.rope_backward(g, nh, hd, pos, ref::rope_freqs(10000.0, hd));
    VERIFY_GRAD(read(g), want, "rope");
  }

  // y = x + b per row: db is dy summed over rows (accumulated into db), and
  // the forward adds b to every row.
  void biasGradient() {
    const int64_t T = 7, n = 19;
    const auto x = random_vec(size_t(T * n), 20), b = random_vec(size_t(n), 21), dy = random_vec(x.size(), 22),
               base = random_vec(size_t(n), 23);
    Tensor y = make(x, {T, n});
    m_be.add_bias(y, make(b, {n}));
    Vec want_y(x.size());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < n; ++c) want_y[size_t(t * n + c)] = double(x[size_t(t * n + c)]) + b[size_t(c)];
    VERIFY_GRAD(read(y), want_y, "add_bias y");
    const Vec want = finite_difference(
        [&](const Vec& bb) {
          Vec out(x.size());
          for (int64_t t = 0; t < T; ++t)
            for (int64_t c = 0; c < n; ++c) out[size_t(t * n + c)] = double(x[size_t(t * n + c)]) + bb[size_t(c)];
          return out;
        },
        ref::to_double(b), ref::to_double(dy));
    Vec want_acc = want;
    for (size_t i = 0; i < want_acc.size(); ++i) want_acc[i] += base[i];
    Tensor db = make(base, {n});
    m_be.bias_backward(db, make(dy, {T, n}));
    VERIFY_GRAD(read(db), want_acc, "bias db (accumulated)");
  }

  void siluMulGradients() {
    const int64_t T = 5, n = 33;
    const auto g = random_vec(size_t(T * n), 12, 2.0f), u = random_vec(size_t(T * n), 13), dy = random_vec(g.size(), 14);
    const Vec gd = ref::to_double(g), ud = ref::to_double(u), dyd = ref::to_double(dy);
    auto f = [&](const Vec& a, const Vec& b) {
      Vec y(a.size());
      for (size_t i = 0; i < y.size(); ++i) y[i] = ref::silu(a[i]) * b[i];
      return y;
    };
    const Vec want_dg = finite_difference([&](const Vec& a) { return f(a, ud); }, gd, dyd);
    const Vec want_du = finite_difference([&](const Vec& b) { return f(gd, b); }, ud, dyd);
    Tensor dg = m_be.alloc({T, n}, Category::Activations, "dg"), du = m_be.alloc({T, n}, Category::Activations, "du");
    m_be.silu_mul_backward(dg, du, make(dy, {T, n}), make(g, {T, n}), make(u, {T, n}));
    VERIFY_GRAD(read(dg), want_dg, "silu_mul dgate");
    VERIFY_GRAD(read(du), want_du, "silu_mul dup");
  }

  // Causal attention by position: blocks of 64 crossed (70 queries), grouped
  // kv heads, keys in zigzag order and more keys than queries (a sequence
  // rank's queries over gathered keys).
  void attentionGradients_data() {
    QTest::addColumn<int>("Tq");
    QTest::addColumn<int>("Tk");
    QTest::addColumn<bool>("zigzag");
    QTest::newRow("square, 70 tokens") << 70 << 70 << false;
    QTest::newRow("20 queries over 80 zigzag keys") << 20 << 80 << true;
  }
  void attentionGradients() {
    QFETCH(int, Tq);
    QFETCH(int, Tk);
    QFETCH(bool, zigzag);
    const int nh = 4, nkv = 2, hd = 8;
    const int64_t hq = nh * hd, hkv = nkv * hd;
    std::vector<int32_t> k_pos(static_cast<size_t>(Tk)), q_pos(static_cast<size_t>(Tq));
    std::iota(k_pos.begin(), k_pos.end(), 0);
    if (zigzag) {  // chunks {0, 3} then {1, 2} of four
      const int c = Tk / 4;
      std::vector<int32_t> z;
      for (int chunk : {0, 3, 1, 2})
        for (int i = 0; i < c; ++i) z.push_back(chunk * c + i);
      k_pos = z;
      for (int i = 0; i < Tq; ++i) q_pos[size_t(i)] = i < Tq / 2 ? i : 3 * c + (i - Tq / 2);
    } else {
      std::iota(q_pos.begin(), q_pos.end(), 0);
    }
    const double scale = 1.0 / std::sqrt(double(hd));
    const auto q = random_vec(size_t(Tq * hq), 15), k = random_vec(size_t(Tk * hkv), 16),
               v = random_vec(size_t(Tk * hkv), 17), dy = random_vec(size_t(Tq * hq), 18);
    const Vec qd = ref::to_double(q), kd = ref::to_double(k), vd = ref::to_double(v), dyd = ref::to_double(dy);
    auto f = [&](const Vec& a, const Vec& b, const Vec& c) {
      return ref::attention(a, b, c, Tq, Tk, nh, nkv, hd, scale, q_pos, k_pos);
    };
    const Vec want_dq = finite_difference([&](const Vec& a) { return f(a, kd, vd); }, qd, dyd);
    const Vec want_dk = finite_difference([&](const Vec& b) { return f(qd, b, vd); }, kd, dyd);
    const Vec want_dv = finite_difference([&](const Vec& c) { return f(qd, kd, c); }, vd, dyd);

    Tensor tq = make(q, {Tq, hq}), tk = make(k, {Tk, hkv}), tv = make(v, {Tk, hkv});
    Tensor o = m_be.alloc({Tq, hq}, Category::Activations, "o");
    Tensor lse = m_be.alloc({Tq, nh}, Category::Activations, "lse");
    ss::AttentionArgs a;
    a.n_heads = nh;
    a.n_kv_heads = nkv;
    a.head_dim = hd;
    a.scale = float(scale);
    a.q_pos = q_pos;
    a.k_pos = k_pos;
    m_be.attention(o, tq, tk, tv, a, lse);
    Tensor dq = m_be.alloc({Tq, hq}, Category::Activations, "dq");
    Tensor dk = m_be.alloc({Tk, hkv}, Category::Activations, "dk"), dv = m_be.alloc({Tk, hkv}, Category::Activations, "dv");
    m_be.attention_backward(dq, dk, dv, make(dy, {Tq, hq}), tq, tk, tv, o, lse, a);
    VERIFY_GRAD(read(dq), want_dq, "attention dq");
    VERIFY_GRAD(read(dk), want_dk, "attention dk");
    VERIFY_GRAD(read(dv), want_dv, "attention dv");
  }

  // Depthwise causal conv (with SiLU, bias and a state of the K-1 rows before
  // x, as a sequence rank's halo): dx, dw, db and the state's gradient.
  void conv1dGradients() {
    const int64_t T = 13, C = 6, K = 4;
    const auto x = random_vec(size_t(T * C), 30), w = random_vec(size_t(C * K), 31), b = random_vec(size_t(C), 32),
               st = random_vec(size_t((K - 1) * C), 33), dy = random_vec(size_t(T * C), 34);
    const Vec xd = ref::to_double(x), wd = ref::to_double(w), bd = ref::to_double(b), sd = ref::to_double(st),
              dyd = ref::to_double(dy);
    auto f = [&](const Vec& xx, const Vec& ww, const Vec& bb, const Vec& ss) {
      return ref::conv1d_causal(xx, ww, &bb, &ss, T, C, K, true);
    };
    const Vec want_dx = finite_difference([&](const Vec& v) { return f(v, wd, bd, sd); }, xd, dyd);
    const Vec want_dw = finite_difference([&](const Vec& v) { return f(xd, v, bd, sd); }, wd, dyd);
    const Vec want_db = finite_difference([&](const Vec& v) { return f(xd, wd, v, sd); }, bd, dyd);
    const Vec want_ds = finite_difference([&](const Vec& v) { return f(xd, wd, bd, v); }, sd, dyd);
    Tensor dx = m_be.alloc({T, C}, Category::Activations, "dx"), dw = m_be.alloc({C, K}, Category::Grads, "dw");
    Tensor db = m_be.alloc({C}, Category::Grads, "db"), ds = m_be.alloc({K - 1, C}, Category::Activations, "ds");
    m_be.fill(dw, 0.0f);
    m_be.fill(db, 0.0f);
    m_be.conv1d_backward(dx, dw, db, ds, make(dy, {T, C}), make(x, {T, C}), make(w, {C, K}), make(b, {C}),
                         make(st, {K - 1, C}), true);
    VERIFY_GRAD(read(dx), want_dx, "conv1d dx");
    VERIFY_GRAD(read(dw), want_dw, "conv1d dw");
    VERIFY_GRAD(read(db), want_db, "conv1d db");
    VERIFY_GRAD(read(ds), want_ds, "conv1d dstate");
  }

  void gatedNormGradients() {
    const int64_t T = 7, n = 16, group = 8;
    const double eps = 1e-5;
    const auto x = random_vec(size_t(T * n), 35), z = random_vec(size_t(T * n), 36), w = random_vec(size_t(n), 37),
               dy = random_vec(size_t(T * n), 38);
    const Vec xd = ref::to_double(x), zd = ref::to_double(z), wd = ref::to_double(w), dyd = ref::to_double(dy);
    const Vec want_dx =
        finite_difference([&](const Vec& v) { return ref::rmsnorm(v, &zd, &wd, T, n, group, eps); }, xd, dyd);
    const Vec want_dz =
        finite_difference([&](const Vec& v) { return ref::rmsnorm(xd, &v, &wd, T, n, group, eps); }, zd, dyd);
    const Vec want_dw =
        finite_difference([&](const Vec& v) { return ref::rmsnorm(xd, &zd, &v, T, n, group, eps); }, wd, dyd);
    Tensor dx = m_be.alloc({T, n}, Category::Activations, "dx"), dz = m_be.alloc({T, n}, Category::Activations, "dz");
    Tensor dw = m_be.alloc({n}, Category::Grads, "dw");
    m_be.fill(dw, 0.0f);
    m_be.gated_rmsnorm_backward(dx, dz, dw, make(dy, {T, n}), make(x, {T, n}), make(z, {T, n}), make(w, {n}),
                                float(eps), group);
    VERIFY_GRAD(read(dx), want_dx, "gated norm dx");
    VERIFY_GRAD(read(dz), want_dz, "gated norm dz");
    VERIFY_GRAD(read(dw), want_dw, "gated norm dw");
  }

  // The SSD scan's chunked backward against finite differences of the
  // sequential float64 recurrence, for chunk sizes that divide the length,
  // do not, and exceed it; with an initial state and a gradient arriving at
  // the final state (both of which sequence parallelism passes between ranks).
  void ssdScanGradients_data() {
    QTest::addColumn<int>("T");
    QTest::addColumn<int>("chunk");
    QTest::newRow("T 12, chunk 4") << 12 << 4;
    QTest::newRow("T 13, chunk 5 (a short last chunk)") << 13 << 5;
    QTest::newRow("T 7, chunk 16 (one chunk)") << 7 << 16;
    QTest::newRow("T 21, chunk 1") << 21 << 1;
  }
  void ssdScanGradients() {
    QFETCH(int, T);
    QFETCH(int, chunk);
    const int H = 4, P = 3, G = 2, N = 5;
    ref::SsdProblem p;
    p.T = T;
    p.n_heads = H;
    p.head_dim = P;
    p.n_groups = G;
    p.d_state = N;
    const auto x = random_vec(size_t(T * H * P), 40), dt = random_vec(size_t(T * H), 41, 0.5f),
               bias = random_vec(size_t(H), 42, 0.5f), alog = random_vec(size_t(H), 43, 0.5f),
               d = random_vec(size_t(H), 44), B = random_vec(size_t(T * G * N), 45), C = random_vec(size_t(T * G * N), 46),
               s0 = random_vec(size_t(H * P * N), 47), dy = random_vec(size_t(T * H * P), 48),
               dsT = random_vec(size_t(H * P * N), 49);
    p.x = ref::to_double(x);
    p.dt = ref::to_double(dt);
    p.dt_bias = ref::to_double(bias);
    p.A_log = ref::to_double(alog);
    p.D = ref::to_double(d);
    p.B = ref::to_double(B);
    p.C = ref::to_double(C);
    // L = <dy, y> + <dS_T, S_T>: y and the final state, one vector.
    Vec cot = ref::to_double(dy);
    const Vec dsd = ref::to_double(dsT);
    cot.insert(cot.end(), dsd.begin(), dsd.end());
    auto run = [&](const ref::SsdProblem& q, Vec state) {
      Vec y = ref::ssd_scan(q, state);
      y.insert(y.end(), state.begin(), state.end());
      return y;
    };
    const Vec s0d = ref::to_double(s0);
    auto grad_of = [&](Vec ref::SsdProblem::*field) {
      return finite_difference(
          [&](const Vec& v) {
            ref::SsdProblem q = p;
            q.*field = v;
            return run(q, s0d);
          },
          p.*field, cot);
    };
    const Vec want_dx = grad_of(&ref::SsdProblem::x), want_ddt = grad_of(&ref::SsdProblem::dt),
              want_dB = grad_of(&ref::SsdProblem::B), want_dC = grad_of(&ref::SsdProblem::C),
              want_bias = grad_of(&ref::SsdProblem::dt_bias), want_alog = grad_of(&ref::SsdProblem::A_log),
              want_D = grad_of(&ref::SsdProblem::D);
    const Vec want_ds0 = finite_difference([&](const Vec& v) { return run(p, v); }, s0d, cot);

    ss::SsdArgs a;
    a.x = make(x, {T, H * P});
    a.dt = make(dt, {T, H});
    a.dt_bias = make(bias, {H});
    a.A_log = make(alog, {H});
    a.D = make(d, {H});
    a.B = make(B, {T, G * N});
    a.C = make(C, {T, G * N});
    a.state = make(s0, {H, P, N});
    a.n_heads = H;
    a.head_dim = P;
    a.n_groups = G;
    a.d_state = N;
    a.chunk = chunk;
    ss::SsdGrads g;
    g.dx = m_be.alloc({T, H * P}, Category::Activations, "dx");
    g.ddt = m_be.alloc({T, H}, Category::Activations, "ddt");
    g.dB = m_be.alloc({T, G * N}, Category::Activations, "dB");
    g.dC = m_be.alloc({T, G * N}, Category::Activations, "dC");
    for (Tensor* t : {&g.d_dt_bias, &g.dA_log, &g.dD}) {
      *t = m_be.alloc({H}, Category::Grads, "dparam");
      m_be.fill(*t, 0.0f);
    }
    g.dstate_out = make(dsT, {H, P, N});
    g.dstate_in = m_be.alloc({H, P, N}, Category::Activations, "ds0");
    m_be.ssd_scan_backward(a, make(dy, {T, H * P}), g);
    VERIFY_GRAD(read(g.dx), want_dx, "ssd dx");
    VERIFY_GRAD(read(g.ddt), want_ddt, "ssd ddt");
    VERIFY_GRAD(read(g.dB), want_dB, "ssd dB");
    VERIFY_GRAD(read(g.dC), want_dC, "ssd dC");
    VERIFY_GRAD(read(g.d_dt_bias), want_bias, "ssd d dt_bias");
    VERIFY_GRAD(read(g.dA_log), want_alog, "ssd dA_log");
    VERIFY_GRAD(read(g.dD), want_D, "ssd dD");
    VERIFY_GRAD(read(g.dstate_in), want_ds0, "ssd d initial state");
  }

  // The selective scan's chunked backward (checkpoints every `chunk` tokens)
  // against finite differences of the sequential float64 recurrence, gated
  // and not, with an initial state and a final state's gradient.
  void selectiveScanGradients_data() {
    QTest::addColumn<int>("T");
    QTest::addColumn<int>("chunk");
    QTest::addColumn<bool>("gated");
    QTest::newRow("T 12, chunk 4, gated") << 12 << 4 << true;
    QTest::newRow("T 13, chunk 5, gated") << 13 << 5 << true;
    QTest::newRow("T 9, chunk 256, no gate") << 9 << 256 << false;
    QTest::newRow("T 10, chunk 1, gated") << 10 << 1 << true;
  }
  void selectiveScanGradients() {
    QFETCH(int, T);
    QFETCH(int, chunk);
    QFETCH(bool, gated);
    const int Ch = 5, N = 4;
    ref::SelectiveProblem p;
    p.T = T;
    p.channels = Ch;
    p.d_state = N;
    const auto x = random_vec(size_t(T * Ch), 50), dt = random_vec(size_t(T * Ch), 51, 0.5f),
               z = random_vec(size_t(T * Ch), 52), bias = random_vec(size_t(Ch), 53, 0.5f),
               d = random_vec(size_t(Ch), 54), alog = random_vec(size_t(Ch * N), 55, 0.5f),
               B = random_vec(size_t(T * N), 56), C = random_vec(size_t(T * N), 57), s0 = random_vec(size_t(Ch * N), 58),
               dy = random_vec(size_t(T * Ch), 59), dsT = random_vec(size_t(Ch * N), 60);
    p.x = ref::to_double(x);
    p.dt = ref::to_double(dt);
    if (gated) p.z = ref::to_double(z);
    p.dt_bias = ref::to_double(bias);
    p.D = ref::to_double(d);
    p.A_log = ref::to_double(alog);
    p.B = ref::to_double(B);
    p.C = ref::to_double(C);
    Vec cot = ref::to_double(dy);
    const Vec dsd = ref::to_double(dsT);
    cot.insert(cot.end(), dsd.begin(), dsd.end());
    auto run = [&](const ref::SelectiveProblem& q, Vec state) {
      Vec y = ref::selective_scan(q, state);
      y.insert(y.end(), state.begin(), state.end());
      return y;
    };
    const Vec s0d = ref::to_double(s0);
    auto grad_of = [&](Vec ref::SelectiveProblem::*field) {
      return finite_difference(
          [&](const Vec& v) {
            ref::SelectiveProblem q = p;
            q.*field = v;
            return run(q, s0d);
          },
          p.*field, cot);
    };
    ss::SelectiveScanArgs a;
    a.x = make(x, {T, Ch});
    a.dt = make(dt, {T, Ch});
    if (gated) a.z = make(z, {T, Ch});
    a.dt_bias = make(bias, {Ch});
    a.D = make(d, {Ch});
    a.A_log = make(alog, {Ch, N});
    a.B = make(B, {T, N});
    a.C = make(C, {T, N});
    a.state = make(s0, {Ch, N});
    a.chunk = chunk;
    ss::SelectiveGrads g;
    g.dx = m_be.alloc({T, Ch}, Category::Activations, "dx");
    g.ddt = m_be.alloc({T, Ch}, Category::Activations, "ddt");
    if (gated) g.dz = m_be.alloc({T, Ch}, Category::Activations, "dz");
    g.dB = m_be.alloc({T, N}, Category::Activations, "dB");
    g.dC = m_be.alloc({T, N}, Category::Activations, "dC");
    g.d_dt_bias = m_be.alloc({Ch}, Category::Grads, "dbias");
    g.dA_log = m_be.alloc({Ch, N}, Category::Grads, "dA_log");
    g.dD = m_be.alloc({Ch}, Category::Grads, "dD");
    for (Tensor* t : {&g.d_dt_bias, &g.dA_log, &g.dD}) m_be.fill(*t, 0.0f);
    g.dstate_out = make(dsT, {Ch, N});
    g.dstate_in = m_be.alloc({Ch, N}, Category::Activations, "ds0");
    m_be.selective_scan_backward(a, make(dy, {T, Ch}), g);
    VERIFY_GRAD(read(g.dx), grad_of(&ref::SelectiveProblem::x), "selective dx");
    VERIFY_GRAD(read(g.ddt), grad_of(&ref::SelectiveProblem::dt), "selective ddt");
    if (gated) VERIFY_GRAD(read(g.dz), grad_of(&ref::SelectiveProblem::z), "selective dz");
    VERIFY_GRAD(read(g.dB), grad_of(&ref::SelectiveProblem::B), "selective dB");
    VERIFY_GRAD(read(g.dC), grad_of(&ref::SelectiveProblem::C), "selective dC");
    VERIFY_GRAD(read(g.d_dt_bias), grad_of(&ref::SelectiveProblem::dt_bias), "selective d dt_bias");
    VERIFY_GRAD(read(g.dA_log), grad_of(&ref::SelectiveProblem::A_log), "selective dA_log");
    VERIFY_GRAD(read(g.dD), grad_of(&ref::SelectiveProblem::D), "selective dD");
    VERIFY_GRAD(read(g.dstate_in), finite_difference([&](const Vec& v) { return run(p, v); }, s0d, cot),
                "selective d initial state");
  }

  // Mean cross-entropy over rows: the gradient of the logits and the loss
  // itself, one row ignored (target -1).
  void crossEntropy() {
    const int64_t R = 6, V = 50;
    const std::vector<int32_t> targets = {3, 49, 0, -1, 17, 3};
    const auto x = random_vec(size_t(R * V), 19, 3.0f);
    const double scale = 1.0 / 5;  // the mean over the 5 counted rows
    auto loss_of = [&](const Vec& l) {
      double total = 0;
      for (int64_t r = 0; r < R; ++r) {
        if (targets[size_t(r)] < 0) continue;
        double mx = -INFINITY, s = 0;
        for (int64_t c = 0; c < V; ++c) mx = std::max(mx, l[size_t(r * V + c)]);
        for (int64_t c = 0; c < V; ++c) s += std::exp(l[size_t(r * V + c)] - mx);
        total += mx + std::log(s) - l[size_t(r * V + targets[size_t(r)])];
      }
      return Vec{total * scale};
    };
    const Vec want = finite_difference(loss_of, ref::to_double(x), Vec{1.0});
    Tensor logits = make(x, {R, V});
    Tensor loss = m_be.alloc({R}, Category::Activations, "loss");
    m_be.cross_entropy(logits, loss, targets, float(scale));
    VERIFY_GRAD(read(logits), want, "cross-entropy dlogits");
    const auto per_row = read(loss);
    const double got = std::accumulate(per_row.begin(), per_row.end(), 0.0) * scale;
    const double want_loss = loss_of(ref::to_double(x))[0];
    QVERIFY2(std::abs(got - want_loss) <= kTol * want_loss, qPrintable(QString("loss %1 vs %2").arg(got).arg(want_loss)));
    QCOMPARE(per_row[3], 0.0f);
  }

  void sumSquares() {
    const auto x = random_vec(100003, 20);
    double want = 0;
    for (float v : x) want += double(v) * v;
    Tensor out = m_be.alloc({1}, Category::Workspace, "ss");
    m_be.fill(out, 1.0f);
    m_be.sum_squares(out, make(x, {int64_t(x.size())}));
    QVERIFY(std::abs(read(out)[0] - (want + 1)) <= kTol * want);
    // Non-finite values are counted one by one (a sum of squares would overflow on large finite ones).
    std::vector<float> y(5000, 1e30f);
    y[7] = INFINITY;
    y[4999] = -INFINITY;
    y[123] = std::nanf("");
    Tensor count = m_be.alloc({1}, Category::Workspace, "count");
    m_be.fill(count, 0.0f);
    m_be.count_nonfinite(count, make(y, {int64_t(y.size())}));
    QCOMPARE(read(count)[0], 3.0f);
  }

  // Three AdamW steps against float64, for an fp32 parameter (updated in
  // place) and a bf16 one with fp32 master weights.
  void adamwSteps() {
    const int64_t n = 10007;
    const auto p0 = random_vec(size_t(n), 21);
    std::vector<std::vector<float>> grads = {random_vec(size_t(n), 22), random_vec(size_t(n), 23),
                                             random_vec(size_t(n), 24)};
    ss::AdamWArgs a;
    a.lr = 1e-2f;
    a.beta1 = 0.9f;
    a.beta2 = 0.95f;
    a.eps = 1e-8f;
    a.weight_decay = 0.1f;
    a.grad_scale = 0.5f;
    Vec p(p0.begin(), p0.end()), m(size_t(n), 0.0), v(size_t(n), 0.0);
    for (int s = 1; s <= 3; ++s)
      for (int64_t i = 0; i < n; ++i) {
        const double g = double(grads[size_t(s - 1)][size_t(i)]) * a.grad_scale;
        m[size_t(i)] = a.beta1 * m[size_t(i)] + (1 - a.beta1) * g;
        v[size_t(i)] = a.beta2 * v[size_t(i)] + (1 - a.beta2) * g * g;
        const double mh = m[size_t(i)] / (1 - std::pow(double(a.beta1), s));
        const double vh = v[size_t(i)] / (1 - std::pow(double(a.beta2), s));
        p[size_t(i)] -= a.lr * (mh / (std::sqrt(vh) + a.eps) + a.weight_decay * p[size_t(i)]);
      }
    Tensor param = make(p0, {n});
    Tensor tm = m_be.alloc({n}, Category::OptimizerState, "m"), tv = m_be.alloc({n}, Category::OptimizerState, "v");
    m_be.fill(tm, 0.0f);
    m_be.fill(tv, 0.0f);
    for (int s = 1; s <= 3; ++s) {
      a.step = s;
      m_be.adamw(param, Tensor{}, make(grads[size_t(s - 1)], {n}), tm, tv, a);
    }
    VERIFY_GRAD(read(param), p, "adamw fp32 parameter");
    VERIFY_GRAD(read(tm), m, "adamw first moment");
    VERIFY_GRAD(read(tv), v, "adamw second moment");

    // bf16 parameter, fp32 master: the master follows float64; the parameter is its rounding.
    Tensor p16 = m_be.alloc({n}, Category::Weights, "p16", ss::DType::BF16);
    m_be.upload(p16, p0.data(), ss::DType::F32);
    Tensor master = make(p0, {n});
    m_be.fill(tm, 0.0f);
    m_be.fill(tv, 0.0f);
    for (int s = 1; s <= 3; ++s) {
      a.step = s;
      m_be.adamw(p16, master, make(grads[size_t(s - 1)], {n}), tm, tv, a);
    }
    VERIFY_GRAD(read(master), p, "adamw master weights");
    const auto rounded = read(p16), mw = read(master);
    for (int64_t i = 0; i < n; ++i)
      QCOMPARE(ss::bf16_to_f32(ss::f32_to_bf16(mw[size_t(i)])), rounded[size_t(i)]);
  }
};

QTEST_APPLESS_MAIN(TestBackward)
#include "tst_backward.moc"
