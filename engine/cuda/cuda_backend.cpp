#include "cuda/cuda_backend.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>

#include "comm/quantize.h"

namespace ss::SS_CUDA_NS {

// The launchers of kernels.h, named apart from the Backend methods they serve.
namespace kern = ::ss::SS_CUDA_NS;

Mat mat(const Tensor& t) {
  if (!t.defined()) return {};
  if (t.ndim() == 2) return {t.raw(), t.rows(), t.cols(), t.ld(), t.dtype()};
  if (!t.is_contiguous()) throw std::logic_error("cuda: a view of " + t.shape_str() + " is neither 2-D nor contiguous");
  return {t.raw(), 1, t.numel(), t.numel(), t.dtype()};
}

namespace {

// The stream device memory is freed on (Buffer's free function takes no
// context): the last backend's compute stream while its device lives (the
// communicators' requests may outlive the backend), then the default one.
Stream g_free_stream = nullptr;
void free_on_stream(void* p) { free_device(p, g_free_stream); }

QuantArgs quant_args(const QuantSpec& s) {
  QuantArgs q;
  q.precision = s.precision;
  q.block = s.block;
  q.stochastic = s.rounding == Rounding::Stochastic;
  q.seed = s.seed;
  return q;
}

float* f32_ptr(const Tensor& t) {
  if (!t.defined()) return nullptr;
  if (t.dtype() != DType::F32 || !t.is_contiguous())
    throw std::logic_error("cuda: scan states and decays are contiguous fp32, got " + std::string(dtype_name(t.dtype())));
  return static_cast<float*>(t.raw());
}

SsdDev ssd_args(const SsdArgs& a) {
  SsdDev d;
  d.y = mat(a.y);
  d.x = mat(a.x);
  d.dt = mat(a.dt);
  d.dt_bias = mat(a.dt_bias);
  d.A_log = mat(a.A_log);
  d.D = mat(a.D);
  d.B = mat(a.B);
  d.C = mat(a.C);
  d.state = f32_ptr(a.state);
  d.log_decay = f32_ptr(a.log_decay);
  d.n_heads = a.n_heads;
  d.head_dim = a.head_dim;
  d.n_groups = a.n_groups;
  d.d_state = a.d_state;
  d.dt_min = a.dt_min;
  d.dt_max = a.dt_max;
  return d;
}

SelectiveDev selective_args(const SelectiveScanArgs& a) {
  SelectiveDev d;
  d.y = mat(a.y);
  d.x = mat(a.x);
  d.dt = mat(a.dt);
  d.z = mat(a.z);
  d.dt_bias = mat(a.dt_bias);
  d.D = mat(a.D);
  d.A_log = mat(a.A_log);
  d.B = mat(a.B);
  d.C = mat(a.C);
  d.state = f32_ptr(a.state);
  d.dt_sum = f32_ptr(a.dt_sum);
  d.d_state = a.A_log.numel() / std::max<int64_t>(1, a.x.defined() ? a.x.cols() : a.y.cols());
  return d;
}

}  // namespace

// ------------------------------------------------------------------ spans

SpanQueue::SpanQueue(Recorder& rec, Stream reference_stream) : m_rec(rec) {
  m_reference = create_event();
  sync_stream(reference_stream);
  record_event(m_reference, reference_stream);
  sync_event(m_reference);
  m_reference_time = std::chrono::steady_clock::now();
}

SpanQueue::~SpanQueue() {
  for (auto& p : m_pending) {
    destroy_event(p.start);
    destroy_event(p.end);
  }
  for (Event e : m_free) destroy_event(e);
  destroy_event(m_reference);
}

Event SpanQueue::mark(Stream s) {
  Event e;
  if (m_free.empty()) {
    e = create_event();
  } else {
    e = m_free.back();
    m_free.pop_back();
  }
  record_event(e, s);
  return e;
}

void SpanQueue::push(Pending p) {
  m_pending.push_back(std::move(p));
  constexpr size_t kMaxPending = 8192;  // events in flight before the oldest are waited for
  resolve(m_pending.size() > kMaxPending);
}

int64_t SpanQueue::host_ns(Event e) const {
  const double since_reference_ns = event_elapsed_ms(m_reference, e) * 1e6;
  const auto reference_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(m_reference_time - m_rec.origin()).count();
  return reference_ns + int64_t(since_reference_ns);
}

void SpanQueue::resolve(bool wait) {
  while (!m_pending.empty()) {
    Pending& p = m_pending.front();
    if (!event_done(p.end)) {
      if (!wait) return;
      sync_event(p.end);
    }
    m_rec.span_at(p.tag, p.stream, p.op, host_ns(p.start), host_ns(p.end), p.flops, p.bytes, std::move(p.dims),
                  std::move(p.peers));
    m_free.push_back(p.start);
    m_free.push_back(p.end);
    m_pending.pop_front();
  }
}

// ---------------------------------------------------------------- backend

void settle(Stream s) noexcept {
  try {
    sync_stream(s);
  } catch (...) {
    // Reported, or to be, by the call that waits for the work that failed.
  }
}

// Grows per slot; the old buffer is freed in stream order (kernels queued
// before still read it).
class CudaBackend::DeviceScratch final : public Scratch {
 public:
  explicit DeviceScratch(Stream s) : m_stream(s) {}
  ~DeviceScratch() override {
    for (auto& b : m_bufs)
      if (b.p) free_device(b.p, m_stream);
    if (m_counters.p) free_device(m_counters.p, m_stream);
  }
  void* get(int slot, int64_t bytes) override {
    Buf& b = m_bufs[size_t(slot)];
    if (bytes > b.bytes) grow(b, bytes, "kernel scratch");
    return b.p;
  }
  int* counters(int64_t count) override {
    const int64_t bytes = count * int64_t(sizeof(int));
    if (bytes > m_counters.bytes) {
      grow(m_counters, bytes, "kernel counters");
      memset_device(m_counters.p, 0, m_counters.bytes, m_stream);
    }
    return static_cast<int*>(m_counters.p);
  }

 private:
  struct Buf {
    void* p = nullptr;
    int64_t bytes = 0;
  };
  void grow(Buf& b, int64_t bytes, const char* what) {
    if (b.p) free_device(b.p, m_stream);
    b.bytes = std::max<int64_t>(bytes, 2 * b.bytes);
    b.p = malloc_device(b.bytes, m_stream);
    if (!b.p) {
      b.bytes = 0;
      throw std::runtime_error("cuda: no device memory for " + std::to_string(bytes) + " bytes of " + what);
    }
  }
  Stream m_stream;
  Buf m_bufs[kScratchSlots], m_counters;
};

struct CudaBackend::CachedArray {
  std::vector<char> host;
  void* device = nullptr;
  uint64_t last_use = 0;
};

void DeviceFailure::set(const std::string& why) {
  std::lock_guard lock(m_mutex);
  if (m_why.empty()) m_why = why;
}
void DeviceFailure::watch(std::weak_ptr<const void> owner, std::function<void()> ask) {
  std::lock_guard lock(m_mutex);
  m_probes.push_back({std::move(owner), std::move(ask)});
}
void DeviceFailure::check() {
  std::vector<Probe> probes;
  {
    std::lock_guard lock(m_mutex);
    std::erase_if(m_probes, [](const Probe& p) { return p.owner.expired(); });
    probes = m_probes;
  }
  for (const Probe& p : probes) p.ask();  // takes its communicator's locks, and set() this one's
  std::lock_guard lock(m_mutex);
  if (!m_why.empty()) throw std::runtime_error(m_why);
}

DeviceContext::DeviceContext(int dev, Recorder& rec) : device(dev) {
  set_device(dev);
  compute = create_stream();
  comm = create_stream();
  spans = std::make_unique<SpanQueue>(rec, compute);
}

DeviceContext::~DeviceContext() {
  settle(comm);
  settle(compute);
  if (g_free_stream == compute) g_free_stream = nullptr;
  spans.reset();
  destroy_stream(comm);
  destroy_stream(compute);
}

CudaBackend::CudaBackend(Allocator& alloc, Recorder& rec, std::shared_ptr<DeviceContext> ctx)
    : Backend(alloc, rec), m_ctx(std::move(ctx)), m_compute(m_ctx->compute) {
  set_device(m_ctx->device);
  g_free_stream = m_compute;
  m_blas = std::make_unique<Blas>(m_compute);
  m_scratch = std::make_unique<DeviceScratch>(m_compute);
  m_argmax = static_cast<int32_t*>(malloc_device(sizeof(int32_t), m_compute));
  rec.set_flush([this] { m_ctx->spans->resolve(true); });
}

CudaBackend::CudaBackend(Allocator& alloc, Recorder& rec, int device)
    : CudaBackend(alloc, rec, std::make_shared<DeviceContext>(device, rec)) {}

CudaBackend::~CudaBackend() {
  recorder().set_flush(nullptr);
  settle(m_ctx->comm);
  settle(m_compute);
  for (auto& a : m_arrays) free_device(a.device, m_compute);
  free_device(m_argmax, m_compute);
  m_scratch.reset();
  m_blas.reset();
  settle(m_compute);
  m_ctx->spans->resolve(true);
}

std::string CudaBackend::device_name() const { return device_props(m_ctx->device).name; }

void CudaBackend::synchronize() {
  sync_stream(m_ctx->comm);
  sync_stream(m_compute);
  m_ctx->spans->resolve(true);
  m_ctx->failure->check();
}

void CudaBackend::read(void* dst, const void* src, int64_t bytes) {
  copy_to_host(dst, src, bytes, m_compute);
  m_ctx->failure->check();  // after the copy: what it read came after any abort or failed transfer
}

void CudaBackend::execute(const char* op, double flops, double bytes, std::vector<int64_t> dims,
                          const std::function<void()>& kernel, DType) {
  if (!recorder().span_recording()) {
    kernel();
    return;
  }
  SpanQueue& spans = *m_ctx->spans;
  SpanQueue::Pending p;
  p.start = spans.mark(m_compute);
  kernel();
  p.end = spans.mark(m_compute);
  p.tag = recorder().tag();
  p.op = op;
  p.flops = flops;
  p.bytes = bytes;
  p.dims = std::move(dims);
  spans.push(std::move(p));
}

void* CudaBackend::allocate_data(int64_t bytes) { return malloc_device(bytes, m_compute); }
Buffer::FreeFn CudaBackend::free_fn() const { return &free_on_stream; }

// Found by size and content, no hash: a decode step asks for its key
// positions once a layer, and a memcmp of them at a 4K context (16 KiB) took
// 0.17 us on a 2-core EPYC host, where hashing them took 7.5 us.
const void* CudaBackend::device_copy(const void* host, int64_t bytes) {
  static uint64_t clock = 0;
  const auto* p = static_cast<const unsigned char*>(host);
  for (auto& a : m_arrays)
    if (int64_t(a.host.size()) == bytes && (bytes == 0 || std::memcmp(a.host.data(), host, size_t(bytes)) == 0)) {
      a.last_use = ++clock;
      return a.device;
    }
  constexpr size_t kKept = 16;
  if (m_arrays.size() == kKept) {  // the least recently used goes, freed in stream order
    auto old = std::min_element(m_arrays.begin(), m_arrays.end(),
                                [](const CachedArray& a, const CachedArray& b) { return a.last_use < b.last_use; });
    free_device(old->device, m_compute);
    m_arrays.erase(old);
  }
  CachedArray a;
  a.host.assign(p, p + bytes);
  a.last_use = ++clock;
  a.device = malloc_device(std::max<int64_t>(bytes, 1), m_compute);
  if (!a.device) throw std::runtime_error("cuda: no device memory for " + std::to_string(bytes) + " bytes of indices");
  copy_to_device(a.device, a.host.data(), bytes, m_compute);
  m_arrays.push_back(std::move(a));
  return m_arrays.back().device;
}

void CudaBackend::k_upload(const Tensor& dst, const void* src, DType src_dtype) {
  if (src_dtype == dst.dtype()) {
    copy_to_device(dst.raw(), src, dst.nbytes(), m_compute);
    return;
  }
  if (!is_float(src_dtype) || !is_float(dst.dtype())) throw std::logic_error("upload: no conversion between i32 and floats");
  // Rounded once on the host (to nearest even), a block at a time.
  constexpr int64_t kBlock = 1 << 20;
  std::vector<float> wide(size_t(std::min(kBlock, dst.numel())));
  std::vector<char> narrowed(wide.size() * size_t(dtype_size(dst.dtype())));
  const int64_t ss = dtype_size(src_dtype), ds = dtype_size(dst.dtype());
  for (int64_t i = 0; i < dst.numel(); i += kBlock) {
    const int64_t m = std::min(kBlock, dst.numel() - i);
    widen(static_cast<const char*>(src) + i * ss, src_dtype, m, wide.data());
    narrow(wide.data(), m, dst.dtype(), narrowed.data());
    copy_to_device(static_cast<char*>(dst.raw()) + i * ds, narrowed.data(), m * ds, m_compute);
  }
}

void CudaBackend::k_download(const Tensor& src, float* dst) {
  if (src.dtype() == DType::F32) {
    read(dst, src.raw(), src.nbytes());
    return;
  }
  std::vector<char> raw(size_t(src.nbytes()));
  read(raw.data(), src.raw(), src.nbytes());
  widen(raw.data(), src.dtype(), src.numel(), dst);
}

void CudaBackend::k_fill(const Tensor& dst, float value) { kern::fill(mat(dst), value, m_compute); }

// A copy within one dtype moves bytes (rows at a time for strided views);
// between dtypes it converts, rounding once.
void CudaBackend::k_copy(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype()) {
    if (dst.is_contiguous() && src.is_contiguous()) {
      copy_on_device(dst.raw(), src.raw(), dst.nbytes(), m_compute);
      return;
    }
    if (dst.ndim() == 2) {
      const int64_t es = dtype_size(dst.dtype());
      copy_2d_on_device(dst.raw(), dst.ld() * es, src.raw(), src.ld() * es, dst.cols() * es, dst.rows(), m_compute);
      return;
    }
  }
  if (!(dst.is_contiguous() && src.is_contiguous()) && dst.ndim() != 2)
    throw std::logic_error("copy of strided views takes 2-D tensors");
  kern::convert(mat(dst), mat(src), m_compute);
}

// cuBLAS is column-major: a row-major X[r, c] is the column-major matrix X^T,
// so Y = op(A) op(B) is computed as Y^T = op(B)^T op(A)^T, B's operand first.
void CudaBackend::gemm(int64_t M, int64_t N, int64_t K, const Tensor& A, bool a_trans, const Tensor& B, bool b_trans,
                       const Tensor& C, float alpha, float beta) {
  if (A.dtype() != B.dtype())
    throw std::logic_error("cuda gemm: operands in " + std::string(dtype_name(A.dtype())) + " and " +
                           std::string(dtype_name(B.dtype())));
  m_blas->gemm(b_trans, a_trans, N, M, K, alpha, B.raw(), B.dtype(), B.ld(), A.raw(), A.dtype(), A.ld(), beta, C.raw(),
               C.dtype(), C.ld(), m_tf32);
}

void CudaBackend::k_matmul(const Tensor& y, const Tensor& x, const Tensor& w, bool accumulate) {
  // A few rows (decode): a kernel that streams the weights at the memory's rate (gemv.cu).
  if (x.rows() <= 4 && kern::gemv_fits(mat(y), mat(x), mat(w))) return kern::gemv(mat(y), mat(x), mat(w), accumulate, m_compute);
  gemm(x.rows(), w.rows(), x.cols(), x, false, w, true, y, 1.0f, accumulate ? 1.0f : 0.0f);
}

// A decode step's group (q, k and v; gate and up) streams every weight in one launch.
void CudaBackend::k_matmul_group(std::span<const Tensor> ys, const Tensor& x, std::span<const Tensor> ws) {
  bool fits = x.rows() <= 4 && ws.size() <= size_t(kern::kMaxGemvGroup);
  std::array<kern::Mat, kern::kMaxGemvGroup> ym, wm;
  for (size_t i = 0; fits && i < ws.size(); ++i) {
    ym[i] = mat(ys[i]);
    wm[i] = mat(ws[i]);
    fits = kern::gemv_fits(ym[i], mat(x), wm[i]);
  }
  if (!fits) return Backend::k_matmul_group(ys, x, ws);
  kern::gemv_group(ym.data(), mat(x), wm.data(), int(ws.size()), false, m_compute);
}

void CudaBackend::k_embedding(const Tensor& y, const Tensor& table, std::span<const int32_t> tokens) {
  kern::embedding(mat(y), mat(table), device_copy(tokens), m_compute);
}

void CudaBackend::k_rmsnorm(const Tensor& y, const Tensor& x, const Tensor& z, const Tensor& w, float eps,
                            int64_t group) {
  kern::rmsnorm(mat(y), mat(x), mat(z), mat(w), eps, group, m_compute);
}

void CudaBackend::k_rope(const Tensor& x, int n_heads, int head_dim, std::span<const int32_t> pos,
                         std::span<const double> inv_freq) {
  kern::rope(mat(x), n_heads, head_dim, device_copy(pos), device_copy(inv_freq), m_compute);
}

void CudaBackend::k_add_bias(const Tensor& y, const Tensor& b) { kern::add_bias(mat(y), mat(b), m_compute); }

void CudaBackend::k_attention(const Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v,
                              const AttentionArgs& a, const Tensor& lse) {
  AttnShape s;
  s.Tq = q.rows();
  s.Tk = k.rows();
  s.n_heads = a.n_heads;
  s.n_kv_heads = a.n_kv_heads;
  s.head_dim = a.head_dim;
  s.scale = a.scale;
  kern::attention(mat(o), mat(q), mat(k), mat(v), s, device_copy(a.q_pos), device_copy(a.k_pos),
            lse.defined() ? static_cast<float*>(lse.raw()) : nullptr, *m_scratch, m_compute);
}

void CudaBackend::k_attention_merge(const Tensor& o, const Tensor& lse, const Tensor& o2, const Tensor& lse2,
                                    int n_heads, int head_dim) {
  kern::attention_merge(mat(o), static_cast<float*>(lse.raw()), mat(o2), static_cast<const float*>(lse2.raw()), n_heads,
                  head_dim, m_compute);
}

void CudaBackend::k_silu_mul(const Tensor& y, const Tensor& gate, const Tensor& up) {
  kern::silu_mul(mat(y), mat(gate), mat(up), m_compute);
}

void CudaBackend::k_add(const Tensor& y, const Tensor& a, const Tensor& b) { kern::add(mat(y), mat(a), mat(b), m_compute); }

void CudaBackend::k_conv1d_causal(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b,
                                  const Tensor& state, bool silu) {
  kern::conv1d_causal(mat(y), mat(x), mat(w), mat(b), mat(state), silu, m_compute);
}

void CudaBackend::k_ssd_scan(const SsdArgs& a) { kern::ssd_scan(ssd_args(a), *m_scratch, m_compute); }
void CudaBackend::k_ssd_state_correction(const SsdArgs& a) {
  kern::ssd_state_correction(ssd_args(a), *m_scratch, m_compute);
}
void CudaBackend::k_selective_scan(const SelectiveScanArgs& a) { kern::selective_scan(selective_args(a), m_compute); }
void CudaBackend::k_selective_state_correction(const SelectiveScanArgs& a) {
  kern::selective_state_correction(selective_args(a), m_compute);
}

int32_t CudaBackend::k_argmax_row(const Tensor& x, int64_t row) {
  kern::argmax_row(mat(x), row, m_argmax, m_compute);
  int32_t out = 0;
  read(&out, m_argmax, sizeof out);
  return out;
}

void CudaBackend::k_quantize(const Tensor& out, const Tensor& in, const QuantSpec& spec, uint64_t counter) {
  kern::quantize(mat(in), in.numel(), quant_args(spec), counter, static_cast<uint8_t*>(out.raw()), m_compute);
}

void CudaBackend::k_dequantize(const Tensor& out, const Tensor& in, const QuantSpec& spec, bool accumulate) {
  kern::dequantize(static_cast<const uint8_t*>(in.raw()), out.numel(), quant_args(spec), mat(out), accumulate, m_compute);
}

void CudaBackend::k_ssd_state_advance(const Tensor& state, const Tensor& chunk_state, const Tensor& log_decay) {
  const int64_t H = state.size(0);
  kern::ssd_state_advance(static_cast<float*>(state.raw()), static_cast<const float*>(chunk_state.raw()),
                    static_cast<const float*>(log_decay.raw()), H, state.numel() / H, m_compute);
}

void CudaBackend::k_selective_state_advance(const Tensor& state, const Tensor& A_log, const Tensor& chunk_state,
                                            const Tensor& dt_sum) {
  const int64_t C = state.size(0);
  kern::selective_state_advance(static_cast<float*>(state.raw()), mat(A_log), static_cast<const float*>(chunk_state.raw()),
                          static_cast<const float*>(dt_sum.raw()), C, state.numel() / C, m_compute);
}

void CudaBackend::k_gated_norm_sumsq(const Tensor& ss, const Tensor& x, const Tensor& z, int64_t local_group,
                                     int64_t slot0) {
  kern::gated_norm_sumsq(static_cast<float*>(ss.raw()), ss.cols(), mat(x), mat(z), local_group, slot0, m_compute);
}

void CudaBackend::k_gated_rmsnorm_apply(const Tensor& y, const Tensor& x, const Tensor& z, const Tensor& w,
                                        const Tensor& ss, float eps, int64_t local_group, int64_t total_group,
                                        int64_t slot0) {
  kern::gated_rmsnorm_apply(mat(y), mat(x), mat(z), mat(w), static_cast<const float*>(ss.raw()), ss.cols(), eps,
                      local_group, total_group, slot0, m_compute);
}

// ---------------------------------------------------------------- training

void CudaBackend::k_matmul_dx(const Tensor& dx, const Tensor& dy, const Tensor& w, bool accumulate) {
  gemm(dy.rows(), w.cols(), dy.cols(), dy, false, w, false, dx, 1.0f, accumulate ? 1.0f : 0.0f);
}

void CudaBackend::k_matmul_dw(const Tensor& dw, const Tensor& dy, const Tensor& x, bool accumulate) {
  gemm(dy.cols(), x.cols(), dy.rows(), dy, true, x, false, dw, 1.0f, accumulate ? 1.0f : 0.0f);
}

// The batch's tokens grouped by value on the host (each distinct token, where
// its rows start in `order`, the rows), so every table row has one writer.
void CudaBackend::k_embedding_backward(const Tensor& dtable, const Tensor& dy, std::span<const int32_t> tokens) {
  std::vector<int32_t> order(tokens.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return tokens[size_t(a)] < tokens[size_t(b)]; });
  std::vector<int32_t> uniq, offsets;
  for (size_t i = 0; i < order.size(); ++i)
    if (i == 0 || tokens[size_t(order[i])] != tokens[size_t(order[i - 1])]) {
      uniq.push_back(tokens[size_t(order[i])]);
      offsets.push_back(int32_t(i));
    }
  offsets.push_back(int32_t(order.size()));
  kern::embedding_backward(mat(dtable), mat(dy), device_copy(std::span<const int32_t>(uniq)),
                           device_copy(std::span<const int32_t>(offsets)), device_copy(std::span<const int32_t>(order)),
                           int64_t(uniq.size()), m_compute);
}

void CudaBackend::k_bias_backward(const Tensor& db, const Tensor& dy) {
  kern::bias_backward(static_cast<float*>(db.raw()), mat(dy), m_compute);
}

void CudaBackend::k_rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                                     const Tensor& w, float eps, int64_t group) {
  kern::rmsnorm_backward(mat(dx), mat(dw), mat(dy), mat(x), mat(w), eps, group, *m_scratch, m_compute);
}

void CudaBackend::k_silu_mul_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dy, const Tensor& gate,
                                      const Tensor& up) {
  kern::silu_mul_backward(mat(dgate), mat(dup), mat(dy), mat(gate), mat(up), m_compute);
}

void CudaBackend::k_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                                       const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                       const Tensor& lse, const AttentionArgs& a) {
  AttnShape s;
  s.Tq = q.rows();
  s.Tk = k.rows();
  s.n_heads = a.n_heads;
  s.n_kv_heads = a.n_kv_heads;
  s.head_dim = a.head_dim;
  s.scale = a.scale;
  kern::attention_backward(mat(dq), mat(dk), mat(dv), mat(dout), mat(q), mat(k), mat(v), mat(o),
                           static_cast<const float*>(lse.raw()), s, device_copy(a.q_pos), device_copy(a.k_pos),
                           *m_scratch, m_compute);
}

void CudaBackend::k_cross_entropy(const Tensor& logits, const Tensor& loss, std::span<const int32_t> targets,
                                  float scale) {
  kern::cross_entropy(mat(logits), static_cast<float*>(loss.raw()), device_copy(targets), scale, m_compute);
}

void CudaBackend::k_sum_squares(const Tensor& out, const Tensor& t) {
  kern::sum_squares(static_cast<float*>(out.raw()), mat(t), false, *m_scratch, m_compute);
}

void CudaBackend::k_count_nonfinite(const Tensor& out, const Tensor& t) {
  kern::sum_squares(static_cast<float*>(out.raw()), mat(t), true, *m_scratch, m_compute);
}

void CudaBackend::k_conv1d_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dstate,
                                    const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& b,
                                    const Tensor& state, bool silu) {
  kern::conv1d_backward(mat(dx), mat(dw), mat(db), mat(dstate), mat(dy), mat(x), mat(w), mat(b), mat(state), silu,
                        *m_scratch, m_compute);
}

namespace {
ScanGradsDev scan_grads(const Tensor& dx, const Tensor& ddt, const Tensor& dz, const Tensor& dB, const Tensor& dC,
                        const Tensor& d_dt_bias, const Tensor& dA_log, const Tensor& dD, const Tensor& dstate_out,
                        const Tensor& dstate_in) {
  ScanGradsDev g;
  g.dx = mat(dx);
  g.ddt = mat(ddt);
  g.dz = mat(dz);
  g.dB = mat(dB);
  g.dC = mat(dC);
  g.d_dt_bias = mat(d_dt_bias);
  g.dA_log = mat(dA_log);
  g.dD = mat(dD);
  g.dstate_out = f32_ptr(dstate_out);
  g.dstate_in = f32_ptr(dstate_in);
  return g;
}
}  // namespace

void CudaBackend::k_ssd_scan_backward(const SsdArgs& a, const Tensor& dy, const SsdGrads& g) {
  kern::ssd_scan_backward(ssd_args(a), mat(dy),
                          scan_grads(g.dx, g.ddt, Tensor{}, g.dB, g.dC, g.d_dt_bias, g.dA_log, g.dD, g.dstate_out,
                                     g.dstate_in),
                          *m_scratch, m_compute);
}

void CudaBackend::k_selective_scan_backward(const SelectiveScanArgs& a, const Tensor& dy, const SelectiveGrads& g) {
  kern::selective_scan_backward(selective_args(a), mat(dy),
                                scan_grads(g.dx, g.ddt, g.dz, g.dB, g.dC, g.d_dt_bias, g.dA_log, g.dD, g.dstate_out,
                                           g.dstate_in),
                                a.chunk, *m_scratch, m_compute);
}

void CudaBackend::k_gated_rmsnorm_backward(const Tensor& dx, const Tensor& dz, const Tensor& dw, const Tensor& dy,
                                           const Tensor& x, const Tensor& z, const Tensor& w, float eps,
                                           int64_t group) {
  kern::gated_rmsnorm_backward(mat(dx), mat(dz), mat(dw), mat(dy), mat(x), mat(z), mat(w), eps, group, *m_scratch,
                               m_compute);
}

// The bias corrections on the host as the cpu takes them (float pow), so both step alike.
void CudaBackend::k_adamw(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m,
                          const Tensor& v, const AdamWArgs& a) {
  AdamWStep s;
  s.lr = a.lr;
  s.beta1 = a.beta1;
  s.beta2 = a.beta2;
  s.eps = a.eps;
  s.weight_decay = a.weight_decay;
  s.grad_scale = a.grad_scale;
  const float bc1 = 1.0f - std::pow(a.beta1, float(a.step)), bc2 = 1.0f - std::pow(a.beta2, float(a.step));
  s.step_size = a.lr / bc1;
  s.inv_bc2 = 1.0f / bc2;
  kern::adamw(mat(param), f32_ptr(master), mat(grad), f32_ptr(m), f32_ptr(v), param.numel(), s, m_compute);
}

}  // namespace ss::SS_CUDA_NS
