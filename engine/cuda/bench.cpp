#include "cuda/bench.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <functional>
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

// Decode's kernels alone, each launched back to back `reps` times with no
// span, host work or other kernel between, on the model's shapes (one
// token) and on enough copies of its operands that no launch finds the last
// one's bytes in the L2: what each kernel streams, against the copy. The
// step's own figures above add the launches, the small kernels and the host.
void decode_kernels_alone(CudaBackend& be, Recorder& rec, const ModelConfig& c, int64_t ctx, double copy_bw,
                          std::ostream& out) {
  const Stream s = be.compute_stream();
  const DType dt = c.dtype;
  const int64_t d = c.d_model, F = c.ffn_dim, hd = c.head_dim, hq = c.n_heads * hd, hkv = c.n_kv_heads * hd;
  constexpr int kSets = 3, kReps = 12;
  const bool spans = rec.span_recording();
  rec.set_span_recording(false);
  auto make = [&](int64_t rows, int64_t cols, uint64_t seed) {
    Tensor t = be.alloc({rows, cols}, Category::Workspace, "bench.decode", dt);
    fill_random(mat(t), seed, 0.02f, s);
    return t;
  };
  Timer t(s);
  auto time_it = [&](const std::function<void(int)>& run) {  // seconds a launch
    run(0);
    t.start();
    for (int r = 0; r < kReps; ++r) run(r % kSets);
    return t.stop_ms() * 1e-3 / kReps;
  };
  auto report = [&](const char* what, const std::string& shape, double bytes, double sec) {
    line(out, "    %-16s %-28s %8.1f us %9.1f GB/s  %.2f of copy\n", what, shape.c_str(), sec * 1e6,
         bytes / sec * 1e-9, bytes / sec / copy_bw);
  };
  out << "  decode's kernels alone (back to back, no spans, operands beyond the L2):\n";
  const Tensor x = make(1, d, 40);
  struct Product {
    const char* name;
    std::vector<int64_t> rows;  // one weight [rows_i, cols] a product, sharing x
    int64_t cols;
  };
  for (const Product& p : {Product{"gemv q, k, v", {hq, hkv, hkv}, d}, Product{"gemv o", {d}, hq},
                           Product{"gemv gate, up", {F, F}, d}, Product{"gemv down", {d}, F},
                           Product{"gemv lm head", {c.vocab}, d}}) {
    std::vector<std::vector<Tensor>> ws(kSets);
    std::vector<Tensor> ys;
    double bytes = 0;
    for (int64_t n : p.rows) {
      ys.push_back(be.alloc({1, n}, Category::Workspace, "bench.decode", dt));
      bytes += double(n) * double(p.cols) * double(dtype_size(dt));
    }
    for (int set = 0; set < kSets; ++set)
      for (int64_t n : p.rows) ws[size_t(set)].push_back(make(n, p.cols, 41 + uint64_t(set) * 7 + uint64_t(n)));
    const Tensor xin = p.cols == d ? x : make(1, p.cols, 42);
    const double sec = time_it([&](int set) {
      if (ys.size() == 1) be.matmul(ys[0], xin, ws[size_t(set)][0]);
      else be.matmul_group(ys, xin, ws[size_t(set)]);
    });
    std::string shape;
    for (int64_t n : p.rows) shape += (shape.empty() ? "" : " + ") + std::to_string(n);
    report(p.name, shape + " x " + std::to_string(p.cols), bytes, sec);
  }
  // Attention over a cache of ctx tokens: K and V read once.
  std::vector<Tensor> ks, vs;
  for (int set = 0; set < kSets; ++set) {
    ks.push_back(make(ctx, hkv, 50 + uint64_t(set)));
    vs.push_back(make(ctx, hkv, 60 + uint64_t(set)));
  }
  const Tensor q = make(1, hq, 43), o = be.alloc({1, hq}, Category::Workspace, "bench.decode", dt);
  std::vector<int32_t> kpos(static_cast<size_t>(ctx)), qpos{int32_t(ctx - 1)};
  std::iota(kpos.begin(), kpos.end(), 0);
  AttentionArgs aa;
  aa.n_heads = c.n_heads;
  aa.n_kv_heads = c.n_kv_heads;
  aa.head_dim = int(hd);
  aa.scale = float(1.0 / std::sqrt(double(hd)));
  aa.q_pos = qpos;
  aa.k_pos = kpos;
  const double att = time_it([&](int set) { be.attention(o, q, ks[size_t(set)], vs[size_t(set)], aa); });
  report("attention", std::to_string(ctx) + " keys, " + std::to_string(c.n_kv_heads) + " kv heads x " +
                          std::to_string(hd), 2.0 * double(ctx) * double(hkv) * double(dtype_size(dt)), att);
  be.synchronize();
  rec.set_span_recording(spans);
}

}  // namespace

int run_bench(const CudaBenchOptions& o, std::ostream& out) {
  const DeviceProps props = device_props(0);
  const std::string model = o.quick ? "tiny-llama" : o.model;
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
    {  // warm-up at the timed length: cuBLAS's heuristics for these shapes, the pool's blocks
      Cache warm = m.make_cache(prompt);
      m.forward(tokens(prompt, V), positions(0, prompt), warm, false);
      be.synchronize();
    }
    rec.take_spans();
    Cache cache = m.make_cache(prompt + 3 * decode);  // decode thrice: with spans, without, without dependent launches
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
    if (ops.count("attention")) {
      double kernels_s = 0;
      for (const auto& [name, k] : ops) kernels_s += k.seconds;
      const Totals& att = ops.at("attention");
      const double share = 100.0 / std::max(kernels_s, 1e-12);
      line(out, "  attention: %d calls, %.1f TFLOP/s (causal flops); of the kernels' time: attention %.0f%%, GEMMs %.0f%%\n",
           att.count, att.flops / std::max(att.seconds, 1e-12) * 1e-12, att.seconds * share, gemm.seconds * share);
    }
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
    // Decode: a token at a time with the caches; the median step of `decode`.
    int32_t next = be.argmax_row(last, 0);
    int64_t pos = prompt;
    auto decode_steps = [&] {
      std::vector<double> step_s;
      for (int i = 0; i < decode; ++i) {
        const std::vector<int32_t> one{next};
        t.start();
        last = m.forward(one, positions(pos++, 1), cache, false);
        step_s.push_back(t.stop_ms() * 1e-3);
        next = be.argmax_row(last, 0);
      }
      be.synchronize();
      std::sort(step_s.begin(), step_s.end());
      return step_s[step_s.size() / 2];
    };
    // With spans (the table below), then without, as a run without --timeline
    // goes: two events an op cost host time a token can wait for.
    const double spanned = decode_steps();
    const auto dec_ops = by_op(rec.take_spans());
    rec.set_span_recording(false);
    // Without programmatic dependent launches (sm_90+; common.cuh), then with
    // them: what starting each gemv's weights early saves. The pass without
    // runs first, on the shorter cache, so the saving is not flattered.
    const bool dependent = dependent_launch();
    double per_token_plain = 0;
    {
      set_dependent_launch(false);
      struct Restore {
        bool on;
        ~Restore() { set_dependent_launch(on); }
      } restore{dependent};
      per_token_plain = decode_steps();
    }
    const double per_token = decode_steps();
    rec.set_span_recording(true);
    const double weights = double(alloc.state().bytes[size_t(Category::Weights)]);
    const double limit = weights / copy_bw;
    line(out, "\ndecode, batch 1: %.3f ms a token (median of %d; %.3f ms with spans recorded); weights %.2f GiB / "
              "copy bandwidth = %.3f ms: %.2f of the limit (goal >= 0.70)\n",
         per_token * 1e3, decode, spanned * 1e3, weights / double(1 << 30), limit * 1e3, limit / per_token);
    if (dependent)
      line(out, "  without dependent launches: %.3f ms a token (%.2f of the limit); with them %.3f ms: %.3f ms saved\n",
           per_token_plain * 1e3, limit / per_token_plain, per_token * 1e3, (per_token_plain - per_token) * 1e3);
    else
      line(out, "  dependent launches: off (%s); the pass before this one: %.3f ms a token\n",
           props.cc_major < 9 ? "the device is older than sm_90" : "SHARDSCOPE_CUDA_PDL=0", per_token_plain * 1e3);
    // Where a token's time goes: each op's kernels, and what is left between
    // them (launches, the host), from the pass with spans, whose events
    // between kernels also keep them from overlapping.
    out << "  where a token's time goes (the pass with spans recorded, so no launch overlaps another):\n";
    double kernels = 0;
    for (const auto& [op, k] : dec_ops) {
      kernels += k.seconds;
      line(out, "    %-16s %6d calls %8.3f ms a token %9.1f GB/s  %.2f of copy\n", op.c_str(), k.count,
           k.seconds / decode * 1e3, k.bytes / std::max(k.seconds, 1e-12) * 1e-9,
           k.bytes / std::max(k.seconds, 1e-12) / copy_bw);
    }
    line(out, "    %-16s %6s       %8.3f ms a token (the step's time less its spans: launches, the host)\n",
         "between kernels", "", std::max(0.0, spanned - kernels / decode) * 1e3);
  }
  decode_kernels_alone(be, rec, config(model, o.dtype), prompt, copy_bw, out);

  // ---- the SSMs: the scans and their neighbours' bandwidth, Mamba2's SSD
  // and Mamba's selective scan.
  for (const std::string& ssm : {o.quick ? std::string("tiny-mamba2") : o.ssm_model,
                                 o.quick ? std::string("tiny-mamba") : o.mamba_model}) {
    Model m(config(ssm, o.dtype), be);
    DeviceRandomSource src;
    m.load(src);
    const int64_t V = m.config().vocab;
    {
      Cache warm = m.make_cache(prompt);
      m.forward(tokens(prompt, V), positions(0, prompt), warm, false);
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
    // The chunked scan does ~2 d_state flops a byte it moves (its products
    // within a chunk and with the states): its TFLOP/s says how near it is
    // to the arithmetic units, its bandwidth how near to the memory.
    for (const char* op : {"ssd_scan", "selective_scan", "conv1d", "gated_rmsnorm", "rmsnorm", "add"})
      if (ops.count(op)) {
        const Totals& k = ops.at(op);
        line(out, "    %-16s %6d calls %9.1f GB/s  %.2f of copy  %7.2f TFLOP/s (%.0f flops a byte)\n", op, k.count,
             k.bytes / k.seconds * 1e-9, k.bytes / k.seconds / copy_bw, k.flops / k.seconds * 1e-12,
             k.flops / std::max(k.bytes, 1.0));
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

namespace {

// Rate of y[M,N] = x[M,K] w[N,K]^T in `dt` on cuBLAS, FLOP/s (best of a few).
double gemm_rate(Blas& blas, Stream s, int64_t M, int64_t N, int64_t K, DType dt) {
  const int64_t es = dtype_size(dt);
  void* x = malloc_device(M * K * es, s);
  void* w = malloc_device(N * K * es, s);
  void* y = malloc_device(M * N * es, s);
  if (!x || !w || !y) throw std::runtime_error("calibrate: no device memory for a GEMM");
  fill_random({x, M, K, K, dt}, 3, 1.0f, s);
  fill_random({w, N, K, K, dt}, 4, 0.02f, s);
  blas.gemm(true, false, N, M, K, 1.0f, w, dt, K, x, dt, K, 0.0f, y, dt, N, false);
  Timer t(s);
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    t.start();
    blas.gemm(true, false, N, M, K, 1.0f, w, dt, K, x, dt, K, 0.0f, y, dt, N, false);
    best = std::min(best, t.stop_ms() * 1e-3);
  }
  free_device(x, s);
  free_device(w, s);
  free_device(y, s);
  return 2.0 * double(M) * double(N) * double(K) / best;
}

// Seconds of one call of `op` through the backend (its span), the median of a few after a warm-up.
double span_seconds(CudaBackend& be, Recorder& rec, const std::function<void()>& op) {
  op();
  be.synchronize();
  rec.take_spans();
  std::vector<double> v;
  for (int r = 0; r < 5; ++r) {
    op();
    be.synchronize();
    for (const auto& sp : rec.take_spans())
      if (sp.stream == "compute") v.push_back(double(sp.t1 - sp.t0) * 1e-9);
  }
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

nlohmann::json calibrate(bool quick, std::ostream& log) {
  using json = nlohmann::json;
  const DeviceProps props = device_props(0);
  Allocator alloc;
  Recorder rec;
  CudaBackend be(alloc, rec, 0);
  const Stream s = be.compute_stream();
  Blas blas(s);
  const int64_t big = quick ? 64 : 8192, mid = quick ? 64 : 4096;
  const double f32 = gemm_rate(blas, s, mid, mid, mid, DType::F32);
  const double bf16 = gemm_rate(blas, s, big, big, big, DType::BF16);
  const double fp16 = gemm_rate(blas, s, big, big, big, DType::F16);
  const double bw = copy_bandwidth(s, quick ? (4 << 20) : (int64_t(1) << 30));
  log << "  gemm: fp32 " << f32 * 1e-12 << ", bf16 " << bf16 * 1e-12 << ", fp16 " << fp16 * 1e-12
      << " TFLOP/s; copy " << bw * 1e-9 << " GB/s\n";

  // Per-kernel overhead: a tiny add through the backend (its events included).
  Tensor t1 = be.alloc({1, 8}, Category::Workspace, "tiny");
  be.fill(t1, 0.0f);
  const double launch = span_seconds(be, rec, [&] { be.add(t1, t1, t1); });
  // Elementwise: a memory-bound add over buffers far larger than the L2.
  const int64_t rows = quick ? 64 : 8192, cols = quick ? 64 : 8192;
  Tensor a = be.alloc({rows, cols}, Category::Workspace, "a", DType::BF16);
  Tensor b = be.alloc({rows, cols}, Category::Workspace, "b", DType::BF16);
  be.fill(a, 0.5f);
  be.fill(b, 0.25f);
  const double add_s = span_seconds(be, rec, [&] { be.add(a, a, b); });
  const double elementwise = std::clamp(3.0 * double(a.nbytes()) / add_s / bw, 0.01, 1.0);
  // Attention: a causal bf16 prefill's FLOPs against the bf16 rate.
  const int64_t Tq = quick ? 64 : 4096, H = quick ? 2 : 32, hd = quick ? 64 : 128;
  Tensor q = be.alloc({Tq, H * hd}, Category::Workspace, "q", DType::BF16);
  Tensor k = be.alloc({Tq, H * hd}, Category::Workspace, "k", DType::BF16);
  Tensor v = be.alloc({Tq, H * hd}, Category::Workspace, "v", DType::BF16);
  Tensor o = be.alloc({Tq, H * hd}, Category::Workspace, "o", DType::BF16);
  for (Tensor* t : {&q, &k, &v}) fill_random(mat(*t), 5, 1.0f, s);
  std::vector<int32_t> pos(static_cast<size_t>(Tq));
  std::iota(pos.begin(), pos.end(), 0);
  AttentionArgs aa;
  aa.n_heads = aa.n_kv_heads = int(H);
  aa.head_dim = int(hd);
  aa.scale = float(1.0 / std::sqrt(double(hd)));
  aa.q_pos = aa.k_pos = pos;
  const double att_s = span_seconds(be, rec, [&] { be.attention(o, q, k, v, aa); });
  const double att_flops = double(Tq) * double(Tq + 1) / 2 * double(H) * 4.0 * double(hd);
  const double attention = std::clamp(att_flops / att_s / bf16, 0.01, 1.0);
  // One-row GEMMs (decode) over more weights than the L2 holds.
  const int64_t N = quick ? 64 : 11008, K = quick ? 64 : 4096;
  std::vector<Tensor> ws;
  for (int i = 0; i < 8; ++i) {
    ws.push_back(be.alloc({N, K}, Category::Workspace, "w", DType::BF16));
    fill_random(mat(ws.back()), 6 + i, 0.02f, s);
  }
  Tensor xr = be.alloc({1, K}, Category::Workspace, "x1", DType::BF16), yr = be.alloc({1, N}, Category::Workspace, "y1", DType::BF16);
  be.fill(xr, 0.1f);
  double gemv_s = 0;
  for (auto& w : ws) gemv_s += span_seconds(be, rec, [&] { be.matmul(yr, xr, w); });
  const double gemv = std::clamp(8.0 * double(ws[0].nbytes()) / gemv_s / bw, 0.01, 1.0);
  log << "  per kernel " << launch * 1e6 << " us; attention " << attention << " of bf16, elementwise " << elementwise
      << " and one-row GEMMs " << gemv << " of the copy\n";

  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  const std::string src = "measured by shardscope-engine calibrate --backend cuda on " + props.name + ", " + date;
  // The link: NCCL's, when measured; else the datasheet profile naming this GPU (one GPU: nothing to measure).
  json link = {{"name", "NVLink (not measured)"}, {"bandwidth_gbps", 100.0}, {"latency_us", 10.0},
               {"source", "assumed: no second GPU here and no profile names this GPU"}};
  json network = link;
  for (const std::string& name : hardware_names()) {
    const HardwareProfile hw = load_hardware(name);
    for (const char* model : {"H200", "H100", "A100", "A6000"})
      if (props.name.find(model) != std::string::npos && hw.device_name.find(model) != std::string::npos) {
        link = hw.source["node"]["link"];
        network = hw.source["network"];
        link["source"] = "from the " + name + " profile's datasheet figures: one GPU here, no link to measure";
        network["source"] = "from the " + name + " profile's datasheet figures";
      }
  }
  return {
      {"name", props.name + ", calibrated"},
      {"device",
       {{"name", props.name},
        {"memory_bytes", props.total_bytes},
        {"fp32_tflops", f32 * 1e-12},
        {"matmul_tflops", f32 * 1e-12},
        {"bf16_tflops", bf16 * 1e-12},
        {"fp16_tflops", fp16 * 1e-12},
        {"memory_bandwidth_gbps", bw * 1e-9},
        {"kernel_launch_us", launch * 1e6},
        {"attention_efficiency", attention},
        {"elementwise_efficiency", elementwise},
        {"gemv_efficiency", gemv},
        {"sources",
         {{"all", src + ": cuBLAS GEMMs of " + std::to_string(big) + "^3 (fp32: " + std::to_string(mid) +
                      "^3, which is also the vector rate given), a device-to-device copy (bytes read + written), "
                      "spans of the backend's own kernels"},
          {"bf16_tflops", src},
          {"fp16_tflops", src}}}}},
      {"node", {{"max_devices", std::max(1, device_count())}, {"link", link}}},
      {"network", network},
  };
}

}  // namespace ss::SS_CUDA_NS
