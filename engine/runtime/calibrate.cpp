#include "runtime/calibrate.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "core/allocator.h"
#include "core/error.h"
#include "cpu/cpu_backend.h"
#include "cpu/kernels.h"
#include "protocol/events.h"
#include "runtime/calibrate_common.h"
#include "runtime/process.h"
#include "runtime/run.h"
#include "sim/cost_model.h"

namespace ss {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

// Called before every timed call (calibrate_rank.cpp: a rank that only loads
// the host stops here once the measuring rank is done).
std::function<void()> g_before_each;

// With more ranks than cores the scheduler shares each core between ranks
// in slices of milliseconds: a kernel's wall time then holds the waits of the
// slices it spans, and a kernel shorter than a slice mostly none, so wall
// times of short and long kernels are not comparable. There every kernel
// figure is taken on the rank's thread CPU clock instead (one thread per rank:
// the time the kernel ran, beside the rank that shares the memory with it),
// and the profile's core_share (calibrate_rank.cpp) says what part of a core
// a rank gets; the simulator divides kernel times by it.
bool g_cpu_clock = false;

double g_clock_cost = 0;  // of reading the CPU clock (a system call), taken off each interval

double clock_seconds() {
  return g_cpu_clock ? thread_cpu_seconds() : std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// The seconds since `t0` (a clock_seconds()), less the clock's own cost.
double clock_since(double t0) {
  return std::max(0.0, clock_seconds() - t0 - g_clock_cost);
}

template <class F>
double best_seconds(int reps, F&& f) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    if (g_before_each) g_before_each();
    const double t0 = clock_seconds();
    f();
    best = std::min(best, clock_since(t0));
  }
  return best;
}

// The median duration of the last span each call of `f` records: what a run
// on the cpu backend records for that kernel (on the CPU clock: the call's
// thread CPU time). Each call after `before` (untimed); at least `min_reps`
// calls, more while under `budget_s` seconds in all (at most 200). Where
// every rank times the same calls at once (a budget of 0, so the same count
// on each), `each_call` makes each call's time one over the ranks (called on
// every call, so every rank makes the same collective calls).
using EachCall = std::function<double(double)>;
template <class F, class B>
double median_span(Recorder& rec, int min_reps, double budget_s, F&& f, B&& before,
                   const EachCall& each_call = nullptr) {
  std::vector<double> d;
  rec.clear();
  const auto start = Clock::now();
  for (int i = 0; i < 200; ++i) {
    if (i >= min_reps && std::chrono::duration<double>(Clock::now() - start).count() > budget_s) break;
    if (g_before_each) g_before_each();
    before();
    const double t0 = clock_seconds();
    f();
    const double cpu = clock_since(t0);
    const auto spans = rec.take_spans();
    const double t = g_cpu_clock ? cpu : spans.empty() ? 0.0 : double(spans.back().t1 - spans.back().t0) * 1e-9;
    if (each_call) d.push_back(each_call(t));
    else if (!spans.empty()) d.push_back(t);
  }
  return median(d);
}
template <class F>
double median_span(Recorder& rec, int min_reps, double budget_s, F&& f) {
  return median_span(rec, min_reps, budget_s, std::forward<F>(f), [] {});
}

// " [12.3 s]\n": the time since `t0`, for the progress lines.
std::string since(Clock::time_point t0) {
  char b[32];
  std::snprintf(b, sizeof b, " [%.1f s]\n", std::chrono::duration<double>(Clock::now() - t0).count());
  return b;
}

// A measured table with its source and what it holds.
json with_source(json table, const std::string& source, const char* note) {
  table["source"] = source;
  table["note"] = note;
  return table;
}

constexpr int kHeadDim = 64;  // of rope and attention_merge in the kernel grids

// The grid of GEMM weight shapes [N, K] and row counts M every profile gets.
constexpr std::array<int64_t, 4> kGridN = {256, 1024, 4096, 16384};
constexpr std::array<int64_t, 3> kGridK = {256, 1024, 4096};
constexpr std::array<int64_t, 3> kGridM = {1, 2, 256};
bool in_grid(int64_t N, int64_t K) {
  return std::count(kGridN.begin(), kGridN.end(), N) && std::count(kGridK.begin(), kGridK.end(), K) &&
         N * K <= (int64_t(16) << 20);
}

// Elementwise kernels: the median span per (rows, cols) of the grid.
json kernel_times(CpuBackend& be, Recorder& rec, CacheSweep& sweep) {
  const std::vector<int64_t> rows = {1, 8, 64, 512}, cols = {64, 256, 1024, 4096};
  std::mt19937 rng(1);
  json out;
  Tensor table_pool = be.alloc({std::max<int64_t>(int64_t(64) << 20, 2 * l3_bytes()) / 4}, Category::Workspace, "table");
  be.fill(table_pool, 0.5f);
  using Op = std::function<void()>;
  // Sets up the tensors of one op at rows x cols and returns the call to time.
  auto make = [&](const std::string& op, int64_t r, int64_t c) -> Op {
    auto t = [&](int64_t rr, int64_t cc, const char* label) {
      Tensor x = be.alloc({rr, cc}, Category::Workspace, label);
      be.fill(x, 0.5f);
      return x;
    };
    if (op == "add") {
      Tensor y = t(r, c, "y"), a = t(r, c, "a"), b = t(r, c, "b");
      return [&be, y, a, b] { be.add(y, a, b); };
    }
    if (op == "silu_mul") {
      Tensor y = t(r, c, "y"), g = t(r, c, "g"), u = t(r, c, "u");
      return [&be, y, g, u] { be.silu_mul(y, g, u); };
    }
    if (op == "copy") {
      Tensor y = t(r, c, "y"), x = t(r, c, "x");
      return [&be, y, x] { be.copy(y, x); };
    }
    if (op == "rmsnorm") {
      Tensor y = t(r, c, "y"), x = t(r, c, "x"), w = t(1, c, "w").reshape({c});
      return [&be, y, x, w, c] { be.rmsnorm(y, x, w, 1e-5f, c); };
    }
    if (op == "gated_rmsnorm") {
      Tensor y = t(r, c, "y"), x = t(r, c, "x"), z = t(r, c, "z"), w = t(1, c, "w").reshape({c});
      return [&be, y, x, z, w, c] { be.gated_rmsnorm(y, x, z, w, 1e-5f, c); };
    }
    if (op == "rope") {
      Tensor x = t(r, c, "x");
      auto pos = std::make_shared<std::vector<int32_t>>(size_t(r));
      for (int64_t i = 0; i < r; ++i) (*pos)[size_t(i)] = int32_t(1000 + i);
      auto freqs = std::make_shared<std::vector<double>>(size_t(kHeadDim / 2));
      for (int i = 0; i < kHeadDim / 2; ++i) (*freqs)[size_t(i)] = std::pow(10000.0, -2.0 * i / kHeadDim);
      return [&be, x, pos, freqs, c] { be.rope(x, int(c / kHeadDim), kHeadDim, *pos, *freqs); };
    }
    if (op == "attention_merge") {
      const int heads = int(c / kHeadDim);
      Tensor o = t(r, c, "o"), o2 = t(r, c, "o2"), l = t(r, heads, "lse"), l2 = t(r, heads, "lse2");
      return [&be, o, o2, l, l2, heads] { be.attention_merge(o, l, o2, l2, heads, kHeadDim); };
    }
    if (op == "embedding") {
      // A table larger than the cache, rows picked at random (as tokens are).
      const int64_t vocab = table_pool.numel() / c;
      Tensor y = t(r, c, "y"), table = table_pool.slice(0, 0, vocab * c).reshape({vocab, c});
      auto tok = std::make_shared<std::vector<int32_t>>(size_t(r));
      return [&be, y, table, tok, vocab, &rng] {
        for (auto& v : *tok) v = int32_t(rng() % uint32_t(vocab));
        be.embedding(y, table, *tok);
      };
    }
    throw std::logic_error("calibrate: no setup for " + op);
  };
  const std::vector<std::string> ops = {"add", "silu_mul", "copy", "rmsnorm", "gated_rmsnorm",
                                        "rope", "attention_merge", "embedding"};
  for (const auto& op : ops) {
    json us = json::array();
    for (int64_t r : rows) {
      json row = json::array();
      for (int64_t c : cols) {
        Op f = make(op, r, c);
        row.push_back(round_us(std::max(median_span(rec, 5, 0.02, f, sweep), 1e-8)));
      }
      us.push_back(row);
    }
    out[op] = {{"rows", rows}, {"cols", cols}, {"us", us}};
  }
  // argmax: one row.
  {
    const std::vector<int64_t> acols = {1024, 8192, 65536};
    json row = json::array();
    for (int64_t c : acols) {
      Tensor x = be.alloc({1, c}, Category::Workspace, "logits");
      be.fill(x, 0.5f);
      row.push_back(round_us(std::max(median_span(rec, 5, 0.02, [&] { be.argmax_row(x, 0); }, sweep), 1e-8)));
    }
    out["argmax"] = {{"rows", {1}}, {"cols", acols}, {"us", json::array({row})}};
  }
  return out;
}

// One-row and few-row GEMMs by weight shape. Each call reads its weights from
// a different place of a pool twice the last-level cache, so they come from
// memory as a decode step's do (a model's weights exceed the caches).
json gemm_times(CpuBackend& be, Recorder& rec, const std::map<std::pair<int64_t, int64_t>, std::set<int64_t>>& shapes,
                const std::function<void()>& before_each, const EachCall& each_call = nullptr) {
  int64_t largest = 0;
  for (auto& [nk, ms] : shapes) largest = std::max(largest, nk.first * nk.second);
  const int64_t pool_elems =
      std::max(std::clamp<int64_t>(2 * l3_bytes(), int64_t(64) << 20, int64_t(512) << 20) / 4, largest);
  Tensor pool = be.alloc({pool_elems}, Category::Workspace, "weight pool");
  be.fill(pool, 0.01f);
  int64_t next = 0;
  json out = json::array();
  for (auto& [nk, ms] : shapes) {
    const int64_t N = nk.first, K = nk.second;  // (plain names: lambdas capture them)
    const int64_t per = N * K;
    const int64_t slots = pool_elems / per;
    Tensor w_all = pool.slice(0, 0, slots * per).reshape({slots * N, K});
    json m_list = json::array(), us = json::array();
    for (int64_t M : ms) {
      Tensor x = be.alloc({M, K}, Category::Workspace, "x"), y = be.alloc({M, N}, Category::Workspace, "y");
      be.fill(x, 0.1f);
      const int reps = M <= 2 ? 15 : 3;
      const double t = median_span(
          rec, reps, 0.0,
          [&] {
            const Tensor w = w_all.slice(0, (next++ % slots) * N, N);
            be.matmul(y, x, w);
          },
          before_each, each_call);
      m_list.push_back(M);
      us.push_back(round_us(std::max(t, 1e-8)));
    }
    out.push_back({{"n", N}, {"k", K}, {"m", m_list}, {"us", us}});
  }
  return out;
}

// Attention spans on a grid of (queries, keys): queries at the last Tq of Tk
// key positions (every key visible to every query when Tq > Tk).
json attention_times(CpuBackend& be, Recorder& rec, CacheSweep& sweep) {
  const int H = 8, KV = 2, hd = 64;
  const std::vector<int64_t> tq = {1, 16, 128, 512}, tk = {128, 512, 2048};
  json us = json::array();
  const int64_t pool_elems = std::max<int64_t>(int64_t(64) << 20, 2 * l3_bytes()) / 4;
  Tensor pool = be.alloc({pool_elems}, Category::Workspace, "kv pool");
  be.fill(pool, 0.01f);
  for (int64_t q_n : tq) {
    json row = json::array();
    for (int64_t k_n : tk) {
      // Keys and values come from memory, as a decode step's KV cache does:
      // each call reads another copy of them from a pool twice the last-level cache.
      Tensor q = be.alloc({q_n, H * hd}, Category::Workspace, "q"), o = be.alloc({q_n, H * hd}, Category::Workspace, "o");
      const int64_t copies = pool_elems / (2 * k_n * KV * hd);
      const Tensor kv = pool.slice(0, 0, copies * 2 * k_n * KV * hd).reshape({copies * 2 * k_n, KV * hd});
      be.fill(q, 0.01f);
      int64_t next = 0;
      std::vector<int32_t> qp(static_cast<size_t>(q_n)), kp(static_cast<size_t>(k_n));
      for (int64_t i = 0; i < k_n; ++i) kp[size_t(i)] = int32_t(i);
      for (int64_t i = 0; i < q_n; ++i) qp[size_t(i)] = int32_t(q_n <= k_n ? k_n - q_n + i : k_n - 1 + i);
      AttentionArgs a;
      a.n_heads = H;
      a.n_kv_heads = KV;
      a.head_dim = hd;
      a.scale = 0.125f;
      a.q_pos = qp;
      a.k_pos = kp;
      const double t = median_span(
          rec, 3, 0.05,
          [&] {
            const int64_t c = next++ % copies;
            be.attention(o, q, kv.slice(0, 2 * c * k_n, k_n), kv.slice(0, (2 * c + 1) * k_n, k_n), a);
          },
          sweep);
      row.push_back(round_us(std::max(t, 1e-8)));
    }
    us.push_back(row);
  }
  return {{"heads", H}, {"kv_heads", KV}, {"head_dim", hd}, {"tq", tq}, {"tk", tk}, {"us", us}};
}

// Each grid is measured in passes (CalibrateOptions::passes, 3), one after
// another, and each entry keeps the median of its passes. On a shared host,
// load from elsewhere comes in bursts of seconds: in one of three
// calibrations minutes apart the attention grid came out 48% slower and the
// one-row GEMMs 20% slower, and a run simulated on it 30% slower, where with
// passes a burst moves one pass.
void log_gemm_times(const json& shapes, int passes, std::ostream& log) {
  log << "  gemm times: " << shapes.size() << " weight shapes, median of " << passes << " pass(es), e.g.";
  for (auto& s : shapes)
    if (s["n"] == 1024 && s["k"] == 1024)
      log << " 1x1024x1024 " << s["us"][0].get<double>() << " us, 256x1024x1024 " << s["us"].back().get<double>()
          << " us";
  log << "\n";
}

}  // namespace

int64_t l3_bytes() {
  long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (v > 0) return v;
  std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index3/size");
  std::string s;
  if (f >> s && !s.empty()) {
    const int64_t n = std::atoll(s.c_str());
    return s.back() == 'M' ? n << 20 : s.back() == 'K' ? n << 10 : n;
  }
  return int64_t(32) << 20;
}

void set_calibration_hook(std::function<void()> before_each) { g_before_each = std::move(before_each); }

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

std::string calibration_source(int threads) {
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  return "measured by shardscope-engine calibrate on " + host_name() + ", " + date + ", " + std::to_string(threads) +
         " thread(s) per rank";
}

std::map<std::pair<int64_t, int64_t>, std::set<int64_t>> gemm_shape_set(const CalibrateOptions& options) {
  std::map<std::pair<int64_t, int64_t>, std::set<int64_t>> shapes;
  for (int64_t N : kGridN)
    for (int64_t K : kGridK)
      if (in_grid(N, K)) shapes[{N, K}] = {kGridM.begin(), kGridM.end()};
  for (auto& [M, N, K] : options.gemm_shapes) {
    if (M <= 0 || N <= 0 || K <= 0) continue;
    auto& ms = shapes[{N, K}];
    ms.insert({1, 2, M});
  }
  return shapes;
}

nlohmann::json gemm_table(const nlohmann::json& shapes, const std::string& source, bool in_step, int passes) {
  return {{"source", source},
          {"note", std::string("median span of y[m,n] = x[m,k] w[n,k]^T with w read from a pool twice the last-level "
                               "cache (weights not in any cache, as in decode)") +
                       (in_step ? "; every rank called the same GEMM at once (a barrier before each call), as the "
                                  "ranks of a tensor-parallel step do, and each call's time is the slowest rank's (a "
                                  "step waits for it at its next collective; with more ranks than cores the mean "
                                  "over the ranks, the core share holding that wait)"
                                : "") +
                       "; the median of " + std::to_string(passes) + " pass(es)"},
          {"shapes", shapes}};
}

namespace {
// The threads a run gives each of `ranks` ranks (run.cpp): all cores for one
// rank, one thread per rank when several share the host.
int threads_per_rank(int ranks) {
  return ranks > 1 ? 1 : int(std::max(1u, std::thread::hardware_concurrency()));
}
}  // namespace

nlohmann::json measure_gemm_times(std::ostream& log, int ranks, const CalibrateOptions& options,
                                  const std::function<void()>& before_each,
                                  const std::function<double(double)>& each_call) {
  cpu::set_threads(threads_per_rank(ranks));
  g_cpu_clock = ranks > int(std::max(1u, std::thread::hardware_concurrency()));
  const auto started = Clock::now();
  Allocator alloc;
  Recorder rec;
  rec.set_mem_sampling(false);
  CpuBackend be(alloc, rec);
  const auto shape_set = gemm_shape_set(options);
  std::vector<json> passes;
  for (int pass = 0; pass < options.passes(); ++pass)
    passes.push_back(gemm_times(be, rec, shape_set, before_each, each_call));
  json shapes = median_of_passes(passes);
  log_gemm_times(shapes, options.passes(), log);
  log << "  (gemm times, every rank at once)" << since(started);
  return shapes;
}

nlohmann::json measure_device(std::ostream& log, int ranks, const CalibrateOptions& options) {
  // Per-rank figures, with the threads a run gives each rank: all cores for
  // one rank, one thread per rank when several share the host (run.cpp).
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = threads_per_rank(ranks);
  cpu::set_threads(threads);
  g_cpu_clock = ranks > cores;
  if (g_cpu_clock) {
    std::vector<double> d(101);
    for (double& v : d) {
      const double t0 = clock_seconds();
      v = clock_seconds() - t0;
    }
    g_clock_cost = median(d);
  }
  const auto started = Clock::now();
  Allocator alloc;
  Recorder rec;
  rec.set_mem_sampling(false);
  CpuBackend be(alloc, rec);

  // GEMM rate: the best of a few shapes the models use.
  double gemm = 0;
  for (const auto& mnk : {std::array<int, 3>{512, 1024, 1024}, {1024, 2816, 1024}, {1024, 1024, 2816}}) {
    const int M = mnk[0], N = mnk[1], K = mnk[2];
    std::vector<float> a(size_t(M) * K, 0.01f), b(size_t(N) * K, 0.02f), c(size_t(M) * N);
    const double s = best_seconds(3, [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, c.data(), N);
    });
    const double rate = 2.0 * M * N * K / s;
    log << "  gemm " << M << "x" << N << "x" << K << ": " << rate * 1e-9 << " GFLOP/s\n";
    gemm = std::max(gemm, rate);
  }
  // Memory bandwidth: a large copy (read + write), between blocks of the
  // backend's own, in huge pages as a run's large tensors are
  // (cpu/host_blocks.h). Two vectors of 256 MiB took 131072 first-touch
  // faults of 4 KiB per rank before the copy was timed at all, where a fault
  // costs 10 to 30 us (a virtual machine's): `calibrate --quick --ranks 2`
  // took 9.3 to 9.8 s here that way, 8.6 to 9.3 s this way.
  const int64_t n = int64_t(64) << 20;  // 256 MiB of floats
  double bw = 0;
  {
    Tensor src = be.alloc({n}, Category::Workspace, "copy src"), dst = be.alloc({n}, Category::Workspace, "copy dst");
    be.fill(src, 1.0f);
    be.fill(dst, 0.0f);
    const float* s = src.data<float>();
    float* d = dst.data<float>();
    const double copy_s = best_seconds(3, [&] { std::copy(s, s + n, d); });
    bw = 2.0 * double(n) * 4 / copy_s;
  }
  log << "  memory copy: " << bw * 1e-9 << " GB/s" << since(started);
  // Vector rate, from the selective scan (the cost model charges it a quarter of it).
  const int64_t T = 256, C = 512, S = 16;
  Tensor x = be.alloc({T, C}, Category::Workspace, "x"), y = be.alloc({T, C}, Category::Workspace, "y");
  Tensor dt = be.alloc({T, C}, Category::Workspace, "dt"), Bm = be.alloc({T, S}, Category::Workspace, "B");
  Tensor Cm = be.alloc({T, S}, Category::Workspace, "C"), A = be.alloc({C, S}, Category::Workspace, "A");
  Tensor bias = be.alloc({C}, Category::Workspace, "bias"), D = be.alloc({C}, Category::Workspace, "D");
  for (Tensor* t : {&x, &dt, &Bm, &Cm, &A, &bias, &D}) be.fill(*t, 0.1f);
  SelectiveScanArgs sa;
  sa.y = y;
  sa.x = x;
  sa.dt = dt;
  sa.B = Bm;
  sa.C = Cm;
  sa.A_log = A;
  sa.dt_bias = bias;
  sa.D = D;
  const double scan_s = best_seconds(3, [&] { be.selective_scan(sa); });
  const double vector = 7.0 * T * C * S / scan_s / 0.25;
  log << "  vector (from the selective scan): " << vector * 1e-9 << " GFLOP/s\n";
  // Attention and elementwise kernels, as fractions of the GEMM rate and of the
  // copy bandwidth: the roofline's figures, used where no measured time applies.
  double attention_eff = 0.5, scan_eff = 0.5, elementwise_eff = 1.0, gemv_eff = 1.0;
  {
    const int64_t Tq = 512, H = 8, hd = 64;
    Tensor q = be.alloc({Tq, H * hd}, Category::Workspace, "q"), k = be.alloc({Tq, H * hd}, Category::Workspace, "k");
    Tensor v = be.alloc({Tq, H * hd}, Category::Workspace, "v"), o = be.alloc({Tq, H * hd}, Category::Workspace, "o");
    for (Tensor* t : {&q, &k, &v}) be.fill(*t, 0.01f);
    std::vector<int32_t> pos(static_cast<size_t>(Tq));
    for (int64_t i = 0; i < Tq; ++i) pos[size_t(i)] = int32_t(i);
    AttentionArgs aa;
    aa.n_heads = aa.n_kv_heads = int(H);
    aa.head_dim = int(hd);
    aa.scale = 0.125f;
    aa.q_pos = aa.k_pos = pos;
    const double att_s = best_seconds(3, [&] { be.attention(o, q, k, v, aa); });
    const double att_flops = double(Tq) * double(Tq + 1) / 2 * double(H) * 4.0 * double(hd);
    attention_eff = std::clamp(att_flops / att_s / gemm, 0.01, 1.0);
    // Elementwise: a memory-bound add over buffers larger than the caches.
    Tensor g = be.alloc({4096, 2048}, Category::Workspace, "g"), u = be.alloc({4096, 2048}, Category::Workspace, "u");
    be.fill(g, 0.1f);
    be.fill(u, 0.1f);
    const double ew_s = best_seconds(5, [&] { be.add(g, g, u); });
    elementwise_eff = std::clamp(3.0 * double(g.nbytes()) / ew_s / bw, 0.01, 1.0);
    // Decode GEMMs (one row): weights stream from memory once per call, so
    // cycle through more weight matrices than the caches hold.
    constexpr int kMats = 8;
    Tensor xr = be.alloc({1, 1024}, Category::Workspace, "x1"), yr = be.alloc({1, 2816}, Category::Workspace, "y1");
    std::vector<Tensor> ws;
    for (int i = 0; i < kMats; ++i) {
      ws.push_back(be.alloc({2816, 1024}, Category::Workspace, "w"));
      be.fill(ws.back(), 0.01f);
    }
    be.fill(xr, 0.1f);
    const double gemv_s = best_seconds(3, [&] {
      for (auto& w : ws) be.matmul(yr, xr, w);
    });
    gemv_eff = std::clamp(double(kMats) * double(ws[0].nbytes()) / gemv_s / bw, 0.01, 1.0);
    log << "  attention: " << 100 * attention_eff << "% of the GEMM rate; elementwise: " << 100 * elementwise_eff
        << "%, one-row GEMM: " << 100 * gemv_eff << "% of the copy bandwidth\n";
  }
  // Per-kernel overhead: a tiny op through the backend, span recording
  // included, timed 50 at a time. One at a time, on the thread CPU clock
  // (more ranks than cores) less the clock's own cost, the best of 200
  // came to 0 under load, which no profile may say.
  Tensor t1 = be.alloc({1, 8}, Category::Workspace, "tiny");
  constexpr int kBatch = 50;
  const double launch = std::max(1e-9, best_seconds(20, [&] {
                                         for (int i = 0; i < kBatch; ++i) be.add(t1, t1, t1);
                                       }) / kBatch);
  log << "  per-kernel overhead: " << launch * 1e6 << " us" << since(started);
  rec.clear();

  // Measured kernel times: the spans the cpu backend records, by size.
  json kernels, attention, gemms;
  {
    CacheSweep sweep;
    const auto shape_set = gemm_shape_set(options);
    std::vector<json> k, a, g;
    for (int pass = 0; pass < options.passes(); ++pass) {
      k.push_back(kernel_times(be, rec, sweep));
      a.push_back(attention_times(be, rec, sweep));
      if (!options.gemms_in_step) g.push_back(gemm_times(be, rec, shape_set, [] {}));
      rec.clear();
    }
    kernels = median_of_passes(k);
    attention = median_of_passes(a);
    if (!g.empty()) gemms = median_of_passes(g);
  }
  for (auto& [op, t] : kernels.items())
    log << "  " << op << ": " << t["us"][0][0].get<double>() << " us at 1x" << t["cols"][0].get<int64_t>() << ", "
        << t["us"].back().back().get<double>() << " us at " << t["rows"].back().get<int64_t>() << "x"
        << t["cols"].back().get<int64_t>() << "\n";
  log << "  attention: " << attention["us"][0][1].get<double>() << " us at 1 query x 512 keys, "
      << attention["us"].back()[1].get<double>() << " us at 512 x 512 (causal)\n";
  if (!gemms.is_null()) log_gemm_times(gemms, options.passes(), log);
  log << "  (kernel, attention" << (gemms.is_null() ? "" : " and gemm") << " grids, " << options.passes() << " pass(es))"
      << since(started);

  std::ifstream mi("/proc/meminfo");
  std::string key;
  int64_t mem_kb = 0;
  while (mi >> key >> mem_kb)
    if (key == "MemTotal:") break;
  const std::string src_note =
      calibration_source(threads) +
      (g_cpu_clock ? ", " + std::to_string(ranks) + " ranks on " + std::to_string(cores) +
                         " cores: kernel times on the rank's thread CPU clock (see core_share)"
                   : std::string());
  json device = {{"name", be.device_name() + ", " + std::to_string(threads) + " thread(s)"},
          {"memory_bytes", mem_kb * 1024 / std::max(1, ranks)},
          {"fp32_tflops", vector * 1e-12},
          {"matmul_tflops", gemm * 1e-12},
          {"memory_bandwidth_gbps", bw * 1e-9},
          {"kernel_launch_us", launch * 1e6},
          {"attention_efficiency", attention_eff},
          {"scan_efficiency", scan_eff},
          {"elementwise_efficiency", elementwise_eff},
          {"gemv_efficiency", gemv_eff},
          {"kernel_times", with_source(kernels, src_note,
                                       "median span of each kernel through the cpu backend at rows x cols (rope and "
                                       "attention_merge: heads of 64); rows and cols are the span's dims (argmax: "
                                       "one row of cols)")},
          {"attention_times", with_source(attention, src_note,
                                          "median attention span, tq queries at the last tq of tk key positions (all "
                                          "keys visible when tq > tk); other head counts and masks scale by FLOPs")},
          {"sources", {{"all", src_note}}}};
  if (!options.gemms_in_step) device["gemm_times"] = gemm_table(gemms, src_note, false, options.passes());
  return device;
}

namespace {

// The core share of each measured step (calibrate_rank.cpp): the GEMM's CPU
// time over the step's wall time less what the simulator charges for the
// step's all-reduce (its cost model, from the times measured above), so that
// a simulated run of the same steps takes their measured time.
json core_share_of(const json& steps, int ranks, int cores, const LinkProfile& link, std::ostream& log) {
  const double bytes = steps.value("sync_bytes", 0.0);
  const double reduce_us = 1e6 * collective_seconds(link, "all_reduce", bytes, ranks).seconds;
  json kernel_us = json::array(), share = json::array();
  std::string text;
  for (const auto& s : steps["steps"]) {
    const double k = s.value("kernel_us", 0.0), step = s.value("step_us", 0.0);
    const double v = std::clamp(k / std::max(step - reduce_us, k), 0.01, 1.0);
    if (!kernel_us.empty() && !(k > kernel_us.back().get<double>())) continue;  // the grid must increase
    kernel_us.push_back(k);
    share.push_back(v);
    char b[96];
    std::snprintf(b, sizeof b, "%s%.1f%% at %.2f ms", text.empty() ? "" : ", ", 100 * v, 1e-3 * k);
    text += b;
  }
  char line[160];
  std::snprintf(line, sizeof line, "  core share: %d ranks on %d cores (a fair share is %.1f%%): ", ranks, cores,
                100.0 * cores / ranks);
  log << line << text << "\n";
  return {{"kernel_us", kernel_us},
          {"share", share},
          {"source", calibration_source(1) + ", " + std::to_string(ranks) + " ranks on " + std::to_string(cores) +
                         " cores"},
          {"note", "every rank runs a GEMM of 4, 32 or 256 rows x 1024 x 1024, then a " +
                       std::to_string(int64_t(bytes)) +
                       " B all-reduce, repeatedly (median of " + std::to_string(steps.value("trials", 5)) +
                       " trials, means over ranks): the GEMM's thread CPU "
                       "time over the step's wall time less the fitted all_reduce time of that size; this "
                       "profile's kernel times are CPU times: the simulator charges a stretch of kernels between "
                       "two waits for a collective its CPU time over the share at that length"}};
}

// The overlap steps (calibrate_rank.cpp, measure_steps), one measurement per
// collective: per GEMM length its share of a core beside a collective in
// flight (CPU over wall time, the mean of the measurements), and per
// collective how much longer the wait after it lasted than the simulator
// charges for that collective alone (its cost model, from the times above).
json overlap_steps_of(const json& raw, int ranks, int cores, const LinkProfile& link, std::ostream& log) {
  std::vector<double> cpu, wall;
  json wait_us = json::object();
  std::string text;
  for (const auto& [op, steps] : raw.items()) {
    const double bytes = steps.value("sync_bytes", 0.0);
    const double alone_us = 1e6 * collective_seconds(link, op.c_str(), bytes, ranks).seconds;
    json waits = json::array();
    size_t i = 0;
    for (const auto& s : steps["steps"]) {
      if (cpu.size() <= i) cpu.push_back(0), wall.push_back(0);
      cpu[i] += s.value("kernel_us", 0.0) / double(raw.size());
      wall[i] += s.value("kernel_wall_us", 0.0) / double(raw.size());
      waits.push_back(std::max(1.0, s.value("wait_us", 0.0) - alone_us));
      ++i;
    }
    wait_us[op] = waits;
    text += (text.empty() ? "" : "; ") + op;
    for (size_t k = 0; k < waits.size(); ++k) text += (k ? ", +" : " +") + std::to_string(std::lround(waits[k].get<double>()));
    text += " us past its own " + std::to_string(std::lround(alone_us)) + " us";
  }
  json kernel_us = json::array(), share = json::array();
  std::string shares;
  for (size_t i = 0; i < cpu.size(); ++i) {
    kernel_us.push_back(cpu[i]);
    share.push_back(std::clamp(cpu[i] / std::max(wall[i], cpu[i]), 0.01, 1.0));
    char b[64];
    std::snprintf(b, sizeof b, "%s%.1f%% at %.2f ms", i ? ", " : "", 100 * share.back().get<double>(), 1e-3 * cpu[i]);
    shares += b;
  }
  log << "  overlap: " << ranks << " ranks on " << cores << " cores, share of a core " << shares << "; waits " << text
      << "\n";
  return {{"kernel_us", kernel_us},
          {"share", share},
          {"wait_us", wait_us},
          {"source", calibration_source(1) + ", " + std::to_string(ranks) + " ranks on " + std::to_string(cores) +
                         " cores"},
          {"note", "every rank runs a GEMM of 4, 32 or 256 rows x 1024 x 1024 while a 1 MiB collective posted just "
                   "before it is in flight (a broadcast from the ranks in turn, or a ring sendrecv), then waits for "
                   "it, repeatedly (median of " + std::to_string(raw.begin()->value("trials", 5)) +
                   " trials, means over ranks): share, the GEMM's thread CPU time over "
                   "its wall time (mean over the collectives); wait_us, per collective, the wait less that "
                   "collective's fitted time"}};
}

// Calls f on every measured time of a profile table (its numbers with a
// fraction; shapes are integers), in order.
void for_each_time(nlohmann::json& table, const std::function<void(nlohmann::json&)>& f) {
  if (table.is_number_float()) f(table);
  else if (table.is_array() || table.is_object())
    for (auto& part : table) for_each_time(part, f);
}

}  // namespace

nlohmann::json median_of_passes(std::vector<nlohmann::json> passes) {
  if (passes.empty()) return nullptr;
  std::vector<std::vector<double>> times;  // [entry][pass]
  for (json& pass : passes) {
    size_t i = 0;
    for_each_time(pass, [&](json& t) {
      if (i == times.size()) times.emplace_back();
      times[i++].push_back(t.get<double>());
    });
  }
  json out = passes.front();
  size_t i = 0;
  for_each_time(out, [&](json& t) { t = median(times[i++]); });
  return out;
}

nlohmann::json calibrate_machine(std::ostream& log, int ranks, const CalibrateOptions& options) {
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = threads_per_rank(ranks);
  const auto started = Clock::now();
  // Several ranks: every rank measures at once, as a run's ranks compute at
  // once on this host's cores and memory (calibrate_rank.cpp).
  json device = ranks > 1 ? measure_device_on_ranks(log, ranks, options) : measure_device(log, ranks, options);
  const double bw = device.value("memory_bandwidth_gbps", 10.0) * 1e9;
  if (json gap = measure_host_gap(log, threads, options); !gap.is_null()) device["host_gap"] = std::move(gap);

  // MPI: every collective over message sizes between `ranks` ranks of this
  // host; alpha-beta per collective. The link's own figures are all_reduce's.
  double alpha = 20e-6, beta = bw / 4;
  json colls = json::object();
  LinkProfile measured;  // what the simulator will make of them
  if (ranks > 1) {
    colls = measure_collectives(log, ranks, options, measured);
    if (auto it = measured.collectives.find("all_reduce"); it != measured.collectives.end())
      alpha = it->second.latency, beta = it->second.bandwidth;
    else
      log << "  mpi: no measurement came back; the link keeps assumed figures\n";
    measured.latency = alpha;
    measured.bandwidth = beta;
    log << "  (collectives)" << since(started);
  }

  if (device.contains("core_steps")) device["core_share"] = core_share_of(device["core_steps"], ranks, cores, measured, log);
  device.erase("core_steps");
  if (device.contains("overlap_raw"))
    device["overlap_steps"] = overlap_steps_of(device["overlap_raw"], ranks, cores, measured, log);
  device.erase("overlap_raw");

  const std::string src_note = calibration_source(threads);
  json link = {{"name", "MPI shared memory"}, {"bandwidth_gbps", beta * 1e-9}, {"latency_us", alpha * 1e6},
               {"source", src_note + "; latency and bandwidth: all_reduce's"}};
  if (!colls.empty()) link["collectives"] = colls;
  json network = link;
  network["name"] = "MPI shared memory (one host)";
  return {
      {"name", "this machine (" + host_name() + "), calibrated" + (options.quick ? " quickly (--quick)" : "") + ", " +
                   std::to_string(ranks) + " ranks"},
      {"device", device},
      {"node", {{"max_devices", std::max(cores, ranks)}, {"link", link}}},
      {"network", network},
  };
}

nlohmann::json grid_only(const nlohmann::json& profile) {
  json out = profile;
  if (!out.contains("device") || !out["device"].contains("gemm_times")) return out;
  json kept = json::array();
  for (const auto& sh : out["device"]["gemm_times"]["shapes"]) {
    if (!in_grid(sh.value("n", int64_t(0)), sh.value("k", int64_t(0)))) continue;
    json g = sh, m = json::array(), us = json::array();
    for (size_t i = 0; i < sh["m"].size(); ++i)
      if (std::count(kGridM.begin(), kGridM.end(), sh["m"][i].get<int64_t>())) {
        m.push_back(sh["m"][i]);
        us.push_back(sh["us"][i]);
      }
    g["m"] = m;
    g["us"] = us;
    kept.push_back(g);
  }
  out["device"]["gemm_times"]["shapes"] = kept;
  return out;
}

int run_calibrate(const std::string& out_file, int ranks, std::ostream& log, const CalibrateOptions& options) {
  if (ranks < 1) throw UsageError("--ranks must be >= 1");
  log << "calibrating this machine for " << ranks << " rank(s) ...\n";
  write_profile(calibrate_machine(log, ranks, options), out_file, log);
  return 0;
}

void write_profile(const nlohmann::json& profile, const std::string& out_file, std::ostream& log) {
  const std::string tmp = out_file + ".tmp";
  {
    std::ofstream f(tmp);
    if (!f) throw UsageError("--out " + out_file + ": cannot create the file");
    f << profile.dump(2) << "\n";
    if (!f.flush()) throw UsageError("--out " + out_file + ": write failed");
  }
  std::filesystem::rename(tmp, out_file);
  log << "wrote " << out_file << "\n";
}

}  // namespace ss
