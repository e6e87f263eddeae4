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
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <tuple>

#include "cpu/kernels.h"

namespace ss::cpu {
namespace {

// How far ahead of its loads the GEMV prefetches a weight row's stream:
// eight cache lines. Measured on a 2-core Zen 3 VM (small-llama decode at
// 1024 tokens, alternating runs), the GEMVs read fp32 weights at 23-27 GB/s
// and bf16 at 25-27 GB/s with 512 bytes, against 20-20.5 and 22.6-22.8 GB/s
// with 4096 (a page ahead, the earlier choice) and 25.4-25.8 GB/s (bf16)
// with no software prefetch.
constexpr int64_t kPrefetchBytes = 512;

// Rows up to which the GEMV path runs (each weight row is read once for all of them).
constexpr int64_t kGemvRows = 4;

// ---- oneDNN matmul, primitives cached per shape ----------------------------
dnnl::memory::data_type dnnl_type(DType t) {
  switch (t) {
    case DType::BF16:
      return dnnl::memory::data_type::bf16;
    case DType::F16:
      return dnnl::memory::data_type::f16;
    default:
      return dnnl::memory::data_type::f32;
  }
}

// One matmul on raw operands: C[M,N] = alpha A B (+ C when acc); A [M,K], or
// stored [K,M] and used transposed; B [K,N], or stored [N,K] and used
// transposed; every operand row-major with its leading dimension.
struct MatmulCall {
  int64_t M, N, K;
  const void* A;
  int64_t lda;
  bool a_trans;
  DType da;
  const void* B;
  int64_t ldb;
  bool b_trans;
  DType db;
  void* C;
  int64_t ldc;
  DType dc;
  float alpha = 1.0f;
  bool acc = false;
  auto key() const {
    return std::make_tuple(M, N, K, lda, a_trans, int(da), ldb, b_trans, int(db), ldc, int(dc),
                           alpha, acc);
  }
};

// Primitives are made once per shape and kept; each call runs on a stream
// and a scratchpad of the calling thread (attention runs tiles on every
// thread at once; inside an OpenMP region oneDNN runs each single-threaded),
// and a small one outside a parallel region runs on this thread alone, where
// waking the pool would cost more than the product.
void run_matmul(const MatmulCall& c) {
  using dims = dnnl::memory::dims;
  static const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  static std::mutex mutex;
  static std::map<decltype(c.key()), std::pair<dnnl::matmul, dnnl::memory::desc>> cache;
  thread_local dnnl::stream stream(eng);
  thread_local std::vector<uint8_t> pad;
  const dnnl::memory::desc am(dims{c.M, c.K}, dnnl_type(c.da),
                              c.a_trans ? dims{1, c.lda} : dims{c.lda, 1});
  const dnnl::memory::desc bm(dims{c.K, c.N}, dnnl_type(c.db),
                              c.b_trans ? dims{1, c.ldb} : dims{c.ldb, 1});
  const dnnl::memory::desc cm(dims{c.M, c.N}, dnnl_type(c.dc), dims{c.ldc, 1});
  std::unique_lock lock(mutex);
  auto it = cache.find(c.key());
  if (it == cache.end()) {
    // Shapes vary with prompt lengths and tails: keep the cache bounded (a
    // primitive still running elsewhere holds its own reference).
    if (cache.size() >= 4096) cache.clear();
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (c.alpha != 1.0f) attr.set_output_scales(0, {c.alpha});
    if (c.acc) {
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(am, bm, cm), attr, eng);
    it = cache.emplace(c.key(), std::make_pair(dnnl::matmul(pd), pd.scratchpad_desc())).first;
  }
  const dnnl::matmul prim = it->second.first;
  const dnnl::memory::desc sm = it->second.second;
  lock.unlock();
  if (pad.size() < sm.get_size()) pad.resize(sm.get_size());
  dnnl::memory a(am, eng, const_cast<void*>(c.A)), b(bm, eng, const_cast<void*>(c.B)),
      out(cm, eng, c.C), scratch(sm, eng, pad.data());
#ifdef _OPENMP
  const bool alone = !omp_in_parallel() && c.M * c.N * c.K < (int64_t(1) << 18);
  const int before = omp_get_max_threads();
  if (alone) omp_set_num_threads(1);
#endif
  prim.execute(stream, {{DNNL_ARG_SRC, a},
                        {DNNL_ARG_WEIGHTS, b},
                        {DNNL_ARG_DST, out},
                        {DNNL_ARG_SCRATCHPAD, scratch}});
  stream.wait();
#ifdef _OPENMP
  if (alone) omp_set_num_threads(before);
#endif
}

}  // namespace

// Whether oneDNN can run a bf16 matmul on this CPU: version 2.6 needs
// AVX-512 for any bf16 primitive (its AVX512-BF16 kernel where the CPU has
// that too). Asked once; without it bf16 operands are widened to fp32 for
// sgemm, which is slower but the same arithmetic.
bool bf16_gemm_available() {
  static const bool ok = [] {
    // SHARDSCOPE_NO_BF16_GEMM=1 takes the fallback on any CPU (to test it).
    if (const char* no = std::getenv("SHARDSCOPE_NO_BF16_GEMM"); no && *no && std::string(no) != "0")
      return false;
    try {
      using dims = dnnl::memory::dims;
      const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
      const dnnl::memory::desc a(dims{16, 16}, dnnl::memory::data_type::bf16, dims{16, 1});
      const dnnl::memory::desc c(dims{16, 16}, dnnl::memory::data_type::f32, dims{16, 1});
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, a, c), eng);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok;
}

bool cpu_has_avx512() {
  static const bool ok = [] {
    if (const char* no = std::getenv("SHARDSCOPE_NO_AVX512"); no && *no && std::string(no) != "0") return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  }();
  return ok;
}

namespace {

// y = x wᵀ (+ y) for tensors: w [N,K] is read transposed in place.
void dnnl_matmul(const Tensor& y, const Tensor& x, const Tensor& w, bool accumulate) {
  run_matmul({x.rows(), w.rows(), x.cols(), x.raw(), x.ld(), false, x.dtype(), w.raw(), w.ld(),
              true, w.dtype(), y.raw(), y.ld(), y.dtype(), 1.0f, accumulate});
}

// ---- GEMV-shaped path for a few rows ---------------------------------------

inline __m256 load8_f32(const void* p, int64_t k) {
  return _mm256_loadu_ps(static_cast<const float*>(p) + k);
}
inline float load1_f32(const void* p, int64_t k) {
  return static_cast<const float*>(p)[k];
}
inline __m256 load8_bf16(const void* p, int64_t k) {
  const __m128i h =
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + k));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline float load1_bf16(const void* p, int64_t k) {
  return bf16_to_f32(static_cast<const uint16_t*>(p)[k]);
}
inline __m256 load8_f16(const void* p, int64_t k) {
  return _mm256_cvtph_ps(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + k)));
}
inline float load1_f16(const void* p, int64_t k) {
  return f16_to_f32(static_cast<const uint16_t*>(p)[k]);
}

// One input row with one weight row: four accumulator chains, 32 values an
// iteration (measured here: interleaving several weight rows is slower; one
// stream per thread lets the prefetcher run ahead).
template <int es, class Load8, class Load1>
inline float dot1(const float* x, const void* wr, int64_t K, Load8 load8, Load1 load1) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    _mm_prefetch(static_cast<const char*>(wr) + k * es + kPrefetchBytes, _MM_HINT_T0);
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), load8(wr, k), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), load8(wr, k + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 16), load8(wr, k + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 24), load8(wr, k + 24), a3);
  }
  float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; k < K; ++k) s += x[k] * load1(wr, k);
  return s;
}

// Dot products of `rows` (up to kGemvRows) fp32 input rows with one weight row.
template <class Load8, class Load1>
inline void dot_rows(const float* const* xr, int rows, const void* wr, int64_t K, float* out,
                     Load8 load8, Load1 load1) {
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
    out[m] = hsum8(_mm256_add_ps(acc[m][0], acc[m][1]));
    for (int64_t kk = k; kk < K; ++kk) out[m] += xr[m][kk] * load1(wr, kk);
  }
}

// A few rows of any float dtypes take the GEMV path.
bool takes_gemv(const Tensor& x, const Tensor& w) {
  return x.rows() <= kGemvRows && is_float(x.dtype()) && is_float(w.dtype());
}

// The GEMV over one or more weights that share the input row(s): tasks of
// kCols output columns run over the weights one after another, so the threads
// read every weight in one parallel pass (q, k and v of a decode step: one
// fork and join instead of three, and no thread idles at the end of the small
// k and v projections).
void gemv(std::span<const Tensor> ys, const Tensor& x, std::span<const Tensor> ws, bool accumulate) {
  const int64_t M = x.rows(), K = x.cols();
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
  constexpr int64_t kCols = 64;  // output columns per task
  std::vector<F32Out> outs;
  outs.reserve(ys.size());
  std::vector<int64_t> first(ws.size() + 1, 0);  // each weight's first task
  int64_t values = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    outs.emplace_back(ys[i], accumulate);
    first[i + 1] = first[i] + (ws[i].rows() + kCols - 1) / kCols;
    values += ws[i].rows() * K;
  }
  parallel_for(first.back(), values > (1 << 16), [&](int64_t task) {
    const size_t i = size_t(std::upper_bound(first.begin(), first.end(), task) - first.begin()) - 1;
    const Tensor& w = ws[i];
    const F32Out& out = outs[i];
    const DType wt = w.dtype();
    float d[kGemvRows];
    const int64_t n0 = (task - first[i]) * kCols, n1 = std::min(w.rows(), n0 + kCols);
    for (int64_t n = n0; n < n1; ++n) {
      if (M == 1) {
        const void* wr = w.row_ptr(n);
        d[0] = wt == DType::BF16  ? dot1<2>(xr[0], wr, K, load8_bf16, load1_bf16)
               : wt == DType::F16 ? dot1<2>(xr[0], wr, K, load8_f16, load1_f16)
                                  : dot1<4>(xr[0], wr, K, load8_f32, load1_f32);
      } else if (wt == DType::BF16)
        dot_rows(xr, int(M), w.row_ptr(n), K, d, load8_bf16, load1_bf16);
      else if (wt == DType::F16)
        dot_rows(xr, int(M), w.row_ptr(n), K, d, load8_f16, load1_f16);
      else
        dot_rows(xr, int(M), w.row_ptr(n), K, d, load8_f32, load1_f32);
      for (int64_t m = 0; m < M; ++m) out.row(m)[n] = accumulate ? out.row(m)[n] + d[m] : d[m];
    }
  });
  for (F32Out& o : outs) o.commit();
}

void sgemm(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy,
           int64_t M, int64_t N, int64_t K, bool accumulate) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(M), int(N), int(K), 1.0f, x, int(ldx), w,
              int(ldw), accumulate ? 1.0f : 0.0f, y, int(ldy));
}

}  // namespace

// y = x · w^T (+ y): x [M,K] and w [N,K] are row-major, as HF stores weights
// ([out_features, in_features]), so the weight is used transposed in place.
void matmul(const Tensor& y, const Tensor& x, const Tensor& w, bool accumulate) {
  const int64_t M = x.rows(), K = x.cols(), N = w.rows();
  if (M == 0 || N == 0) return;
  const DType dx = x.dtype(), dw = w.dtype();
  if (takes_gemv(x, w)) {
    gemv({&y, 1}, x, {&w, 1}, accumulate);
    return;
  }
  if (dx == DType::F32 && dw == DType::F32 && y.dtype() == DType::F32) {
    sgemm(x.data<float>(), x.ld(), w.data<float>(), w.ld(), y.data<float>(), y.ld(), M, N, K,
          accumulate);
    return;
  }
  if (dx == DType::BF16 && dw == DType::BF16 && bf16_gemm_available()) {
    dnnl_matmul(y, x, w, accumulate);
    return;
  }
  // fp16 (or mixed): fp32 operands, the product rounded once into y. The
  // weight is widened a block of rows at a time, so the staging stays small
  // next to the weight itself (a 32000-row LM head would need 4 bytes a value).
  const F32Rows xf(x);
  F32Out yf(y, accumulate);
  const int64_t kRows = std::max<int64_t>(64, (int64_t(4) << 20) / std::max<int64_t>(K, 1));  // 16 MiB
  std::vector<float> wb(size_t(std::min(N, kRows) * K));
  for (int64_t n0 = 0; n0 < N; n0 += kRows) {
    const int64_t n = std::min(kRows, N - n0);
    for (int64_t r = 0; r < n; ++r) widen(w.row_ptr(n0 + r), w.dtype(), K, wb.data() + r * K);
    sgemm(xf.p, xf.ld, wb.data(), K, yf.p + n0, yf.ld, M, n, K, accumulate);
  }
  yf.commit();
}

// The backward GEMMs. dx[M,K] = dy[M,N] · w[N,K] and dw[N,K] = dy^T · x[M,K]:
// the same libraries as the forward (sgemm for fp32, oneDNN for bf16, which
// reads a transposed operand in place), fp16 and mixed dtypes through fp32.
namespace {
void grad_gemm(const Tensor& c, const Tensor& a, bool a_trans, const Tensor& b, bool accumulate) {
  // c[rows, cols] = op(a) · b, op(a) = a or a^T; b is [inner, cols] row-major.
  const int64_t rows = c.rows(), cols = c.cols(), inner = b.rows();
  if (rows == 0 || cols == 0) return;
  if (inner == 0) {
    if (!accumulate) for (int64_t r = 0; r < rows; ++r) std::memset(c.row_ptr(r), 0, size_t(cols * dtype_size(c.dtype())));
    return;
  }
  const DType da = a.dtype(), db = b.dtype(), dc = c.dtype();
  if (da == DType::BF16 && db == DType::BF16 && bf16_gemm_available()) {
    run_matmul({rows, cols, inner, a.raw(), a.ld(), a_trans, da, b.raw(), b.ld(), false, db, c.raw(), c.ld(), dc,
                1.0f, accumulate});
    return;
  }
  const F32Rows af(a), bf(b);
  F32Out cf(c, accumulate);
  cblas_sgemm(CblasRowMajor, a_trans ? CblasTrans : CblasNoTrans, CblasNoTrans, int(rows), int(cols), int(inner),
              1.0f, af.p, int(af.ld), bf.p, int(bf.ld), accumulate ? 1.0f : 0.0f, cf.p, int(cf.ld));
  cf.commit();
}
}  // namespace

void matmul_group(std::span<const Tensor> ys, const Tensor& x, std::span<const Tensor> ws) {
  const bool one_pass =
      x.rows() > 0 && std::all_of(ws.begin(), ws.end(), [&](const Tensor& w) { return takes_gemv(x, w); });
  if (one_pass) {
    gemv(ys, x, ws, false);
    return;
  }
  for (size_t i = 0; i < ws.size(); ++i) matmul(ys[i], x, ws[i], false);
}

void matmul_dx(const Tensor& dx, const Tensor& dy, const Tensor& w, bool accumulate) {
  grad_gemm(dx, dy, false, w, accumulate);
}
void matmul_dw(const Tensor& dw, const Tensor& dy, const Tensor& x, bool accumulate) {
  grad_gemm(dw, dy, true, x, accumulate);
}

void tile_gemm_bf16(int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, bool a_transposed,
                    const void* B, int64_t ldb, bool b_transposed, float* C, int64_t ldc,
                    float alpha, bool accumulate) {
  run_matmul({M, N, K, A, lda, a_transposed, DType::BF16, B, ldb, b_transposed, DType::BF16, C, ldc,
              DType::F32, alpha, accumulate});
}

double library_gemm_seconds(int64_t M, int64_t N, int64_t K, DType dtype, int count) {
  // fp16 has no library GEMM on this CPU: the library call is the fp32 sgemm it widens into.
  const DType dt = dtype == DType::BF16 && bf16_gemm_available() ? DType::BF16 : DType::F32;
  const int64_t es = dtype_size(dt);
  std::vector<uint8_t> xa(size_t(M * K * es)), wa(size_t(N * K * es)), ya(size_t(M * N * es));
  std::vector<float> one(size_t(std::max(M * K, N * K)), 0.01f);
  narrow(one.data(), M * K, dt, xa.data());
  narrow(one.data(), N * K, dt, wa.data());
  std::function<void()> call;
  // The library called directly: one primitive, one stream, no cache.
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  std::optional<dnnl::matmul> prim;
  std::optional<dnnl::memory> a, b, c;
  if (dt == DType::BF16) {
    using dims = dnnl::memory::dims;
    const dnnl::memory::desc xm(dims{M, K}, dnnl_type(dt), dims{K, 1}),
        wm(dims{K, N}, dnnl_type(dt), dims{1, K}), ym(dims{M, N}, dnnl_type(dt), dims{N, 1});
    prim = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(xm, wm, ym), eng));
    a.emplace(xm, eng, xa.data());
    b.emplace(wm, eng, wa.data());
    c.emplace(ym, eng, ya.data());
    call = [&] {
      prim->execute(stream, {{DNNL_ARG_SRC, *a}, {DNNL_ARG_WEIGHTS, *b}, {DNNL_ARG_DST, *c}});
      stream.wait();
    };
  } else {
    call = [&] {
      sgemm(reinterpret_cast<const float*>(xa.data()), K, reinterpret_cast<const float*>(wa.data()),
            K, reinterpret_cast<float*>(ya.data()), N, M, N, K, false);
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

int threads() {
  return openblas_get_num_threads();
}

}  // namespace ss::cpu
