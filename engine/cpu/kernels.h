// The cpu backend's kernels: OpenBLAS for GEMMs, the rest written here.
// Each has a float64 reference in tests/reference.h that it is checked against.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "core/backend.h"

namespace ss::cpu {

void matmul(const Tensor& y, const Tensor& x, const Tensor& w, bool accumulate);
// ys[i] = x · ws[i]^T: a few rows (decode) in one parallel pass over every
// weight's rows; otherwise matmul per weight.
void matmul_group(std::span<const Tensor> ys, const Tensor& x, std::span<const Tensor> ws);
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

// body(i) for i in [0, n): on the OpenMP threads when `parallel`, else on
// this thread without entering OpenMP at all. An OpenMP construct whose `if`
// clause is false still sets up a team of one, about 1 us here (a futex call
// on this virtual machine), which is what a one-row kernel of decode costs.
template <class F>
void parallel_for(int64_t n, bool parallel, F&& body) {
  if (!parallel || n < 2) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) body(i);
}

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

// fast_exp on eight lanes, the same operations in the same order.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33f)), _mm256_set1_ps(88.72f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 e = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(r, r), p, r), _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(e, _mm256_castsi256_ps(bits));
}
// The sum of eight lanes.
inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

// silu on eight lanes, as silu below: v / (1 + fast_exp(-v)).
inline __m256 silu8(__m256 v) {
  return _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), v))));
}
// Sum of x_i^2 in fp32, four 8-lane partial sums: a serial sum would wait on
// each add (these are most of a norm's time on a single row).
inline float sum_squares(const float* x, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
    const __m256 x2 = _mm256_loadu_ps(x + i + 16), x3 = _mm256_loadu_ps(x + i + 24);
    a0 = _mm256_fmadd_ps(x0, x0, a0);
    a1 = _mm256_fmadd_ps(x1, x1, a1);
    a2 = _mm256_fmadd_ps(x2, x2, a2);
    a3 = _mm256_fmadd_ps(x3, x3, a3);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(x + i), a0);
  float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; i < n; ++i) s += x[i] * x[i];
  return s;
}

inline float silu(float v) { return v / (1.0f + fast_exp(-v)); }
inline float softplus(float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); }

// y_i = silu(y_i).
inline void silu_in_place(float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, silu8(_mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] = silu(y[i]);
}
// y_i = silu(g_i) * u_i (y may alias g or u).
inline void silu_times(const float* g, const float* u, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(silu8(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
  for (; i < n; ++i) y[i] = silu(g[i]) * u[i];
}

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

// Whether the CPU runs AVX-512 (F, BW, DQ, VL): the kernels that have a
// 16-lane version take it then. SHARDSCOPE_NO_AVX512=1 says no on any CPU
// (to test the AVX2 versions).
bool cpu_has_avx512();

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
