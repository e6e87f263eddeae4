#include "runtime/calibrate.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/allocator.h"
#include "core/error.h"
#include "cpu/cpu_backend.h"
#include "cpu/kernels.h"
#include "runtime/process.h"
#include "runtime/run.h"

namespace ss {
namespace {

using Clock = std::chrono::steady_clock;

template <class F>
double best_seconds(int reps, F&& f) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

}  // namespace

nlohmann::json calibrate_machine(std::ostream& log, int ranks) {
  // Per-rank figures: each rank of a run gets cores / ranks threads.
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = std::max(1, cores / std::max(1, ranks));
  cpu::set_threads(threads);
  Allocator alloc;
  Recorder rec;
  CpuBackend be(alloc, rec);

  // GEMM rate: the best of a few shapes the models use.
  double gemm = 0;
  for (auto [M, N, K] : {std::array<int, 3>{512, 1024, 1024}, {1024, 2816, 1024}, {1024, 1024, 2816}}) {
    std::vector<float> a(size_t(M) * K, 0.01f), b(size_t(N) * K, 0.02f), c(size_t(M) * N);
    const double s = best_seconds(3, [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, c.data(), N);
    });
    const double rate = 2.0 * M * N * K / s;
    log << "  gemm " << M << "x" << N << "x" << K << ": " << rate * 1e-9 << " GFLOP/s\n";
    gemm = std::max(gemm, rate);
  }
  // Memory bandwidth: a large copy (read + write).
  const size_t n = size_t(64) << 20;  // 256 MiB of floats
  std::vector<float> src(n, 1.0f), dst(n, 0.0f);
  const double copy_s = best_seconds(3, [&] { std::copy(src.begin(), src.end(), dst.begin()); });
  const double bw = 2.0 * double(n) * 4 / copy_s;
  log << "  memory copy: " << bw * 1e-9 << " GB/s\n";
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
  // Attention and elementwise kernels, as fractions of the GEMM rate and of the copy bandwidth.
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
  // Per-kernel overhead: a tiny op through the backend, span recording included.
  Tensor t1 = be.alloc({1, 8}, Category::Workspace, "tiny");
  const double launch = best_seconds(200, [&] { be.add(t1, t1, t1); });
  log << "  per-kernel overhead: " << launch * 1e6 << " us\n";
  rec.clear();

  // MPI: small and large all-reduce between `ranks` ranks of this host.
  double alpha = 20e-6, beta = bw / 4;
  if (ranks > 1) {
    const std::string cmd =
        mpirun_self_command(ranks, "bench-collectives-rank --json --sizes 4096,16777216 --iterations 5");
    if (std::FILE* p = popen(cmd.c_str(), "r")) {
      char buf[4096];
      std::string outp;
      while (std::fgets(buf, sizeof buf, p)) outp += buf;
      pclose(p);
      for (size_t at = 0; (at = outp.find('{', at)) != std::string::npos;) {
        const size_t end = outp.find('\n', at);
        nlohmann::json row = nlohmann::json::parse(outp.substr(at, end - at), nullptr, false);
        at = end;
        if (row.is_discarded() || row.value("path", "") != "mpi" || row.value("op", "") != "all_reduce") continue;
        const double secs = row.value("time_s", 0.0), bytes = row.value("bytes", 0.0);
        const double steps = 2.0 * (ranks - 1);
        if (bytes <= 4096) alpha = secs / steps;  // latency-bound
        else beta = row.value("busbw", beta);      // bandwidth-bound
      }
    }
    log << "  mpi all_reduce over " << ranks << " ranks: latency " << alpha * 1e6 << " us per step, bus bandwidth "
        << beta * 1e-9 << " GB/s\n";
  }

  std::ifstream mi("/proc/meminfo");
  std::string key;
  int64_t mem_kb = 0;
  while (mi >> key >> mem_kb)
    if (key == "MemTotal:") break;
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  const std::string src_note = "measured by shardscope-engine calibrate on " + host_name() + ", " + date + ", " +
                               std::to_string(threads) + " thread(s) per rank";
  return {
      {"name", "this machine (" + host_name() + "), calibrated, " + std::to_string(ranks) + " ranks"},
      {"device",
       {{"name", be.device_name() + ", " + std::to_string(threads) + " thread(s)"},
        {"memory_bytes", mem_kb * 1024 / std::max(1, ranks)},
        {"fp32_tflops", vector * 1e-12},
        {"matmul_tflops", gemm * 1e-12},
        {"memory_bandwidth_gbps", bw * 1e-9},
        {"kernel_launch_us", launch * 1e6},
        {"attention_efficiency", attention_eff},
        {"scan_efficiency", scan_eff},
        {"elementwise_efficiency", elementwise_eff},
        {"gemv_efficiency", gemv_eff},
        {"sources", {{"all", src_note}}}}},
      {"node",
       {{"max_devices", std::max(cores, ranks)},
        {"link", {{"name", "MPI shared memory"}, {"bandwidth_gbps", beta * 1e-9}, {"latency_us", alpha * 1e6},
                  {"source", src_note}}}}},
      {"network", {{"name", "MPI shared memory (one host)"}, {"bandwidth_gbps", beta * 1e-9}, {"latency_us", alpha * 1e6},
                   {"source", src_note}}},
  };
}

int run_calibrate(const std::string& out_file, int ranks, std::ostream& log) {
  if (ranks < 1) throw UsageError("--ranks must be >= 1");
  log << "calibrating this machine for " << ranks << " rank(s) ...\n";
  const nlohmann::json profile = calibrate_machine(log, ranks);
  const std::string tmp = out_file + ".tmp";
  {
    std::ofstream f(tmp);
    if (!f) throw UsageError("--out " + out_file + ": cannot create the file");
    f << profile.dump(2) << "\n";
    if (!f.flush()) throw UsageError("--out " + out_file + ": write failed");
  }
  std::filesystem::rename(tmp, out_file);
  log << "wrote " << out_file << "\n";
  return 0;
}

}  // namespace ss
