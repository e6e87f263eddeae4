#include "cuda/bench.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/runtime.h"
#include "model/model.h"
#include "runtime/process.h"
#include "sim/hardware.h"

namespace ss::SS_CUDA_NS {
namespace kern = ::ss::SS_CUDA_NS;  // the launchers, named apart from members
namespace {

// Milliseconds of work queued on a stream between start() and stop().
class Timer {
 public:
  explicit Timer(Stream s) : m_s(s), m_a(create_event()), m_b(create_event()) {}
  ~Timer() {
    destroy_event(m_a);
    destroy_event(m_b);
  }
  void start() { record_event(m_a, m_s); }
  double stop_ms() {
    record_event(m_b, m_s);
    sync_event(m_b);
    return event_elapsed_ms(m_a, m_b);
  }

 private:
  Stream m_s;
  Event m_a, m_b;
};

// Weights drawn on the device (a 7B model's from the host would take longer
// than the benchmark): uniform with each kind's spread, norms 1, A = -1.
class DeviceRandomSource final : public TensorSource {
 public:
  void fill(Backend& be, const WeightSpec& w, const Tensor& dst) override {
    const Stream s = static_cast<CudaBackend&>(be).compute_stream();
    const double fan_in = double(w.shape.empty() ? 1 : w.shape.back());
    switch (w.init) {
      case Init::NormWeight: kern::fill(mat(dst), 1.0f, s); return;
      case Init::ALogHeads:
      case Init::ALogS4D:
      case Init::Bias:
      case Init::ConvBias: kern::fill(mat(dst), 0.0f, s); return;
      case Init::Embedding: kern::fill_random(mat(dst), ++m_seed, float(std::sqrt(3.0) * w.scale), s); return;
      default: kern::fill_random(mat(dst), ++m_seed, float(std::sqrt(3.0 / fan_in) * w.scale), s);
    }
  }
  std::string describe() const override { return "uniform on the device"; }

 private:
  uint64_t m_seed = 1;
};

struct Totals {
  double seconds = 0, flops = 0, bytes = 0;
  int count = 0;
};

std::map<std::string, Totals> by_op(const std::vector<proto::Span>& spans, const std::string& stream = "compute") {
  std::map<std::string, Totals> out;
  for (const auto& s : spans) {
    if (s.stream != stream) continue;
    Totals& t = out[s.op];
    t.seconds += double(s.t1 - s.t0) * 1e-9;
    t.flops += s.flops;
    t.bytes += s.bytes;
    ++t.count;
  }
  return out;
}

// The device's streaming bandwidth: a device-to-device copy, bytes read plus written per second.
double copy_bandwidth(Stream s, int64_t bytes) {
  void* a = malloc_device(bytes, s);
  void* b = malloc_device(bytes, s);
  if (!a || !b) throw std::runtime_error("bench: no device memory for the copy");
  copy_on_device(b, a, bytes, s);
  Timer t(s);
  constexpr int kReps = 10;
  t.start();
  for (int i = 0; i < kReps; ++i) copy_on_device(i % 2 ? a : b, i % 2 ? b : a, bytes, s);
  const double ms = t.stop_ms();
  free_device(a, s);
  free_device(b, s);
  return 2.0 * double(bytes) * kReps / (ms * 1e-3);
}

// Bare cuBLAS on every GEMM shape the forward ran (its spans' dims M, N, K),
// as the backend calls it (y = x w^T: column-major m = N, n = M): seconds in all.
double bare_gemm_seconds(const std::vector<proto::Span>& spans, DType dt, Stream s, Blas& blas) {
  std::map<std::tuple<int64_t, int64_t, int64_t>, int> shapes;
  for (const auto& sp : spans)
    if (sp.stream == "compute" && sp.op == "gemm" && sp.dims.size() == 3) ++shapes[{sp.dims[0], sp.dims[1], sp.dims[2]}];
  double total = 0;
  Timer t(s);
  for (const auto& [shape, count] : shapes) {
    const auto [M, N, K] = shape;
    const int64_t es = dtype_size(dt);
    void* x = malloc_device(M * K * es, s);
    void* w = malloc_device(N * K * es, s);
    void* y = malloc_device(M * N * es, s);
    if (!x || !w || !y) throw std::runtime_error("bench: no device memory for a bare GEMM");
    fill_random({x, M, K, K, dt}, 7, 1.0f, s);
    fill_random({w, N, K, K, dt}, 8, 0.02f, s);
    blas.gemm(true, false, N, M, K, 1.0f, w, dt, K, x, dt, K, 0.0f, y, dt, N, false);
    const int reps = 5;
    t.start();
    for (int i = 0; i < reps; ++i) blas.gemm(true, false, N, M, K, 1.0f, w, dt, K, x, dt, K, 0.0f, y, dt, N, false);
    total += count * t.stop_ms() * 1e-3 / reps;
    free_device(x, s);
    free_device(w, s);
    free_device(y, s);
  }
  return total;
}

// The dense rate of `dt` from the hardware profile whose name shares the GPU's model (H200, H100, A100, ...).
double profile_peak(const std::string& gpu, DType dt) {
  for (const std::string& name : hardware_names()) {
    const HardwareProfile hw = load_hardware(name);
    for (const char* model : {"H200", "H100", "A100", "A6000", "MI300X"})
      if (gpu.find(model) != std::string::npos && hw.device_name.find(model) != std::string::npos)
        return hw.matmul_rate(dt);
  }
  return 0;
}

ModelConfig config(const std::string& name, DType dt) {
  ModelConfig c = resolve_model(name, nullptr);
  c.dtype = c.kv_dtype = dt;
  return c;
}

std::vector<int32_t> tokens(int64_t n, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = int32_t((i * 7919 + 13) % vocab);
  return t;
}
std::vector<int32_t> positions(int64_t first, int64_t n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), int32_t(first));
  return p;
}

void line(std::ostream& out, const char* fmt, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, fmt, args...);
  out << buf;
}

}  // namespace

int run_bench(const CudaBenchOptions& o, std::ostream& out) {
  const DeviceProps props = device_props(0);
  const std::string model = o.quick ? "tiny-llama" : o.model, ssm = o.quick ? "tiny-mamba2" : o.ssm_model;
  const int64_t prompt = o.quick ? 64 : o.prompt;
  const int decode = o.quick ? 2 : o.decode;
  const double peak = o.peak_tflops > 0 ? o.peak_tflops * 1e12 : profile_peak(props.name, o.dtype);
  out << "shardscope-engine bench --backend cuda: " << props.name << ", " << runtime_version() << "; "
      << compute_dtype_name(o.dtype) << "; every baseline measured in this run\n";
  Allocator alloc;
  Recorder rec;
  CudaBackend be(alloc, rec, 0);
  const Stream s = be.compute_stream();
  const double copy_bw = copy_bandwidth(s, o.quick ? (4 << 20) : (int64_t(1) << 30));
  line(out, "device-to-device copy: %.1f GB/s (bytes read + written)\n", copy_bw * 1e-9);
  Blas blas(s);

  // ---- the Transformer: prefill GEMMs, MFU, memory-bound kernels, decode.
  {
    Model m(config(model, o.dtype), be);
    DeviceRandomSource src;
    m.load(src);
    const int64_t V = m.config().vocab;
    {  // warm-up: cuBLAS's heuristics and the pool
      Cache warm = m.make_cache(std::min<int64_t>(prompt, 256));
      m.forward(tokens(std::min<int64_t>(prompt, 256), V), positions(0, std::min<int64_t>(prompt, 256)), warm, false);
      be.synchronize();
    }
    rec.take_spans();
    Cache cache = m.make_cache(prompt + decode);
    Timer t(s);
    t.start();
    Tensor last = m.forward(tokens(prompt, V), positions(0, prompt), cache, false);
    const double prefill_s = t.stop_ms() * 1e-3;
    be.synchronize();
    const std::vector<proto::Span> spans = rec.take_spans();
    const auto ops = by_op(spans);
    const Totals gemm = ops.count("gemm") ? ops.at("gemm") : Totals{};
    const double bare = bare_gemm_seconds(spans, o.dtype, s, blas);
    double matmul_flops = gemm.flops + (ops.count("attention") ? ops.at("attention").flops : 0.0);
    line(out, "\nprefill: %s, %lld tokens, %s: %.3f s, %.0f tokens/s\n", model.c_str(), static_cast<long long>(prompt),
         std::string(compute_dtype_name(o.dtype)).c_str(), prefill_s, double(prompt) / prefill_s);
    line(out, "  forward GEMMs: %d calls, %.1f TFLOP/s; bare cuBLAS on the same shapes %.1f TFLOP/s: %.2f of bare (goal >= 0.85)\n",
         gemm.count, gemm.flops / std::max(gemm.seconds, 1e-12) * 1e-12, gemm.flops / std::max(bare, 1e-12) * 1e-12,
         bare / std::max(gemm.seconds, 1e-12));
    if (peak > 0)
      line(out, "  MFU: %.1f TFLOP/s of matrix work / %.1f peak = %.2f (goal >= 0.50 for a 7B at 4K)\n",
           matmul_flops / prefill_s * 1e-12, peak * 1e-12, matmul_flops / prefill_s / peak);
    else
      out << "  MFU: no hardware profile names this GPU; give --peak-tflops\n";
    out << "  memory-bound kernels against the copy (goal >= 0.60 for norms, elementwise and scans):\n";
    for (const char* op : {"rmsnorm", "add", "silu_mul", "rope", "embedding", "attention"})
      if (ops.count(op)) {
        const Totals& k = ops.at(op);
        line(out, "    %-16s %6d calls %9.1f GB/s  %.2f of copy%s\n", op, k.count, k.bytes / k.seconds * 1e-9,
             k.bytes / k.seconds / copy_bw, std::string(op) == "attention" ? "  (prefill: compute-bound)" : "");
      }
    // Decode: a token at a time with the caches.
    std::vector<double> step_s;
    int32_t next = be.argmax_row(last, 0);
    for (int i = 0; i < decode; ++i) {
      const std::vector<int32_t> one{next};
      t.start();
      last = m.forward(one, positions(prompt + i, 1), cache, false);
      step_s.push_back(t.stop_ms() * 1e-3);
      next = be.argmax_row(last, 0);
    }
    be.synchronize();
    const auto dec_ops = by_op(rec.take_spans());
    std::sort(step_s.begin(), step_s.end());
    const double per_token = step_s[step_s.size() / 2];
    const double weights = double(alloc.state().bytes[size_t(Category::Weights)]);
    const double limit = weights / copy_bw;
    line(out, "\ndecode, batch 1: %.3f ms a token (median of %d); weights %.2f GiB / copy bandwidth = %.3f ms: %.2f of the limit (goal >= 0.70)\n",
         per_token * 1e3, decode, weights / double(1 << 30), limit * 1e3, limit / per_token);
    if (dec_ops.count("attention")) {
      const Totals& k = dec_ops.at("attention");
      line(out, "    %-16s %6d calls %9.1f GB/s  %.2f of copy (K/V read once)\n", "attention", k.count,
           k.bytes / k.seconds * 1e-9, k.bytes / k.seconds / copy_bw);
    }
  }

  // ---- the SSM: the scan and its neighbours' bandwidth.
  {
    Model m(config(ssm, o.dtype), be);
    DeviceRandomSource src;
    m.load(src);
    const int64_t V = m.config().vocab;
    {
      Cache warm = m.make_cache(std::min<int64_t>(prompt, 256));
      m.forward(tokens(std::min<int64_t>(prompt, 256), V), positions(0, std::min<int64_t>(prompt, 256)), warm, false);
      be.synchronize();
    }
    rec.take_spans();
    Cache cache = m.make_cache(prompt);
    Timer t(s);
    t.start();
    m.forward(tokens(prompt, V), positions(0, prompt), cache, false);
    const double prefill_s = t.stop_ms() * 1e-3;
    be.synchronize();
    const auto ops = by_op(rec.take_spans());
    line(out, "\nprefill: %s, %lld tokens: %.3f s\n", ssm.c_str(), static_cast<long long>(prompt), prefill_s);
    for (const char* op : {"ssd_scan", "conv1d", "gated_rmsnorm", "rmsnorm", "add"})
      if (ops.count(op)) {
        const Totals& k = ops.at(op);
        line(out, "    %-16s %6d calls %9.1f GB/s  %.2f of copy\n", op, k.count, k.bytes / k.seconds * 1e-9,
             k.bytes / k.seconds / copy_bw);
      }
  }

  // ---- NCCL between the GPUs, by ranks of this engine.
  const int gpus = device_count();
  if (o.quick) return 0;
  if (gpus < 2) {
    out << "\nNCCL bus bandwidth: one GPU here; all-reduce, all-gather and send/recv need two or more\n";
    return 0;
  }
  out << "\nNCCL on " << gpus << " GPUs (nccl-tests: algbw = bytes/time, busbw = algbw x 2(n-1)/n all_reduce, "
         "(n-1)/n all_gather, 1 sendrecv):\n" << std::flush;
  stream_command(mpirun_self_command(gpus, "bench-nccl-rank"), out);
  return 0;
}

}  // namespace ss::SS_CUDA_NS
