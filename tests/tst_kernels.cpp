// The kernels suite, part one: GEMMs, embedding, norms, RoPE, attention and the
// elementwise kernels (kernels_scan.cpp: convolution, the scans and the norm
// across ranks). What it checks and to what tolerance: kernels_suite.h.
#include "kernels_suite.h"

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
  // Query runs the simulator costs one by one against keys past 64 runs (each key counted).
  cases.push_back({range(0, 300), many});
  cases.push_back({cat(range(0, 10), range(200, 260)), shuffled});
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
#include "moc_kernels_suite.cpp"
