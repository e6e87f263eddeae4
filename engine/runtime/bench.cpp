#include "runtime/bench.h"
#include "runtime/rank.h"

#include <cblas.h>
#include <malloc.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <cstring>
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

// The achieved GFLOP/s of bare library GEMMs (cpu/gemm.cpp's
// library_gemm_seconds: sgemm, or oneDNN for bf16), `count` calls per shape
// as the forward issues them (x [M,K] times w [N,K]^T).
double bare_gemm_gflops(const std::map<GemmShape, int>& shapes, DType dtype) {
  double flops = 0, secs = 0;
  for (auto& [s, count] : shapes) {
    secs += cpu::library_gemm_seconds(s.M, s.N, s.K, dtype, count);
    flops += 2.0 * s.M * s.N * s.K * count;
  }
  return secs > 0 ? flops / secs * 1e-9 : 0;
}

// Bytes per second of a streaming read of `a` (a sum on every thread, bound
// by loads): the memory roofline of this machine, at this moment.
double stream_read_bytes_per_s(const std::vector<float>& a) {
  const int64_t n = int64_t(a.size());
  const int threads = cpu::threads();
  const auto t0 = Clock::now();
  double total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static)
  for (int k = 0; k < threads; ++k) {
    // Sixteen independent partial sums: the loop is bound by loads, not adds.
    float part[16] = {};
    const int64_t i0 = n * k / threads, i1 = n * (k + 1) / threads;
    int64_t i = i0;
    for (; i + 16 <= i1; i += 16)
#pragma omp simd
      for (int j = 0; j < 16; ++j) part[j] += a[size_t(i + j)];
    for (; i < i1; ++i) part[0] += a[size_t(i)];
    for (float p : part) total += p;
  }
  const double t = seconds_since(t0);
  if (total != double(n)) return 0;  // every value read (and the loop kept)
  return 4.0 * double(n) / t;
}

// The median as one of the samples (the upper middle of an even count), so
// the step it came from can be looked up by value.
double median_sample(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The bandwidth of a copy (read + write bytes of 64 MiB, split over the threads). Best of four.
double copy_bytes_per_s() {
  const int64_t n = int64_t(64) << 20;
  std::vector<char> src(size_t(n), 1), dst(size_t(n), 0);
  const int threads = cpu::threads();
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = Clock::now();
#pragma omp parallel for schedule(static)
    for (int k = 0; k < threads; ++k) {
      const int64_t a = n * k / threads, b = n * (k + 1) / threads;
      std::memcpy(dst.data() + a, src.data() + a, size_t(b - a));
    }
    best = std::max(best, 2.0 * double(n) / seconds_since(t0));
  }
  return best;
}

// Ops bound by memory traffic (their span bytes are what they move).
bool memory_bound(const std::string& op) {
  return op == "rmsnorm" || op == "gated_rmsnorm" || op == "silu_mul" || op == "add" || op == "add_bias" || op == "rope" ||
         op == "copy" || op == "embedding" || op == "conv1d";
}

struct Row {
  std::string model;
  int64_t prompt = 0;
  DType dtype = DType::F32;
  double prefill_s = 0, fp32_prefill_s = 0, decode_s_per_token = 0, prefill_tps = 0, decode_tps = 0;
  double fwd_gflops = 0, gemm_gflops = 0, bare_gflops = 0, sgemm_gflops = 0;
  double attn_share = 0, scan_share = 0;
  double weight_read_per_token = 0;  // bytes of weights one decode step's GEMMs read
  double read_bytes_per_s = 0;       // streaming read, median of samples between decode steps
  double decode_step_median_s = 0;   // decode step, median of the steps those samples sit between
  double elementwise_bytes_per_s = 0;
  // The median decode step's time by kind of kernel (seconds); the rest of
  // the step ran outside any kernel (dispatch, allocation, sampling).
  double step_gemm_s = 0, step_attn_s = 0, step_other_s = 0;
  int step_kernels = 0;
  int64_t weight_bytes = 0, param_bytes = 0, peak_accounted = 0, peak_rss = 0, base_rss = 0;
  bool rss_reset = false;
};

// One model and prompt length in one dtype: best prefill and decode of
// `repeat` runs, with the spans of the best prefill and of one decode step.
Row measure(const std::string& preset, int64_t P, int decode, int repeat, DType dtype) {
  Row r;
  r.model = preset;
  r.prompt = P;
  r.dtype = dtype;
  ModelConfig cfg = resolve_model(preset, nullptr);
  cfg.dtype = cfg.kv_dtype = dtype;
  // Memory the previous row freed goes back to the system first, so this
  // row's baseline is not inflated by (and its growth not hidden in) it.
  malloc_trim(0);
  r.rss_reset = reset_peak_rss();
  r.base_rss = current_rss_bytes();
  Allocator alloc;
  Recorder rec;
  CpuBackend be(alloc, rec);
  Model model(cfg, be);
  SyntheticSource src(1);
  model.load(src);
  r.weight_bytes = alloc.state().bytes[int(Category::Weights)];
  r.param_bytes = model.parameter_count() * dtype_size(dtype);
  RunOptions ro;
  ro.prompt_len = P;
  const std::vector<int32_t> prompt = make_prompt(ro, cfg.vocab);
  std::vector<int32_t> pos(static_cast<size_t>(P));
  for (int64_t i = 0; i < P; ++i) pos[size_t(i)] = int32_t(i);

  double best_prefill = 1e30, best_decode = 1e30;
  std::vector<proto::Span> best_spans, step_spans;
  for (int rep = 0; rep < repeat; ++rep) {
    Cache cache = model.make_cache(P + 2 * decode);
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
      if (k == 0) step_spans = rec.take_spans();
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
  // The machine is shared and its memory bandwidth moves with its
  // neighbours: decode is held against a streaming read measured between its
  // steps (256 MiB after each), the medians of both. The cache of the last
  // repeat goes on for these steps.
  {
    std::vector<float> stream(size_t(64) << 20, 1.0f);
    Cache cache = model.make_cache(P + 2 * decode);
    int32_t next = 0;
    {
      Tensor logits = model.forward(prompt, pos, cache, false);
      next = be.argmax_row(logits, 0);
    }
    std::vector<double> step_s, read;
    std::vector<std::array<double, 3>> kinds;  // gemm, attention, other kernels
    std::vector<int> counts;
    rec.clear();
    for (int k = 0; k < decode; ++k) {
      const int32_t p1 = int32_t(P + k);
      const auto t0 = Clock::now();
      Tensor logits = model.forward(std::span<const int32_t>(&next, 1), std::span<const int32_t>(&p1, 1), cache, false);
      next = be.argmax_row(logits, 0);
      step_s.push_back(seconds_since(t0));
      std::array<double, 3> k3{};
      const std::vector<proto::Span> spans = rec.take_spans();
      for (const auto& s : spans) k3[s.op == "gemm" ? 0 : s.op == "attention" ? 1 : 2] += double(s.t1 - s.t0) * 1e-9;
      kinds.push_back(k3);
      counts.push_back(int(spans.size()));
      read.push_back(stream_read_bytes_per_s(stream));
    }
    r.decode_step_median_s = median_sample(step_s);
    r.read_bytes_per_s = median_sample(read);
    for (size_t k = 0; k < step_s.size(); ++k)
      if (step_s[k] == r.decode_step_median_s) {
        std::tie(r.step_gemm_s, r.step_attn_s, r.step_other_s) = std::tuple(kinds[k][0], kinds[k][1], kinds[k][2]);
        r.step_kernels = counts[k];
        break;
      }
  }

  double flops = 0, gemm_flops = 0, gemm_ns = 0, attn_ns = 0, scan_ns = 0, ew_bytes = 0, ew_ns = 0;
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
    } else if (memory_bound(s.op)) {
      ew_bytes += s.bytes;
      ew_ns += double(s.t1 - s.t0);
    }
  }
  for (const auto& s : step_spans)
    if (s.op == "gemm") r.weight_read_per_token += double(s.dims[1] * s.dims[2] * dtype_size(dtype));
  r.prefill_s = best_prefill;
  r.decode_s_per_token = best_decode / std::max(decode, 1);
  r.prefill_tps = P / best_prefill;
  r.decode_tps = decode / std::max(best_decode, 1e-12);
  r.fwd_gflops = flops / best_prefill * 1e-9;
  r.gemm_gflops = gemm_flops / std::max(gemm_ns, 1.0);
  r.bare_gflops = bare_gemm_gflops(shapes, dtype);
  r.sgemm_gflops = dtype == DType::F32 ? r.bare_gflops : bare_gemm_gflops(shapes, DType::F32);
  r.attn_share = attn_ns * 1e-9 / best_prefill;
  r.scan_share = scan_ns * 1e-9 / best_prefill;
  r.elementwise_bytes_per_s = ew_ns > 0 ? ew_bytes / (ew_ns * 1e-9) : 0;
  return r;
}

}  // namespace

int run_bench(const BenchOptions& o, std::ostream& out) {
  // Initialise OpenBLAS (its per-thread packing buffers, touched in full by a
  // large GEMM), oneDNN and the OpenMP pool before the baseline RSS is read:
  // they are the fixed overhead, not the model's memory.
  std::map<GemmShape, int> warm{{GemmShape{2048, 8192, 2048}, 1}};
  bare_gemm_gflops(warm, DType::F32);
  if (o.dtype != DType::F32) bare_gemm_gflops(warm, o.dtype);
  Allocator probe_alloc;
  Recorder probe_rec;
  CpuBackend probe_be(probe_alloc, probe_rec);
  char line[512];
  const std::string dt(compute_dtype_name(o.dtype));
  out << "shardscope-engine bench  host " << host_name() << "  cpu " << probe_be.device_name() << "  threads "
      << cpu::threads() << "  " << openblas_get_config() << "  dtype " << dt << "\n";
  const double copy_bw = copy_bytes_per_s();
  // Without a bf16 matmul in oneDNN on this CPU (no AVX-512), bf16 GEMMs are
  // widened to fp32 for sgemm, and the header says so.
  const char* library = o.dtype != DType::BF16             ? "OpenBLAS sgemm"
                        : cpu::bf16_gemm_available() ? "oneDNN bf16"
                                                           : "bf16 widened to fp32 for OpenBLAS sgemm: oneDNN has no bf16 "
                                                             "matmul on this CPU";
  out << "Forward vs bare library GEMMs of the same shapes (" << library
      << (o.dtype == DType::F16 ? " on widened fp16" : "") << "; sgemm: OpenBLAS fp32), measured in this run (best of "
      << o.repeat << ").\n\n";
  std::snprintf(line, sizeof line, "%-13s %6s %6s %10s %9s %9s %9s %9s %8s %8s %8s %7s %7s\n", "model", "prompt",
                "dtype", "prefill/s", "decode/s", "fwd GF/s", "gemm GF/s", "bare GF/s", "gemm/bare", "bare/sgemm",
                "pfill/bare", "attn%", "scan%");
  out << line;
  std::vector<Row> rows;
  for (const auto& m : o.models)
    for (int64_t P : o.prompt_lens) {
      Row r = measure(m, P, o.decode, std::max(1, o.repeat), o.dtype);
      if (o.dtype != DType::F32) r.fp32_prefill_s = measure(m, P, 1, std::max(1, o.repeat), DType::F32).prefill_s;
      std::snprintf(line, sizeof line,
                    "%-13s %6lld %6s %10.1f %9.1f %9.1f %9.1f %9.1f %8.2f %8.2f %8.2f %6.1f%% %6.1f%%\n",
                    r.model.c_str(), static_cast<long long>(r.prompt), dt.c_str(), r.prefill_tps, r.decode_tps,
                    r.fwd_gflops, r.gemm_gflops, r.bare_gflops, r.gemm_gflops / r.bare_gflops,
                    r.bare_gflops / r.sgemm_gflops, r.fwd_gflops / r.bare_gflops, 100 * r.attn_share,
                    100 * r.scan_share);
      out << line << std::flush;
      rows.push_back(r);
    }
  out << "\nPrefill against fp32 prefill of the same model and prompt (this run); decode per token against the "
         "weight-bandwidth limit (the weight bytes one step's GEMMs read / a streaming read of 256 MiB: medians of "
         "decode steps and of reads taken between them); memory-bound kernels (norms, activations, adds, rope, conv) against a "
         "copy of 64 MiB (read + write bytes).\n";
  std::snprintf(line, sizeof line, "%-13s %6s %6s %12s %9s %10s %9s %10s %10s %9s %9s %8s\n", "model", "prompt",
                "dtype", "fp32/prefill", "decode ms", "read/token", "read GB/s", "limit ms", "limit/dec", "ew GB/s",
                "copy GB/s", "ew/copy");
  out << line;
  for (const Row& r : rows) {
    const double limit = r.weight_read_per_token / r.read_bytes_per_s;
    const double step = r.decode_step_median_s;
    std::snprintf(line, sizeof line, "%-13s %6lld %6s %12s %9.2f %10s %9.1f %10.2f %10.2f %9.1f %9.1f %8.2f\n",
                  r.model.c_str(), static_cast<long long>(r.prompt), dt.c_str(),
                  r.fp32_prefill_s > 0 ? (std::to_string(r.fp32_prefill_s / r.prefill_s).substr(0, 5) + "x").c_str()
                                       : "-",
                  step * 1e3, mib(r.weight_read_per_token).c_str(), r.read_bytes_per_s * 1e-9, limit * 1e3,
                  limit / step, r.elementwise_bytes_per_s * 1e-9, copy_bw * 1e-9,
                  r.elementwise_bytes_per_s / copy_bw);
    out << line;
  }
  out << "\nThe median decode step by kind (ms): its GEMMs (and the weight bytes they read per second), attention, the "
         "other kernels, and the time outside any kernel (dispatch, allocation, sampling).\n";
  std::snprintf(line, sizeof line, "%-13s %6s %6s %9s %9s %9s %9s %9s %9s %8s\n", "model", "prompt", "dtype",
                "step ms", "gemm ms", "gemm GB/s", "attn ms", "other ms", "outside", "kernels");
  out << line;
  for (const Row& r : rows) {
    const double step = r.decode_step_median_s;
    std::snprintf(line, sizeof line, "%-13s %6lld %6s %9.2f %9.2f %9.1f %9.2f %9.2f %9.2f %8d\n", r.model.c_str(),
                  static_cast<long long>(r.prompt), dt.c_str(), step * 1e3, r.step_gemm_s * 1e3,
                  r.weight_read_per_token / std::max(r.step_gemm_s, 1e-12) * 1e-9, r.step_attn_s * 1e3,
                  r.step_other_s * 1e3, (step - r.step_gemm_s - r.step_attn_s - r.step_other_s) * 1e3, r.step_kernels);
    out << line;
  }
  out << "\nMemory (MiB). weights: accounted vs exact parameter bytes; RSS over the baseline measured before "
         "loading (the fixed overhead)\n";
  std::snprintf(line, sizeof line, "%-13s %6s %10s %10s %10s %10s %10s %10s %s\n", "model", "prompt", "weights",
                "params", "peak acct", "base RSS", "peak RSS", "RSS-base", "(RSS-base)/acct");
  out << line;
  for (const Row& r : rows) {
    std::snprintf(line, sizeof line, "%-13s %6lld %10s %10s %10s %10s %10s %10s %.3f%s\n", r.model.c_str(),
                  static_cast<long long>(r.prompt), mib(double(r.weight_bytes)).c_str(), mib(double(r.param_bytes)).c_str(),
                  mib(double(r.peak_accounted)).c_str(), mib(double(r.base_rss)).c_str(), mib(double(r.peak_rss)).c_str(),
                  mib(double(r.peak_rss - r.base_rss)).c_str(), double(r.peak_rss - r.base_rss) / double(r.peak_accounted),
                  r.rss_reset ? "" : " (peak RSS could not be reset: includes earlier rows)");
    out << line;
  }
  out << "\nGoals (d_model >= 1024, 1024 tokens): gemm/bare >= 0.80; pfill/bare >= 0.60 (fp32); bf16 prefill >= "
         "1.6x fp32; limit/dec >= 0.70; attention and scans under 50% of prefill; weights == params; "
         "(RSS-base)/acct <= 1.25.\n";
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
  describe_cuda(out);
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
