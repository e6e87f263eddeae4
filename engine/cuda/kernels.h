// The cuda backend's kernels as host functions: one launcher per kernel,
// taking device pointers and the stream to run on. Each launcher checks its
// arguments (std::logic_error) and, on a GPU, the launch's error; the kernels
// live one family per file (*.cu). This header has no device code, so the
// backend (compiled by the host compiler) includes it.
//
// Compiled twice: by nvcc into the cuda backend (namespace ss::cuda), and by
// the host compiler with the thread-model emulator (cuda/emu/) into
// ss::cuda_emu, which the test suites run against the cpu backend.
#pragma once

#include <cstdint>

#include "core/dtype.h"

#ifndef SS_CUDA_NS
#error "SS_CUDA_NS names the build of the cuda backend (cuda or cuda_emu); engine/cuda/CMakeLists.txt sets it"
#endif

namespace ss::SS_CUDA_NS {

using Stream = void*;  // a cudaStream_t

// A row-major 2-D view of device memory: `rows` rows of `cols` values of
// `dt`, row r at p + r * ld values. A 1-D vector is one row. p null: absent.
struct Mat {
  void* p = nullptr;
  int64_t rows = 0, cols = 0, ld = 0;
  DType dt = DType::F32;
  bool defined() const { return p != nullptr; }
};

// Device scratch the launchers may use for their intermediates: `slot`
// identifies a buffer that grows to `bytes` and stays valid until the next
// call with the same slot (kernels on one stream run in order, so reusing it
// for the next launch is safe).
class Scratch {
 public:
  virtual ~Scratch() = default;
  virtual void* get(int slot, int64_t bytes) = 0;
  // `count` ints, zero when handed out, that the kernels using them leave at
  // zero (tickets: the last block of a group to finish finishes the group).
  virtual int* counters(int64_t count) = 0;
};
enum ScratchSlot : int {
  kScratchAttention = 0,
  kScratchScan,
  kScratchScan2,
  kScratchScan3,
  kScratchReduce,
  kScratchGrad,
  kScratchGrad2,
  kScratchGrad3,
  kScratchSlots
};

// ---- gemv.cu: y (+)= x w^T for 1 to 4 rows of x (decode), where gemv_fits
// (one dtype, 16-byte aligned rows, K a whole number of 16-byte pieces).
bool gemv_fits(const Mat& y, const Mat& x, const Mat& w);
void gemv(const Mat& y, const Mat& x, const Mat& w, bool accumulate, Stream s);
// ys[i] (+)= x ws[i]^T, i < count, for up to kMaxGemvGroup products of one
// x, in one launch (nvcc builds this header as C++17: no std::span).
constexpr int kMaxGemvGroup = 4;
void gemv_group(const Mat* ys, const Mat& x, const Mat* ws, int count, bool accumulate, Stream s);

// ---- elementwise.cu
void fill(const Mat& y, float value, Stream s);
// Uniform values in [-scale, scale) from a counter hash of (seed, index): weights made on the device (bench).
void fill_random(const Mat& y, uint64_t seed, float scale, Stream s);
void convert(const Mat& dst, const Mat& src, Stream s);  // any dtypes, same shape, strided rows
void add(const Mat& y, const Mat& a, const Mat& b, Stream s);
void add_bias(const Mat& y, const Mat& bias, Stream s);
void silu_mul(const Mat& y, const Mat& gate, const Mat& up, Stream s);
void embedding(const Mat& y, const Mat& table, const int32_t* tokens, Stream s);
// dst[c] = the sum over r < rows of src[r * count + c] (contiguous, one dtype),
// in fp32, rounded once: how the communicator reduces 16-bit buffers.
void sum_rows(void* dst, const void* src, int rows, int64_t count, DType dt, Stream s);
// out[0] = the column of row `row`'s largest value (the first of equal ones).
void argmax_row(const Mat& x, int64_t row, int32_t* out, Stream s);
// state[h, :] = exp(log_decay[h]) state[h, :] + chunk[h, :] (fp32, H rows of `per`).
void ssd_state_advance(float* state, const float* chunk, const float* log_decay, int64_t H, int64_t per, Stream s);
// state[c, n] = exp(-exp(A_log[c, n]) dt_sum[c]) state[c, n] + chunk[c, n].
void selective_state_advance(float* state, const Mat& A_log, const float* chunk, const float* dt_sum, int64_t C,
                             int64_t N, Stream s);

// ---- norm.cu
// RMSNorm per group of columns, with z the Mamba2 gated form rmsnorm(x silu(z)); w may be absent.
void rmsnorm(const Mat& y, const Mat& x, const Mat& z, const Mat& w, float eps, int64_t group, Stream s);
void gated_norm_sumsq(float* ss, int64_t slots, const Mat& x, const Mat& z, int64_t local_group, int64_t slot0,
                      Stream s);
void gated_rmsnorm_apply(const Mat& y, const Mat& x, const Mat& z, const Mat& w, const float* ss, int64_t slots,
                         float eps, int64_t local_group, int64_t total_group, int64_t slot0, Stream s);

// ---- rope.cu: in place, rotate-half pairs (i, i + hd/2) turned by pos[t] * inv_freq[i].
void rope(const Mat& x, int n_heads, int head_dim, const int32_t* pos, const double* inv_freq, Stream s);

// ---- attention.cu
struct AttnShape {
  int64_t Tq = 0, Tk = 0;
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 0;
};
// Causal attention by position (key j visible to query i iff k_pos[j] <=
// q_pos[i]), blockwise with an online softmax; lse [Tq, n_heads] optional.
void attention(const Mat& o, const Mat& q, const Mat& k, const Mat& v, const AttnShape& a, const int32_t* q_pos,
               const int32_t* k_pos, float* lse, Scratch& scratch, Stream s);
void attention_merge(const Mat& o, float* lse, const Mat& o2, const float* lse2, int n_heads, int head_dim,
                     Stream s);

// ---- conv1d.cu: depthwise causal conv; state [K-1, C] (optional) read as
// the rows before x, then overwritten with the last K-1 input rows.
void conv1d_causal(const Mat& y, const Mat& x, const Mat& w, const Mat& b, const Mat& state, bool silu, Stream s);

// ---- ssd_scan.cu: Mamba2's SSD scan (core/backend.h's SsdArgs as device views).
struct SsdDev {
  Mat y, x, dt, dt_bias, A_log, D, B, C;
  float* state = nullptr;      // [n_heads, head_dim, d_state]: read as S_-1, overwritten with S_T-1; null: zero, not kept
  float* log_decay = nullptr;  // [n_heads] out (optional): sum_t dt_t A_h
  int n_heads = 0, head_dim = 0, n_groups = 0, d_state = 0;
  float dt_min = 0, dt_max = 0;
};
void ssd_scan(const SsdDev& a, Scratch& scratch, Stream s);
// y_t += e^{cum_t} C_t S^T for the incoming state S (sequence-parallel state passing).
void ssd_state_correction(const SsdDev& a, Scratch& scratch, Stream s);

// ---- selective_scan.cu: Mamba's selective scan (SelectiveScanArgs as device views).
struct SelectiveDev {
  Mat y, x, dt, z, dt_bias, D, A_log, B, C;  // z optional
  float* state = nullptr;   // [channels, d_state], like SsdDev::state
  float* dt_sum = nullptr;  // [channels] out (optional)
  int64_t d_state = 0;
};
void selective_scan(const SelectiveDev& a, Stream s);
void selective_state_correction(const SelectiveDev& a, Stream s);

// ---- quantize.cu (comm/quantize.h's formats, byte for byte)
struct QuantArgs {
  Precision precision = Precision::FP32;
  int64_t block = 128;
  bool stochastic = false;
  uint64_t seed = 0;
};
void quantize(const Mat& in, int64_t n, const QuantArgs& q, uint64_t counter, uint8_t* out, Stream s);
void dequantize(const uint8_t* in, int64_t n, const QuantArgs& q, const Mat& out, bool accumulate, Stream s);

// ---- training: backward kernels and the optimizer. Gradients are written
// or, where said, added, in their tensors' dtypes (sums in fp32 or double).
// train_kernels.cu:
// dtable[uniq[j]] += the rows order[offsets[j] .. offsets[j + 1]) of dy (the
// batch's tokens grouped by value on the host: deterministic, no atomics).
void embedding_backward(const Mat& dtable, const Mat& dy, const int32_t* uniq, const int32_t* offsets,
                        const int32_t* order, int64_t n_uniq, Stream s);
// RMSNorm per group: dx += dL/dx; dw += dL/dw when dw is given.
void rmsnorm_backward(const Mat& dx, const Mat& dw, const Mat& dy, const Mat& x, const Mat& w, float eps, int64_t group,
                      Scratch& scratch, Stream s);
// Gated RMSNorm: dx, dz written; dw added.
void gated_rmsnorm_backward(const Mat& dx, const Mat& dz, const Mat& dw, const Mat& dy, const Mat& x, const Mat& z,
                            const Mat& w, float eps, int64_t group, Scratch& scratch, Stream s);
void bias_backward(float* db, const Mat& dy, Stream s);  // db[n] += sum_t dy[t, n]
void silu_mul_backward(const Mat& dgate, const Mat& dup, const Mat& dy, const Mat& gate, const Mat& up, Stream s);
// In place over fp32 logits: row r becomes scale (softmax - onehot(target)), loss[r] = lse - logit[target].
void cross_entropy(const Mat& logits, float* loss, const int32_t* targets, float scale, Stream s);
// out[0] += the sum of squares of t's values (or, with `nonfinite`, how many are inf or NaN).
void sum_squares(float* out, const Mat& t, bool nonfinite, Scratch& scratch, Stream s);
struct AdamWStep {
  float lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0, grad_scale = 1;
  float step_size = 0, inv_bc2 = 0;  // lr / (1 - beta1^step), 1 / (1 - beta2^step): taken on the host as the cpu does
};
// On fp32 values: `master` when the parameter is 16-bit (the parameter gets it rounded), else the parameter.
void adamw(const Mat& param, float* master, const Mat& grad, float* m, float* v, int64_t n, const AdamWStep& a,
           Stream s);
// conv1d.cu: dx written; dw, db added; dstate (optional) the state rows' gradient.
void conv1d_backward(const Mat& dx, const Mat& dw, const Mat& db, const Mat& dstate, const Mat& dy, const Mat& x,
                     const Mat& w, const Mat& b, const Mat& state, bool silu, Scratch& scratch, Stream s);
// attention_backward.cu: from the forward's output and fp32 lse; dq, dk, dv written.
void attention_backward(const Mat& dq, const Mat& dk, const Mat& dv, const Mat& dout, const Mat& q, const Mat& k,
                        const Mat& v, const Mat& o, const float* lse, const AttnShape& a, const int32_t* q_pos,
                        const int32_t* k_pos, Scratch& scratch, Stream s);
// ssd_backward.cu and selective_backward.cu (core/backend.h's SsdGrads, SelectiveGrads).
struct ScanGradsDev {
  Mat dx, ddt, dz, dB, dC;          // written (dz: selective only)
  Mat d_dt_bias, dA_log, dD;        // added
  const float* dstate_out = nullptr;  // in, optional: the final state's gradient
  float* dstate_in = nullptr;         // out, optional: the initial state's
};
void ssd_scan_backward(const SsdDev& a, const Mat& dy, const ScanGradsDev& g, Scratch& scratch, Stream s);
void selective_scan_backward(const SelectiveDev& a, const Mat& dy, const ScanGradsDev& g, int64_t chunk,
                             Scratch& scratch, Stream s);

}  // namespace ss::SS_CUDA_NS
