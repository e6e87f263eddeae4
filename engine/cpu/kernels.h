// The cpu backend's kernels: OpenBLAS for GEMMs, the rest written here.
// Each has a float64 reference in tests/reference.h that it is checked against.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "core/backend.h"

namespace ss::cpu {

void matmul(const Tensor& y, const Tensor& x, const Tensor& w, bool accumulate);
// Training (gemm.cpp, train_kernels.cpp, attention_backward.cpp).
void matmul_dx(const Tensor& dx, const Tensor& dy, const Tensor& w, bool accumulate);
void matmul_dw(const Tensor& dw, const Tensor& dy, const Tensor& x, bool accumulate);
void embedding_backward(const Tensor& dtable, const Tensor& dy, std::span<const int32_t> tokens);
void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      float eps, int64_t group);
void bias_backward(const Tensor& db, const Tensor& dy);
void silu_mul_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dy, const Tensor& gate, const Tensor& up);
void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse, const AttentionArgs& a);
void cross_entropy(const Tensor& logits, const Tensor& loss, std::span<const int32_t> targets, float scale);
void sum_squares(const Tensor& out, const Tensor& t);
void count_nonfinite(const Tensor& out, const Tensor& t);
void conv1d_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dstate, const Tensor& dy,
                     const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& state, bool silu);
void ssd_scan_backward(const SsdArgs& a, const Tensor& dy, const SsdGrads& g);
void selective_scan_backward(const SelectiveScanArgs& a, const Tensor& dy, const SelectiveGrads& g);
void gated_rmsnorm_backward(const Tensor& dx, const Tensor& dz, const Tensor& dw, const Tensor& dy, const Tensor& x,
                            const Tensor& z, const Tensor& w, float eps, int64_t group);
void adamw(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
           const AdamWArgs& a);
void rmsnorm(const Tensor& y, const Tensor& x, const Tensor& z, const Tensor& w, float eps, int64_t group);
void rope(const Tensor& x, int n_heads, int head_dim, std::span<const int32_t> pos, std::span<const double> inv_freq);
void attention(const Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v, const AttentionArgs& a,
               const Tensor& lse);
void attention_merge(const Tensor& o, const Tensor& lse, const Tensor& o2, const Tensor& lse2, int n_heads,
                     int head_dim);
void conv1d_causal(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& state,
                   bool silu);
void ssd_scan(const SsdArgs& a);
void selective_scan(const SelectiveScanArgs& a);
void ssd_state_correction(const SsdArgs& a);
void selective_state_correction(const SelectiveScanArgs& a);
void gated_norm_sumsq(const Tensor& ss, const Tensor& x, const Tensor& z, int64_t local_group, int64_t slot0);
void gated_rmsnorm_apply(const Tensor& y, const Tensor& x, const Tensor& z, const Tensor& w, const Tensor& ss, float eps,
                         int64_t local_group, int64_t total_group, int64_t slot0);

// exp for the kernels' inner loops: plain arithmetic the compiler can
// vectorise (no libm call). Range reduction x = n ln2 + r in two parts
// (Cody-Waite), then the degree-5 minimax polynomial for e^r of the Cephes
// library's expf; about 1 ulp on [-87.3, 88.7], inputs clamped to it (so
// exp(-inf) is ~1e-38, not 0, which is harmless in a softmax).
inline float fast_exp(float x) {
  x = std::min(std::max(x, -87.33f), 88.72f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = r + r * r * p + 1.0f;
  const int32_t bits = (int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return e * scale;
}

inline float silu(float v) { return v / (1.0f + fast_exp(-v)); }
inline float softplus(float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); }

// Storage dtypes. Kernels read and write tensors in their own dtype (f32,
// bf16, f16) and compute in fp32: a row is used in place when it is f32 and
// widened into a per-thread scratch row (in L1/L2) otherwise; results are
// rounded once, to nearest even, when stored.
float* scratch(int slot, int64_t n);  // per thread, slots 0..7, grows as needed

// Row r of a 2-D tensor as fp32 (null for an undefined tensor).
inline const float* row_f32(const Tensor& t, int64_t r, int slot) {
  if (!t.defined()) return nullptr;
  if (t.dtype() == DType::F32) return t.data<float>() + r * t.ld();
  float* buf = scratch(slot, t.cols());
  widen(t.row_ptr(r), t.dtype(), t.cols(), buf);
  return buf;
}
// Where row r of `t` is computed in fp32: t's memory when f32, else scratch
// that store_row then rounds into t.
inline float* row_out(const Tensor& t, int64_t r, int slot) {
  return t.dtype() == DType::F32 ? t.data<float>() + r * t.ld() : scratch(slot, t.cols());
}
inline void store_row(const Tensor& t, int64_t r, const float* v) {
  if (t.dtype() != DType::F32) narrow(v, t.cols(), t.dtype(), t.row_ptr(r));
}
// A whole contiguous tensor (weights vectors: norms, A_log, D, biases) as fp32.
inline const float* vec_f32(const Tensor& t, int slot) {
  if (!t.defined()) return nullptr;
  if (t.dtype() == DType::F32) return t.data<float>();
  float* buf = scratch(slot, t.numel());
  widen(t.raw(), t.dtype(), t.numel(), buf);
  return buf;
}

// A whole 2-D (or contiguous 1-D) tensor as fp32 rows, for the scans, which
// walk their inputs by column: the tensor itself when f32, else a widened copy.
struct F32Rows {
  const float* p = nullptr;
  int64_t ld = 0;
  std::vector<float> own;
  explicit F32Rows(const Tensor& t);
  const float* row(int64_t r) const { return p + r * ld; }
  float operator[](int64_t i) const { return p[i]; }  // 1-D
};
// An output computed in fp32: the tensor's memory when f32, else a buffer
// (filled from the tensor when `read`, for outputs that are added to) that
// commit() rounds into the tensor.
struct F32Out {
  float* p = nullptr;
  int64_t ld = 0;
  std::vector<float> own;
  const Tensor t;  // the output (a view; more than 2-D contiguous ones flattened)
  F32Out(const Tensor& t, bool read);
  float* row(int64_t r) const { return p + r * ld; }
  void commit();
};

// Whether bf16 GEMMs run on the library's bf16 kernels here (see gemm.cpp).
bool bf16_gemm_available();

// C[M,N] (fp32, ldc) = alpha A B (+ C when accumulate) for bf16 tiles of the
// kernels (attention, the SSD scan): A [M,K] row-major (lda), or stored [K,M]
// and used transposed; B [K,N] row-major (ldb), or stored [N,K] and used
// transposed. Accumulates in fp32.
void tile_gemm_bf16(int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, bool a_transposed, const void* B,
                    int64_t ldb, bool b_transposed, float* C, int64_t ldc, float alpha, bool accumulate);

// Seconds for `count` calls of the GEMM library the backend uses for `dtype`
// (OpenBLAS sgemm for fp32 and fp16, oneDNN for bf16) on y[M,N] = x[M,K] w[N,K]^T,
// called directly: the bare baseline of `bench`.
double library_gemm_seconds(int64_t M, int64_t N, int64_t K, DType dtype, int count);

// Threads for the hand-written kernels and OpenBLAS (1 per MPI rank).
void set_threads(int n);
int threads();

}  // namespace ss::cpu
