// The Backend: allocation, host transfer and every kernel the models use.
//
// Model and strategy code calls the public methods below and nothing else. The
// base class checks shapes and counts FLOPs and bytes once, for every backend;
// `execute` then runs the backend's kernel (cpu, cuda) and records its span, or
// (sim) advances a virtual clock by a cost model without touching data.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/allocator.h"
#include "core/attention_run.h"
#include "core/tensor.h"
#include "core/trace.h"
#include "core/dtype.h"

namespace ss {

struct AttentionArgs {
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 0;
  std::span<const int32_t> q_pos, k_pos;  // absolute positions: key j is visible to query i iff k_pos[j] <= q_pos[i]
};

// Mamba2 SSD scan over T tokens (Dao & Gu 2024, "Transformers are SSMs", §6):
// per head h with group g = h / (n_heads / n_groups):
//   dt_t = softplus(dt_raw_t + dt_bias_h) clamped to [dt_min, dt_max], a_t = dt_t * A_h, A_h = -exp(A_log_h)
//   S_t = exp(a_t) S_{t-1} + dt_t x_t B_t^T          (S: head_dim x d_state)
//   y_t = S_t C_t + D_h x_t
// computed chunk by chunk with GEMMs. `state` (n_heads x head_dim x d_state)
// is read as S_{-1} and overwritten with S_{T-1}; undefined means zero and not kept.
struct SsdArgs {
  Tensor y, x;          // [T, n_heads*head_dim]
  Tensor dt;            // [T, n_heads], before bias and softplus
  Tensor dt_bias, A_log, D;  // [n_heads]
  Tensor B, C;          // [T, n_groups*d_state]
  Tensor state;         // [n_heads, head_dim, d_state] or undefined
  Tensor log_decay;     // out, optional [n_heads]: sum_t dt_t * A_h (the chunk's total log decay)
  int n_heads = 0, head_dim = 0, n_groups = 0, d_state = 0, chunk = 256;
  float dt_min = 0, dt_max = INFINITY;
};

// Mamba (v1) selective scan (Gu & Dao 2023, Alg. 2), per channel c:
//   dt = softplus(dt_raw + dt_bias_c); h_t = exp(dt A_c) ∘ h_{t-1} + dt B_t x_t
//   y_t = (h_t · C_t + D_c x_t) * silu(z_t)          (h: d_state per channel)
// `state` (channels x d_state) is read and overwritten like SsdArgs::state.
struct SelectiveScanArgs {
  Tensor y, x, dt, z;   // [T, channels]; z may be undefined (no gate)
  Tensor dt_bias, D;    // [channels]
  Tensor A_log;         // [channels, d_state]
  Tensor B, C;          // [T, d_state]
  Tensor state;         // [channels, d_state] or undefined
  Tensor dt_sum;        // out, optional [channels]: sum_t dt_t (the chunk's decay is exp(A * dt_sum))
  int chunk = 256;      // the backward's checkpoint interval (states kept at chunk starts)
};

// Gradients of ssd_scan (SsdArgs's inputs, its `state` the initial state):
// dx, ddt (of the raw dt, before bias and softplus), dB, dC are written;
// the per-head parameters' gradients are added. dstate_out (optional, in)
// is the gradient of the final state; dstate_in (optional, out) receives
// the gradient of the initial state (sequence parallelism's state passing).
struct SsdGrads {
  Tensor dx, ddt, dB, dC;
  Tensor d_dt_bias, dA_log, dD;
  Tensor dstate_out, dstate_in;  // fp32 [n_heads, head_dim, d_state]
};

// Gradients of selective_scan, like SsdGrads: dx, ddt (raw dt), dz, dB, dC
// written; d_dt_bias [channels], dA_log [channels, d_state], dD added;
// dstate_out / dstate_in the final and initial states' (fp32 [channels, d_state]).
struct SelectiveGrads {
  Tensor dx, ddt, dz, dB, dC;
  Tensor d_dt_bias, dA_log, dD;
  Tensor dstate_out, dstate_in;
};

// One AdamW step (Loshchilov & Hutter 2019, decoupled weight decay) on one
// parameter tensor, with the bias corrections of Kingma & Ba (2015):
//   g = grad_scale * grad;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * (m / (1 - b1^step) / (sqrt(v / (1 - b2^step)) + eps) + weight_decay * p)
// grad_scale carries the clipping factor (and any averaging).
struct AdamWArgs {
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0, grad_scale = 1;
  int64_t step = 1;
};

class Backend {
 public:
  Backend(Allocator& alloc, Recorder& rec) : m_alloc(alloc), m_rec(rec) {}
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual std::string_view kind() const = 0;      // cpu, cuda, sim
  virtual std::string device_name() const = 0;
  virtual bool has_data() const { return true; }  // false: meta tensors (sim)

  Allocator& allocator() { return m_alloc; }
  Recorder& recorder() { return m_rec; }

  // An accounted tensor (uninitialised). Throws OomError over capacity.
  Tensor alloc(const Shape& shape, Category cat, std::string label, DType dtype = DType::F32);

  // Host transfers (contiguous tensors; `src` is dtype `src_dtype`, converted to the tensor's dtype).
  void upload(const Tensor& dst, const void* src, DType src_dtype);
  void download(const Tensor& src, float* dst);  // any float dtype, widened
  void fill(const Tensor& dst, float value);

  // y[M,N] = x[M,K] · w[N,K]^T (+ y when accumulate). Rows may be strided.
  void matmul(const Tensor& y, const Tensor& x, const Tensor& w, bool accumulate = false);
  // ys[i] = x · ws[i]^T for weights that share their input (q, k and v; gate
  // and up): one "gemm" span [M, sum of N_i, K], as a fused projection would
  // record. A few rows (decode) read every weight in one pass on the cpu.
  void matmul_group(std::span<const Tensor> ys, const Tensor& x, std::span<const Tensor> ws);
  // y[T,d] = table[tokens[t], :]
  void embedding(const Tensor& y, const Tensor& table, std::span<const int32_t> tokens);
  // RMSNorm per row over groups of `group` columns (group = cols for plain RMSNorm); w may be undefined.
  void rmsnorm(const Tensor& y, const Tensor& x, const Tensor& w, float eps, int64_t group);
  // Mamba2 gated norm (norm_before_gate = False): rmsnorm(x * silu(z)) per group, times w.
  void gated_rmsnorm(const Tensor& y, const Tensor& x, const Tensor& z, const Tensor& w, float eps,
                     int64_t group);
  // Rotary embedding in place on x[T, n_heads*head_dim], rotate-half pairing
  // (i, i + head_dim/2) turned by pos * inv_freq[i] (head_dim/2 frequencies,
  // ModelConfig::rope_inv_freq).
  void rope(const Tensor& x, int n_heads, int head_dim, std::span<const int32_t> pos, std::span<const double> inv_freq);
  // Causal attention by position, blockwise with an online softmax (never a T×T matrix).
  // o[Tq, nh*hd]; lse[Tq, nh] (optional) receives each row's log-sum-exp for merging partials.
  void attention(const Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v,
                 const AttentionArgs& a, const Tensor& lse = {});
  // Merges a second partial attention (o2, lse2) into (o, lse): softmax over the union of keys.
  void attention_merge(const Tensor& o, const Tensor& lse, const Tensor& o2, const Tensor& lse2,
                       int n_heads, int head_dim);
  // y = silu(gate) * up
  void silu_mul(const Tensor& y, const Tensor& gate, const Tensor& up);
  // y = a + b (y may alias a)
  void add(const Tensor& y, const Tensor& a, const Tensor& b);
  // y[t, :] += b for every row of y[T, N]; b [N] (a projection's bias).
  void add_bias(const Tensor& y, const Tensor& b);
  void copy(const Tensor& dst, const Tensor& src);
  // Depthwise causal conv over time: x[T,C], w[C,K], b[C] (optional). `state`
  // [K-1, C] holds the K-1 inputs before x (zeros if undefined) and is
  // overwritten with the last K-1 inputs. Applies SiLU when `silu`.
  void conv1d_causal(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b,
                     const Tensor& state, bool silu);
  void ssd_scan(const SsdArgs& a);
  void selective_scan(const SelectiveScanArgs& a);
  // Sequence-parallel state passing (ranks as SSD chunks). Correction: adds to
  // a.y the contribution of the incoming state a.state to tokens scanned from a
  // zero state: y_t += e^{cum_t} C_t S^T (Mamba2), or
  // y_t += silu(z_t) * sum_n C_t[n] e^{A[c][n] cumdt_t[c]} S[c][n] (Mamba).
  void ssd_state_correction(const SsdArgs& a);
  void selective_state_correction(const SelectiveScanArgs& a);
  // Advance: state = decay * state + chunk_state, the decay from the chunk's
  // log_decay [heads] (Mamba2) or exp(A * dt_sum) per channel and state (Mamba).
  void ssd_state_advance(const Tensor& state, const Tensor& chunk_state, const Tensor& log_decay);
  void selective_state_advance(const Tensor& state, const Tensor& A_log, const Tensor& chunk_state,
                               const Tensor& dt_sum);
  // Gated RMSNorm whose groups span ranks: per-row sums of squares of
  // x*silu(z) per local group into columns [slot0, slot0 + groups) of ss
  // [T, total groups] (other columns zeroed) ...
  void gated_norm_sumsq(const Tensor& ss, const Tensor& x, const Tensor& z, int64_t local_group, int64_t slot0);
  // ... and, after the sums are all-reduced, y = x*silu(z) / sqrt(ss/total_group + eps) * w.
  void gated_rmsnorm_apply(const Tensor& y, const Tensor& x, const Tensor& z, const Tensor& w, const Tensor& ss,
                           float eps, int64_t local_group, int64_t total_group, int64_t slot0);
  // Block quantization for communication (comm/quantize.h): `in` (contiguous
  // f32) into the bytes of `out`, a contiguous f32 carrier of at least
  // quantized_bytes(n) bytes; and back, adding into `out` when accumulate.
  void quantize(const Tensor& out, const Tensor& in, const QuantSpec& spec, uint64_t counter);
  void dequantize(const Tensor& out, const Tensor& in, const QuantSpec& spec, bool accumulate);
  // Index of the largest value in row `row` of a 2-D tensor (greedy decoding).
  int32_t argmax_row(const Tensor& x, int64_t row);

  // ---- Training: backward kernels and the optimizer (core/backend_train.cpp).
  // Gradients are written (=) or, where said, added (+=) into their tensors.
  // matmul's data gradient: dx[M,K] = dy[M,N] · w[N,K] (+ dx when accumulate).
  void matmul_dx(const Tensor& dx, const Tensor& dy, const Tensor& w, bool accumulate);
  // matmul's weight gradient: dw[N,K] = dy[M,N]^T · x[M,K] (+ dw when accumulate).
  void matmul_dw(const Tensor& dw, const Tensor& dy, const Tensor& x, bool accumulate);
  // A bias's gradient: db[n] += sum over rows t of dy[t, n] (db fp32, [N]).
  void bias_backward(const Tensor& db, const Tensor& dy);
  // dtable[tokens[t], :] += dy[t, :].
  void embedding_backward(const Tensor& dtable, const Tensor& dy, std::span<const int32_t> tokens);
  // RMSNorm (per group of columns): dx += ∂L/∂x; dw += ∂L/∂w when w is defined.
  void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                        float eps, int64_t group);
  // Rotary embedding's backward in place on dx: the inverse rotation.
  void rope_backward(const Tensor& dx, int n_heads, int head_dim, std::span<const int32_t> pos,
                     std::span<const double> inv_freq);
  // y = silu(gate) * up: dgate = ∂L/∂gate, dup = ∂L/∂up.
  void silu_mul_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dy, const Tensor& gate,
                         const Tensor& up);
  // Causal attention's backward from the forward's o and log-sum-exp (the
  // flash-style backward: block scores recomputed, never a Tq×Tk matrix).
  // dq is written; dk and dv [Tk, kv heads*hd] are written with the
  // gradient from these queries (summed over the heads sharing a kv head).
  void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                          const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                          const AttentionArgs& a);
  // Softmax cross-entropy over fp32 logits [R, V], in place: row r becomes
  // scale * (softmax(row) - onehot(targets[r])) and loss[r] = lse - row[target]
  // (fp32 [R]). A target < 0 leaves a zero row and a zero loss.
  void cross_entropy(const Tensor& logits, const Tensor& loss, std::span<const int32_t> targets, float scale);
  // Depthwise causal conv's backward (conv1d_causal with `state` the rows
  // before x, zeros when undefined): dx written; dw [C, K] and db added;
  // dstate (optional) receives the gradient of the state rows.
  void conv1d_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dstate, const Tensor& dy,
                       const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& state, bool silu);
  void ssd_scan_backward(const SsdArgs& a, const Tensor& dy, const SsdGrads& g);
  void selective_scan_backward(const SelectiveScanArgs& a, const Tensor& dy, const SelectiveGrads& g);
  // Gated RMSNorm's backward (y = rmsnorm(x silu(z)) w per group): dx, dz written, dw added.
  void gated_rmsnorm_backward(const Tensor& dx, const Tensor& dz, const Tensor& dw, const Tensor& dy, const Tensor& x,
                              const Tensor& z, const Tensor& w, float eps, int64_t group);
  // out[0] (fp32) += the sum of squares of t (any dtype, any shape, contiguous).
  void sum_squares(const Tensor& out, const Tensor& t);
  // out[0] (fp32) += how many values of t are infinite or NaN.
  void count_nonfinite(const Tensor& out, const Tensor& t);
  void adamw(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
             const AdamWArgs& a);

 protected:
  // Runs (or, for sim, costs) one kernel and records its span. `dtype` is the
  // dtype its arithmetic runs in (GEMM-shaped kernels: the operands'), which
  // picks the simulator's matmul rate.
  virtual void execute(const char* op, double flops, double bytes, std::vector<int64_t> dims,
                       const std::function<void()>& kernel, DType dtype = DType::F32);
  virtual void* allocate_data(int64_t bytes) = 0;
  virtual Buffer::FreeFn free_fn() const = 0;

  // Kernels: each backend with data implements all of them; the defaults
  // throw (a meta backend never runs a kernel).
  virtual void k_upload(const Tensor& dst, const void* src, DType src_dtype);
  virtual void k_download(const Tensor& src, float* dst);
  virtual void k_fill(const Tensor& dst, float value);
  virtual void k_matmul(const Tensor& y, const Tensor& x, const Tensor& w, bool accumulate);
  // Default: k_matmul of each pair.
  virtual void k_matmul_group(std::span<const Tensor> ys, const Tensor& x, std::span<const Tensor> ws);
  virtual void k_embedding(const Tensor& y, const Tensor& table, std::span<const int32_t> tokens);
  virtual void k_rmsnorm(const Tensor& y, const Tensor& x, const Tensor& z, const Tensor& w,
                         float eps, int64_t group);
  virtual void k_rope(const Tensor& x, int n_heads, int head_dim, std::span<const int32_t> pos,
                      std::span<const double> inv_freq);
  virtual void k_attention(const Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v,
                           const AttentionArgs& a, const Tensor& lse);
  virtual void k_attention_merge(const Tensor& o, const Tensor& lse, const Tensor& o2,
                                 const Tensor& lse2, int n_heads, int head_dim);
  virtual void k_silu_mul(const Tensor& y, const Tensor& gate, const Tensor& up);
  virtual void k_add(const Tensor& y, const Tensor& a, const Tensor& b);
  virtual void k_add_bias(const Tensor& y, const Tensor& b);
  virtual void k_copy(const Tensor& dst, const Tensor& src);
  virtual void k_conv1d_causal(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b,
                               const Tensor& state, bool silu);
  virtual void k_ssd_scan(const SsdArgs& a);
  virtual void k_selective_scan(const SelectiveScanArgs& a);
  virtual int32_t k_argmax_row(const Tensor& x, int64_t row);
  virtual void k_quantize(const Tensor& out, const Tensor& in, const QuantSpec& spec, uint64_t counter);
  virtual void k_dequantize(const Tensor& out, const Tensor& in, const QuantSpec& spec, bool accumulate);
  virtual void k_ssd_state_correction(const SsdArgs& a);
  virtual void k_selective_state_correction(const SelectiveScanArgs& a);
  virtual void k_ssd_state_advance(const Tensor& state, const Tensor& chunk_state, const Tensor& log_decay);
  virtual void k_selective_state_advance(const Tensor& state, const Tensor& A_log, const Tensor& chunk_state,
                                         const Tensor& dt_sum);
  virtual void k_gated_norm_sumsq(const Tensor& ss, const Tensor& x, const Tensor& z, int64_t local_group,
                                  int64_t slot0);
  virtual void k_gated_rmsnorm_apply(const Tensor& y, const Tensor& x, const Tensor& z, const Tensor& w,
                                     const Tensor& ss, float eps, int64_t local_group, int64_t total_group,
                                     int64_t slot0);
  virtual void k_matmul_dx(const Tensor& dx, const Tensor& dy, const Tensor& w, bool accumulate);
  virtual void k_matmul_dw(const Tensor& dw, const Tensor& dy, const Tensor& x, bool accumulate);
  virtual void k_bias_backward(const Tensor& db, const Tensor& dy);
  virtual void k_embedding_backward(const Tensor& dtable, const Tensor& dy, std::span<const int32_t> tokens);
  virtual void k_rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                                  const Tensor& w, float eps, int64_t group);
  virtual void k_silu_mul_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dy, const Tensor& gate,
                                   const Tensor& up);
  virtual void k_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                                    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                    const Tensor& lse, const AttentionArgs& a);
  virtual void k_cross_entropy(const Tensor& logits, const Tensor& loss, std::span<const int32_t> targets,
                               float scale);
  virtual void k_sum_squares(const Tensor& out, const Tensor& t);
  virtual void k_conv1d_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dstate,
                                 const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& b,
                                 const Tensor& state, bool silu);
  virtual void k_ssd_scan_backward(const SsdArgs& a, const Tensor& dy, const SsdGrads& g);
  virtual void k_selective_scan_backward(const SelectiveScanArgs& a, const Tensor& dy, const SelectiveGrads& g);
  virtual void k_gated_rmsnorm_backward(const Tensor& dx, const Tensor& dz, const Tensor& dw, const Tensor& dy,
                                        const Tensor& x, const Tensor& z, const Tensor& w, float eps, int64_t group);
  virtual void k_count_nonfinite(const Tensor& out, const Tensor& t);
  virtual void k_adamw(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m,
                       const Tensor& v, const AdamWArgs& a);

  // Inside execute("attention", ...) of a backend without data: the call's
  // query runs, for the simulator's cost; empty elsewhere.
  std::span<const AttentionRun> attention_runs() const { return m_attention_runs; }

 private:
  Allocator& m_alloc;
  Recorder& m_rec;
  std::vector<AttentionRun> m_attention_runs;
};

}  // namespace ss
