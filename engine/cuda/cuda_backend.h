// The cuda backend: device memory from a stream-ordered pool (every tensor
// still charged to its category by the allocator), cuBLAS GEMMs and the
// kernels of cuda/*.cu on a compute stream, a second stream for
// communication, and spans measured by CUDA events resolved in batches.
// A process per rank, on its GPU. Built twice (kernels.h says how): ss::cuda on a GPU,
// ss::cuda_emu on the host for the tests.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/backend.h"
#include "cuda/kernels.h"
#include "cuda/runtime.h"

namespace ss::SS_CUDA_NS {

// Kernel and transfer spans measured on the device: an event pair around
// each piece of work, turned into host-clock spans when the events are done
// (never a synchronisation per op). The communicator records its spans here too.
class SpanQueue {
 public:
  explicit SpanQueue(Recorder& rec, Stream reference_stream);
  ~SpanQueue();
  SpanQueue(const SpanQueue&) = delete;
  SpanQueue& operator=(const SpanQueue&) = delete;

  struct Pending {
    Event start = nullptr, end = nullptr;
    Recorder::Tag tag;
    StreamKind stream = StreamKind::Compute;
    const char* op = "";
    double flops = 0, bytes = 0;
    std::vector<int64_t> dims;
    std::vector<int> peers;
  };
  // An event recorded on `s` now (from the pool).
  Event mark(Stream s);
  void push(Pending p);
  // Records the spans of finished work, in order; with `wait`, all of them.
  void resolve(bool wait);

 private:
  int64_t host_ns(Event e) const;
  Recorder& m_rec;
  Event m_reference = nullptr;
  std::chrono::steady_clock::time_point m_reference_time;
  std::deque<Pending> m_pending;
  std::vector<Event> m_free;
};

// Waits for `s` where nothing can report (destructors, a failure unwinding):
// a failure left on the stream is the run's to report where the work that
// failed is waited for, not the teardown's.
void settle(Stream s) noexcept;

// The first failure of a communicator on a device: a call that failed, an
// operation its watchdog found late (it is set before the abort), or a
// transfer that failed on the stream after its call returned. A failed or
// aborted transfer ends without writing its output, and the kernels queued
// after it go on with what is there: so, as a sticky CUDA error fails every
// later call of its context, every read of results from the device throws
// it. A transfer's own failure reaches the communicator only when asked
// (NCCL's asynchronous error), so a read first asks every communicator of
// the device (`check`: each registers a probe).
class DeviceFailure {
 public:
  void set(const std::string& why);  // the first reason stays
  // `ask` asks a communicator for an asynchronous failure (and set()s it),
  // for as long as `owner` (the communicator's state) lives.
  void watch(std::weak_ptr<const void> owner, std::function<void()> ask);
  // The live communicators asked (with no lock of this held), then the
  // failure thrown.
  void check();

 private:
  struct Probe {
    std::weak_ptr<const void> owner;
    std::function<void()> ask;
  };
  std::mutex m_mutex;
  std::string m_why;
  std::vector<Probe> m_probes;
};

// A GPU as this process uses it: the device (made current), a compute and a
// communication stream, and the span queue both record into. Shared by the
// backend and the NCCL communicators, which a rank makes before its backend.
struct DeviceContext {
  DeviceContext(int device, Recorder& rec);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;
  int device = 0;
  Stream compute = nullptr, comm = nullptr;
  std::unique_ptr<SpanQueue> spans;
  std::shared_ptr<DeviceFailure> failure = std::make_shared<DeviceFailure>();  // its communicators hold it too
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(Allocator& alloc, Recorder& rec, std::shared_ptr<DeviceContext> ctx);
  // GPU `device` with a context of its own.
  CudaBackend(Allocator& alloc, Recorder& rec, int device = 0);
  ~CudaBackend() override;

  std::string_view kind() const override { return "cuda"; }
  std::string device_name() const override;
  int device() const { return m_ctx->device; }
  Stream compute_stream() const { return m_compute; }
  Stream comm_stream() const { return m_ctx->comm; }
  SpanQueue& spans() { return *m_ctx->spans; }
  // fp32 GEMMs on TF32 tensor cores (off: full fp32, as the cpu computes).
  void allow_tf32(bool on) { m_tf32 = on; }
  // Waits for every queued kernel and resolves their spans.
  void synchronize();

 protected:
  void execute(const char* op, double flops, double bytes, std::vector<int64_t> dims,
               const std::function<void()>& kernel, DType dtype) override;
  void* allocate_data(int64_t bytes) override;
  Buffer::FreeFn free_fn() const override;

  void k_upload(const Tensor& dst, const void* src, DType src_dtype) override;
  void k_download(const Tensor& src, float* dst) override;
  void k_fill(const Tensor& dst, float value) override;
  void k_matmul(const Tensor& y, const Tensor& x, const Tensor& w, bool accumulate) override;
  void k_matmul_group(std::span<const Tensor> ys, const Tensor& x, std::span<const Tensor> ws) override;
  void k_embedding(const Tensor& y, const Tensor& table, std::span<const int32_t> tokens) override;
  void k_rmsnorm(const Tensor& y, const Tensor& x, const Tensor& z, const Tensor& w, float eps,
                 int64_t group) override;
  void k_rope(const Tensor& x, int n_heads, int head_dim, std::span<const int32_t> pos,
              std::span<const double> inv_freq) override;
  void k_add_bias(const Tensor& y, const Tensor& b) override;
  void k_attention(const Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v, const AttentionArgs& a,
                   const Tensor& lse) override;
  void k_attention_merge(const Tensor& o, const Tensor& lse, const Tensor& o2, const Tensor& lse2, int n_heads,
                         int head_dim) override;
  void k_silu_mul(const Tensor& y, const Tensor& gate, const Tensor& up) override;
  void k_add(const Tensor& y, const Tensor& a, const Tensor& b) override;
  void k_copy(const Tensor& dst, const Tensor& src) override;
  void k_conv1d_causal(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& state,
                       bool silu) override;
  void k_ssd_scan(const SsdArgs& a) override;
  void k_selective_scan(const SelectiveScanArgs& a) override;
  int32_t k_argmax_row(const Tensor& x, int64_t row) override;
  void k_ssd_state_correction(const SsdArgs& a) override;
  void k_quantize(const Tensor& out, const Tensor& in, const QuantSpec& spec, uint64_t counter) override;
  void k_dequantize(const Tensor& out, const Tensor& in, const QuantSpec& spec, bool accumulate) override;
  void k_selective_state_correction(const SelectiveScanArgs& a) override;
  void k_ssd_state_advance(const Tensor& state, const Tensor& chunk_state, const Tensor& log_decay) override;
  void k_selective_state_advance(const Tensor& state, const Tensor& A_log, const Tensor& chunk_state,
                                 const Tensor& dt_sum) override;
  void k_gated_norm_sumsq(const Tensor& ss, const Tensor& x, const Tensor& z, int64_t local_group,
                          int64_t slot0) override;
  void k_gated_rmsnorm_apply(const Tensor& y, const Tensor& x, const Tensor& z, const Tensor& w, const Tensor& ss,
                             float eps, int64_t local_group, int64_t total_group, int64_t slot0) override;
  // Training (train_kernels.cu, attention_backward.cu, ssd_backward.cu, selective_backward.cu, conv1d.cu).
  void k_matmul_dx(const Tensor& dx, const Tensor& dy, const Tensor& w, bool accumulate) override;
  void k_matmul_dw(const Tensor& dw, const Tensor& dy, const Tensor& x, bool accumulate) override;
  void k_embedding_backward(const Tensor& dtable, const Tensor& dy, std::span<const int32_t> tokens) override;
  void k_bias_backward(const Tensor& db, const Tensor& dy) override;
  void k_rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                          float eps, int64_t group) override;
  void k_silu_mul_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dy, const Tensor& gate,
                           const Tensor& up) override;
  void k_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                            const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                            const AttentionArgs& a) override;
  void k_cross_entropy(const Tensor& logits, const Tensor& loss, std::span<const int32_t> targets,
                       float scale) override;
  void k_sum_squares(const Tensor& out, const Tensor& t) override;
  void k_count_nonfinite(const Tensor& out, const Tensor& t) override;
  void k_conv1d_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dstate, const Tensor& dy,
                         const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& state, bool silu) override;
  void k_ssd_scan_backward(const SsdArgs& a, const Tensor& dy, const SsdGrads& g) override;
  void k_selective_scan_backward(const SelectiveScanArgs& a, const Tensor& dy, const SelectiveGrads& g) override;
  void k_gated_rmsnorm_backward(const Tensor& dx, const Tensor& dz, const Tensor& dw, const Tensor& dy,
                                const Tensor& x, const Tensor& z, const Tensor& w, float eps, int64_t group) override;
  void k_adamw(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
               const AdamWArgs& a) override;

 private:
  // A copy of results to the host, after the compute stream's work; throws
  // a communicator's failure on this device (DeviceFailure).
  void read(void* dst, const void* src, int64_t bytes);
  // Row-major y[M,N] = alpha op(A) op(B) (+ beta y) on cuBLAS (column-major).
  void gemm(int64_t M, int64_t N, int64_t K, const Tensor& A, bool a_trans, const Tensor& B, bool b_trans,
            const Tensor& C, float alpha, float beta);
  // Host arrays the kernels read (positions, tokens, rotary frequencies),
  // copied to the device once per distinct content and kept for reuse.
  const void* device_copy(const void* host, int64_t bytes);
  template <class T>
  const T* device_copy(std::span<const T> v) {
    return static_cast<const T*>(device_copy(v.data(), int64_t(v.size_bytes())));
  }

  class DeviceScratch;
  struct CachedArray;
  std::shared_ptr<DeviceContext> m_ctx;
  Stream m_compute = nullptr;
  std::unique_ptr<Blas> m_blas;
  std::unique_ptr<DeviceScratch> m_scratch;
  std::vector<CachedArray> m_arrays;
  int32_t* m_argmax = nullptr;
  bool m_tf32 = false;
};

// A view as the kernels take it: 2-D as it is, anything else contiguous as one row.
Mat mat(const Tensor& t);

}  // namespace ss::SS_CUDA_NS
