// y = x · wᵀ (+ y) in every dtype the engine stores:
//  - fp32: OpenBLAS sgemm;
//  - bf16: oneDNN's matmul (its AVX512-BF16 kernel where the CPU has one),
//    accumulating in fp32, writing bf16 or fp32 (the logits) rounded once;
//  - fp16: widened to fp32 and sgemm (oneDNN's f16 matmul needs
//    AVX512-FP16, which this generation of CPUs lacks);
//  - a few rows (decode), any dtype: a GEMV-shaped kernel that streams each
//    weight row once in its own dtype (widened in registers), parallel over
//    output columns.
// The library choice stays in this file.
#include <cblas.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <immintrin.h>

#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>

#include "cpu/kernels.h"

namespace ss::cpu {
namespace {

// Rows up to which the GEMV path runs (each weight row is read once for all of them).
constexpr int64_t kGemvRows = 4;

// ---- oneDNN matmul, primitives cached per shape ----------------------------
struct DnnlKey {
  int64_t M, N, K, ldx, ldw, ldy;
  int dx, dw, dy;
  bool acc;
  auto tie() const { return std::tie(M, N, K, ldx, ldw, ldy, dx, dw, dy, acc); }
  bool operator<(const DnnlKey& o) const { return tie() < o.tie(); }
};

dnnl::memory::data_type dnnl_type(DType t) {
  switch (t) {
    case DType::BF16: return dnnl::memory::data_type::bf16;
    case DType::F16: return dnnl::memory::data_type::f16;
    default: return dnnl::memory::data_type::f32;
  }
}

struct Dnnl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{eng};
  std::mutex mutex;
  std::map<DnnlKey, std::pair<dnnl::matmul, dnnl::matmul::primitive_desc>> cache;
  static Dnnl& get() {
    static Dnnl d;
    return d;
  }
};

void dnnl_matmul(const Tensor& y, const Tensor& x, const Tensor& w, bool accumulate) {
  using dims = dnnl::memory::dims;
  const int64_t M = x.rows(), K = x.cols(), N = w.rows();
  Dnnl& d = Dnnl::get();
  const DnnlKey key{M, N, K, x.ld(), w.ld(), y.ld(), int(x.dtype()), int(w.dtype()), int(y.dtype()), accumulate};
  const dnnl::memory::desc xm(dims{M, K}, dnnl_type(x.dtype()), dims{x.ld(), 1});
  const dnnl::memory::desc wm(dims{K, N}, dnnl_type(w.dtype()), dims{1, w.ld()});  // w [N,K] read as wᵀ
  const dnnl::memory::desc ym(dims{M, N}, dnnl_type(y.dtype()), dims{y.ld(), 1});
  std::unique_lock lock(d.mutex);
  auto it = d.cache.find(key);
  if (it == d.cache.end()) {
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(xm, wm, ym), attr, d.eng);
    it = d.cache.emplace(key, std::make_pair(dnnl::matmul(pd), pd)).first;
  }
  dnnl::matmul prim = it->second.first;
  lock.unlock();
  dnnl::memory a(xm, d.eng, x.raw()), b(wm, d.eng, w.raw()), c(ym, d.eng, y.raw());
  prim.execute(d.stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
  d.stream.wait();
}

// ---- GEMV-shaped path for a few rows ---------------------------------------
inline float hsum256(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

// Dot products of `rows` fp32 input rows with one fp32 weight row.
inline void dot_f32(const float* const* xr, int rows, const float* wr, int64_t K, float* out) {
  __m256 acc[kGemvRows][2];
  for (int m = 0; m < rows; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m256 w0 = _mm256_loadu_ps(wr + k), w1 = _mm256_loadu_ps(wr + k + 8);
    for (int m = 0; m < rows; ++m) {
      acc[m][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xr[m] + k), w0, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xr[m] + k + 8), w1, acc[m][1]);
    }
  }
  for (int m = 0; m < rows; ++m) {
    float s = hsum256(_mm256_add_ps(acc[m][0], acc[m][1]));
    for (int64_t kk = k; kk < K; ++kk) s += xr[m][kk] * wr[kk];
    out[m] = s;
  }
}

// The same with a bf16 weight row (widened in registers; x already fp32).
inline void dot_bf16w(const float* const* xr, int rows, const uint16_t* wr, int64_t K, float* out) {
  __m256 acc[kGemvRows][2];
  for (int m = 0; m < rows; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr + k));
    const __m256 w0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16));
    const __m256 w1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16));
    for (int m = 0; m < rows; ++m) {
      acc[m][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xr[m] + k), w0, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xr[m] + k + 8), w1, acc[m][1]);
    }
  }
  for (int m = 0; m < rows; ++m) {
    float s = hsum256(_mm256_add_ps(acc[m][0], acc[m][1]));
    for (int64_t kk = k; kk < K; ++kk) s += xr[m][kk] * bf16_to_f32(wr[kk]);
    out[m] = s;
  }
}

// The same with an fp16 weight row (F16C widens 8 values an instruction).
inline void dot_f16w(const float* const* xr, int rows, const uint16_t* wr, int64_t K, float* out) {
  __m256 acc[kGemvRows][2];
  for (int m = 0; m < rows; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wr + k)));
    const __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wr + k + 8)));
    for (int m = 0; m < rows; ++m) {
      acc[m][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xr[m] + k), w0, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xr[m] + k + 8), w1, acc[m][1]);
    }
  }
  for (int m = 0; m < rows; ++m) {
    float s = hsum256(_mm256_add_ps(acc[m][0], acc[m][1]));
    for (int64_t kk = k; kk < K; ++kk) s += xr[m][kk] * f16_to_f32(wr[kk]);
    out[m] = s;
  }
}

void gemv(const Tensor& y, const Tensor& x, const Tensor& w, bool accumulate) {
  const int64_t M = x.rows(), K = x.cols(), N = w.rows();
  // The few input rows as fp32 (widened once), the output rows in fp32.
  std::vector<float> xs;
  const float* xr[kGemvRows];
  if (x.dtype() == DType::F32) {
    for (int64_t m = 0; m < M; ++m) xr[m] = x.data<float>() + m * x.ld();
  } else {
    xs.resize(size_t(M * K));
    for (int64_t m = 0; m < M; ++m) {
      widen(x.row_ptr(m), x.dtype(), K, xs.data() + m * K);
      xr[m] = xs.data() + m * K;
    }
  }
  F32Out out(y, accumulate);
  const DType wt = w.dtype();
  constexpr int64_t kCols = 64;  // output columns per task
#pragma omp parallel for schedule(static) if (N * K > (1 << 16))
  for (int64_t n0 = 0; n0 < N; n0 += kCols) {
    float d[kGemvRows];
    for (int64_t n = n0; n < std::min(N, n0 + kCols); ++n) {
      if (wt == DType::BF16) dot_bf16w(xr, int(M), static_cast<const uint16_t*>(w.row_ptr(n)), K, d);
      else if (wt == DType::F16) dot_f16w(xr, int(M), static_cast<const uint16_t*>(w.row_ptr(n)), K, d);
      else dot_f32(xr, int(M), w.data<float>() + n * w.ld(), K, d);
      for (int64_t m = 0; m < M; ++m) out.row(m)[n] = accumulate ? out.row(m)[n] + d[m] : d[m];
    }
  }
  out.commit();
}

void sgemm(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy, int64_t M, int64_t N,
           int64_t K, bool accumulate) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(M), int(N), int(K), 1.0f, x, int(ldx), w, int(ldw),
              accumulate ? 1.0f : 0.0f, y, int(ldy));
}

}  // namespace

// y = x · w^T (+ y): x [M,K] and w [N,K] are row-major, as HF stores weights
// ([out_features, in_features]), so the weight is used transposed in place.
void matmul(const Tensor& y, const Tensor& x, const Tensor& w, bool accumulate) {
  const int64_t M = x.rows(), K = x.cols(), N = w.rows();
  if (M == 0 || N == 0) return;
  const DType dx = x.dtype(), dw = w.dtype();
  if (M <= kGemvRows && is_float(dw) && is_float(dx)) {
    gemv(y, x, w, accumulate);
    return;
  }
  if (dx == DType::F32 && dw == DType::F32 && y.dtype() == DType::F32) {
    sgemm(x.data<float>(), x.ld(), w.data<float>(), w.ld(), y.data<float>(), y.ld(), M, N, K, accumulate);
    return;
  }
  if (dx == DType::BF16 && dw == DType::BF16) {
    dnnl_matmul(y, x, w, accumulate);
    return;
  }
  // fp16 (or mixed): fp32 operands, the product rounded once into y.
  const F32Rows xf(x), wf(w);
  F32Out yf(y, accumulate);
  sgemm(xf.p, xf.ld, wf.p, wf.ld, yf.p, yf.ld, M, N, K, accumulate);
  yf.commit();
}

void set_threads(int n) {
  openblas_set_num_threads(n);
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
}

int threads() { return openblas_get_num_threads(); }

}  // namespace ss::cpu
