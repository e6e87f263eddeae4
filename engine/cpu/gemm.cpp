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

#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
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

inline __m256 load8_f32(const void* p, int64_t k) { return _mm256_loadu_ps(static_cast<const float*>(p) + k); }
inline float load1_f32(const void* p, int64_t k) { return static_cast<const float*>(p)[k]; }
inline __m256 load8_bf16(const void* p, int64_t k) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + k));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline float load1_bf16(const void* p, int64_t k) { return bf16_to_f32(static_cast<const uint16_t*>(p)[k]); }
inline __m256 load8_f16(const void* p, int64_t k) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + k)));
}
inline float load1_f16(const void* p, int64_t k) { return f16_to_f32(static_cast<const uint16_t*>(p)[k]); }

// One input row with one weight row: four accumulator chains, 32 values an
// iteration (measured here: interleaving several weight rows is slower; one
// stream per thread lets the prefetcher run ahead).
template <class Load8, class Load1>
inline float dot1(const float* x, const void* wr, int64_t K, Load8 load8, Load1 load1) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), load8(wr, k), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), load8(wr, k + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 16), load8(wr, k + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 24), load8(wr, k + 24), a3);
  }
  float s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; k < K; ++k) s += x[k] * load1(wr, k);
  return s;
}

// Dot products of `rows` (up to kGemvRows) fp32 input rows with one weight row.
template <class Load8, class Load1>
inline void dot_rows(const float* const* xr, int rows, const void* wr, int64_t K, float* out, Load8 load8,
                     Load1 load1) {
  __m256 acc[kGemvRows][2];
  for (int m = 0; m < rows; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m256 w0 = load8(wr, k), w1 = load8(wr, k + 8);
    for (int m = 0; m < rows; ++m) {
      acc[m][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xr[m] + k), w0, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xr[m] + k + 8), w1, acc[m][1]);
    }
  }
  for (int m = 0; m < rows; ++m) {
    out[m] = hsum256(_mm256_add_ps(acc[m][0], acc[m][1]));
    for (int64_t kk = k; kk < K; ++kk) out[m] += xr[m][kk] * load1(wr, kk);
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
    const int64_t n1 = std::min(N, n0 + kCols);
    for (int64_t n = n0; n < n1; ++n) {
      if (M == 1) {
        const void* wr = w.row_ptr(n);
        d[0] = wt == DType::BF16  ? dot1(xr[0], wr, K, load8_bf16, load1_bf16)
               : wt == DType::F16 ? dot1(xr[0], wr, K, load8_f16, load1_f16)
                                  : dot1(xr[0], wr, K, load8_f32, load1_f32);
      } else if (wt == DType::BF16) dot_rows(xr, int(M), w.row_ptr(n), K, d, load8_bf16, load1_bf16);
      else if (wt == DType::F16) dot_rows(xr, int(M), w.row_ptr(n), K, d, load8_f16, load1_f16);
      else dot_rows(xr, int(M), w.row_ptr(n), K, d, load8_f32, load1_f32);
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

double library_gemm_seconds(int64_t M, int64_t N, int64_t K, DType dtype, int count) {
  // fp16 has no library GEMM on this CPU: the library call is the fp32 sgemm it widens into.
  const DType dt = dtype == DType::BF16 ? DType::BF16 : DType::F32;
  const int64_t es = dtype_size(dt);
  std::vector<uint8_t> xa(size_t(M * K * es)), wa(size_t(N * K * es)), ya(size_t(M * N * es));
  std::vector<float> one(size_t(std::max(M * K, N * K)), 0.01f);
  narrow(one.data(), M * K, dt, xa.data());
  narrow(one.data(), N * K, dt, wa.data());
  std::function<void()> call;
  std::optional<dnnl::matmul> prim;
  std::optional<dnnl::memory> a, b, c;
  if (dt == DType::BF16) {
    using dims = dnnl::memory::dims;
    Dnnl& d = Dnnl::get();
    const dnnl::memory::desc xm(dims{M, K}, dnnl_type(dt), dims{K, 1}), wm(dims{K, N}, dnnl_type(dt), dims{1, K}),
        ym(dims{M, N}, dnnl_type(dt), dims{N, 1});
    prim = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(xm, wm, ym), d.eng));
    a.emplace(xm, d.eng, xa.data());
    b.emplace(wm, d.eng, wa.data());
    c.emplace(ym, d.eng, ya.data());
    call = [&] {
      prim->execute(d.stream, {{DNNL_ARG_SRC, *a}, {DNNL_ARG_WEIGHTS, *b}, {DNNL_ARG_DST, *c}});
      d.stream.wait();
    };
  } else {
    call = [&] {
      sgemm(reinterpret_cast<const float*>(xa.data()), K, reinterpret_cast<const float*>(wa.data()), K,
            reinterpret_cast<float*>(ya.data()), N, M, N, K, false);
    };
  }
  call();  // warm up: page in the buffers, build the kernel
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < count; ++i) call();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void set_threads(int n) {
  openblas_set_num_threads(n);
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
}

int threads() { return openblas_get_num_threads(); }

}  // namespace ss::cpu
