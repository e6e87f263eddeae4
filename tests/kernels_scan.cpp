// The kernels suite, part two: the causal depthwise convolution, the SSD and
// selective scans with their state passing, and the norm across ranks.
#include "kernels_suite.h"

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
