#include "runtime/bench.h"

#include <cblas.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <filesystem>
#include <thread>

#include "core/allocator.h"
#include "cpu/cpu_backend.h"
#include "cpu/kernels.h"
#include "model/model.h"
#include "runtime/process.h"
#include "runtime/run.h"

namespace ss {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Resets the kernel's peak-RSS counter (VmHWM); false where not permitted.
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  return bool(f.flush());
}

struct GemmShape {
  int64_t M, N, K;
  bool operator<(const GemmShape& o) const { return std::tie(M, N, K) < std::tie(o.M, o.N, o.K); }
};

// Times `count` bare cblas_sgemm calls per shape, as the forward issues them
// (x [M,K] times w [N,K]^T), and returns the achieved GFLOP/s.
double bare_sgemm_gflops(const std::map<GemmShape, int>& shapes) {
  double flops = 0, secs = 0;
  for (auto& [s, count] : shapes) {
    std::vector<float> a(size_t(s.M * s.K), 0.01f), b(size_t(s.N * s.K), 0.02f), c(size_t(s.M * s.N));
    auto call = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(s.M), int(s.N), int(s.K), 1.0f, a.data(), int(s.K),
                  b.data(), int(s.K), 0.0f, c.data(), int(s.N));
    };
    call();  // warm up: page in the buffers
    const auto t0 = Clock::now();
    for (int i = 0; i < count; ++i) call();
    secs += seconds_since(t0);
    flops += 2.0 * s.M * s.N * s.K * count;
  }
  return secs > 0 ? flops / secs * 1e-9 : 0;
}

struct Row {
  std::string model;
  int64_t prompt = 0;
  double prefill_tps = 0, decode_tps = 0, fwd_gflops = 0, gemm_gflops = 0, bare_gflops = 0;
  double attn_share = 0, scan_share = 0;
  int64_t weight_bytes = 0, param_bytes = 0, peak_accounted = 0, peak_rss = 0, base_rss = 0;
  bool rss_reset = false;
};

Row measure(const std::string& preset, int64_t P, int decode, int repeat) {
  Row r;
  r.model = preset;
  r.prompt = P;
  ModelConfig cfg = resolve_model(preset, nullptr);
  r.rss_reset = reset_peak_rss();
  r.base_rss = current_rss_bytes();
  Allocator alloc;
  Recorder rec;
  CpuBackend be(alloc, rec);
  Model model(cfg, be);
  SyntheticSource src(1);
  model.load(src);
  r.weight_bytes = alloc.state().bytes[int(Category::Weights)];
  r.param_bytes = model.parameter_count() * 4;
  RunOptions ro;
  ro.prompt_len = P;
  const std::vector<int32_t> prompt = make_prompt(ro, cfg.vocab);
  std::vector<int32_t> pos(static_cast<size_t>(P));
  for (int64_t i = 0; i < P; ++i) pos[size_t(i)] = int32_t(i);

  double best_prefill = 1e30, best_decode = 1e30;
  std::vector<proto::Span> best_spans;
  for (int rep = 0; rep < repeat; ++rep) {
    Cache cache = model.make_cache(P + decode);
    rec.clear();
    const auto t0 = Clock::now();
    int32_t next;
    {
      Tensor logits = model.forward(prompt, pos, cache, false);
      next = be.argmax_row(logits, 0);
    }
    const double prefill = seconds_since(t0);
    std::vector<proto::Span> spans = rec.take_spans();
    const auto t1 = Clock::now();
    for (int k = 0; k < decode; ++k) {
      const int32_t p1 = int32_t(P + k);
      Tensor logits = model.forward(std::span<const int32_t>(&next, 1), std::span<const int32_t>(&p1, 1), cache, false);
      next = be.argmax_row(logits, 0);
    }
    const double dec = seconds_since(t1);
    if (prefill < best_prefill) {
      best_prefill = prefill;
      best_spans = std::move(spans);
    }
    best_decode = std::min(best_decode, dec);
  }
  r.peak_accounted = alloc.state().peak_total;
  r.peak_rss = peak_rss_bytes();

  double flops = 0, gemm_flops = 0, gemm_ns = 0, attn_ns = 0, scan_ns = 0;
  std::map<GemmShape, int> shapes;
  for (const auto& s : best_spans) {
    flops += s.flops;
    if (s.op == "gemm") {
      gemm_flops += s.flops;
      gemm_ns += double(s.t1 - s.t0);
      ++shapes[GemmShape{s.dims[0], s.dims[1], s.dims[2]}];
    } else if (s.op == "attention") {
      attn_ns += double(s.t1 - s.t0);
    } else if (s.op == "ssd_scan" || s.op == "selective_scan") {
      scan_ns += double(s.t1 - s.t0);
    }
  }
  r.prefill_tps = P / best_prefill;
  r.decode_tps = decode / std::max(best_decode, 1e-12);
  r.fwd_gflops = flops / best_prefill * 1e-9;
  r.gemm_gflops = gemm_flops / std::max(gemm_ns, 1.0);
  r.bare_gflops = bare_sgemm_gflops(shapes);
  r.attn_share = attn_ns * 1e-9 / best_prefill;
  r.scan_share = scan_ns * 1e-9 / best_prefill;
  return r;
}

}  // namespace

int run_bench(const BenchOptions& o, std::ostream& out) {
  // Initialise OpenBLAS and the OpenMP pool before the baseline RSS is read.
  std::map<GemmShape, int> warm{{GemmShape{256, 256, 256}, 4}};
  bare_sgemm_gflops(warm);
  Allocator probe_alloc;
  Recorder probe_rec;
  CpuBackend probe_be(probe_alloc, probe_rec);
  char line[512];
  out << "shardscope-engine bench  host " << host_name() << "  cpu " << probe_be.device_name() << "  threads "
      << cpu::threads() << "  " << openblas_get_config() << "\n";
  out << "Forward vs bare cblas_sgemm of the same shapes, measured in this run (best of " << o.repeat << ").\n\n";
  std::snprintf(line, sizeof line, "%-14s %6s %11s %10s %9s %9s %9s %8s %8s %7s %7s\n", "model", "prompt",
                "prefill/s", "decode/s", "fwd GF/s", "gemm GF/s", "bare GF/s", "gemm/bare", "pfill/bare", "attn%",
                "scan%");
  out << line;
  std::vector<Row> rows;
  for (const auto& m : o.models)
    for (int64_t P : o.prompt_lens) {
      Row r = measure(m, P, o.decode, std::max(1, o.repeat));
      std::snprintf(line, sizeof line, "%-14s %6lld %11.1f %10.1f %9.1f %9.1f %9.1f %8.2f %8.2f %6.1f%% %6.1f%%\n",
                    r.model.c_str(), static_cast<long long>(r.prompt), r.prefill_tps, r.decode_tps, r.fwd_gflops,
                    r.gemm_gflops, r.bare_gflops, r.gemm_gflops / r.bare_gflops, r.fwd_gflops / r.bare_gflops,
                    100 * r.attn_share, 100 * r.scan_share);
      out << line << std::flush;
      rows.push_back(r);
    }
  out << "\nMemory (MiB). weights: accounted vs exact parameter bytes; RSS over the baseline measured before "
         "loading (the fixed overhead)\n";
  std::snprintf(line, sizeof line, "%-14s %6s %10s %10s %10s %10s %10s %10s %s\n", "model", "prompt", "weights",
                "params", "peak acct", "base RSS", "peak RSS", "RSS-base", "(RSS-base)/acct");
  out << line;
  for (const Row& r : rows) {
    std::snprintf(line, sizeof line, "%-14s %6lld %10s %10s %10s %10s %10s %10s %.3f%s\n", r.model.c_str(),
                  static_cast<long long>(r.prompt), mib(double(r.weight_bytes)).c_str(), mib(double(r.param_bytes)).c_str(),
                  mib(double(r.peak_accounted)).c_str(), mib(double(r.base_rss)).c_str(), mib(double(r.peak_rss)).c_str(),
                  mib(double(r.peak_rss - r.base_rss)).c_str(), double(r.peak_rss - r.base_rss) / double(r.peak_accounted),
                  r.rss_reset ? "" : " (peak RSS could not be reset: includes earlier rows)");
    out << line;
  }
  out << "\nGoals: gemm/bare >= 0.80; pfill/bare >= 0.60 at d_model >= 1024 and 1024 tokens; attention and scans "
         "under 50% of prefill; weights == params; (RSS-base)/acct <= 1.25.\n";
  return 0;
}

int print_info(std::ostream& out) {
  char mpi_version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(mpi_version, &len);
  std::string mpi(mpi_version, size_t(len));
  if (auto nl = mpi.find('\n'); nl != std::string::npos) mpi.resize(nl);
  Allocator a;
  Recorder r;
  CpuBackend cpu(a, r);
  out << "shardscope-engine " << engine_version() << " (event protocol v" << proto::kVersion << ")\n";
  out << "backends:\n";
  out << "  cpu   available: " << cpu.device_name() << ", " << std::thread::hardware_concurrency()
      << " hardware threads\n";
#ifdef SHARDSCOPE_HAVE_CUDA
  out << "  cuda  not available: CUDA and NCCL were found at configure time, but no cuda backend is implemented "
         "yet (runs use cpu; other hardware is simulated)\n";
#else
  out << "  cuda  not available: no cuda backend is implemented, and no nvcc/NCCL was found at configure time\n";
#endif
  int profiles = 0;
  std::error_code ec;
  for (auto& f : std::filesystem::directory_iterator(resources_dir() / "hardware", ec))
    profiles += f.path().extension() == ".json";
  out << "  sim   available: `shardscope-engine simulate`, " << profiles << " hardware profiles\n";
  out << "libraries:\n  OpenBLAS " << openblas_get_config() << "\n  MPI " << mpi << "\n";
  out << "resources: " << resources_dir().string() << " (" << preset_names().size() << " model presets)\n";
  return 0;
}

}  // namespace ss
