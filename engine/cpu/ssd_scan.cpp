#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "cpu/kernels.h"

namespace ss::cpu {

namespace {

// The scan's operands: fp32 (fp32 tensors, or fp16 ones widened), or bf16
// tensors read in place, whose GEMMs run on oneDNN's bf16 kernel with fp32
// accumulation. As in mamba_ssm's chunked kernels, the fp32 intermediates a
// bf16 product needs (the decayed C B^T mask, the dt-weighted B of the state
// update, the carried state) are rounded to bf16 for it.
struct ScanOperands {
  bool bf16 = false;
  std::optional<F32Rows> widened[3];  // x, B, C when not bf16
  const void* p[3] = {};
  int64_t ld[3] = {};
  ScanOperands(const Tensor& x, const Tensor& B, const Tensor& C) {
    // A few tokens (decode) make GEMMs of a row or two, where a library call
    // costs more than the arithmetic: those widen to fp32 instead.
    constexpr int64_t kMinRows = 32;
    bf16 = x.dtype() == DType::BF16 && B.dtype() == DType::BF16 && C.dtype() == DType::BF16 &&
           x.rows() >= kMinRows && bf16_gemm_available();
    const Tensor* t[3] = {&x, &B, &C};
    for (int i = 0; i < 3; ++i) {
      if (bf16) {
        p[i] = t[i]->raw();
        ld[i] = t[i]->ld();
      } else {
        widened[i].emplace(*t[i]);
        p[i] = widened[i]->p;
        ld[i] = widened[i]->ld;
      }
    }
  }
  int64_t es() const { return bf16 ? 2 : 4; }
  const void* at(int i, int64_t r, int64_t c) const {
    return static_cast<const char*>(p[i]) + (r * ld[i] + c) * es();
  }
  // C[M,N] (fp32) = A · B (+ C); A [M,K] (or stored [K,M] when at), B [K,N] (or stored [N,K] when
  // bt).
  void gemm(int M, int N, int K, const void* A, int64_t lda, bool at, const void* B, int64_t ldb,
            bool bt, float* C, int64_t ldc, bool acc) const {
    if (bf16) {
      tile_gemm_bf16(M, N, K, A, lda, at, B, ldb, bt, C, ldc, 1.0f, acc);
      return;
    }
    cblas_sgemm(CblasRowMajor, at ? CblasTrans : CblasNoTrans, bt ? CblasTrans : CblasNoTrans, M, N,
                K, 1.0f, static_cast<const float*>(A), int(lda), static_cast<const float*>(B),
                int(ldb), acc ? 1.0f : 0.0f, C, int(ldc));
  }
  // An fp32 intermediate as the operand a product takes: itself, or rounded to bf16.
  const void* operand(const float* v, int64_t n, std::vector<uint16_t>& buf) const {
    if (!bf16) return v;
    buf.resize(size_t(n));
    narrow(v, n, DType::BF16, buf.data());
    return buf.data();
  }
};

}  // namespace

// The SSD chunked scan (Dao & Gu 2024, "Transformers are SSMs", §6, the
// "minimal SSD" decomposition): within a chunk the output is a masked
// quadratic form (C B^T ∘ decay ∘ dt) X; across chunks a state S (head_dim ×
// d_state) carries the prefix: y_t += e^{cum_t} C_t S^T, and
// S <- e^{cum_L} S + X^T (B ∘ e^{cum_L - cum_s} dt_s). Every product is a GEMM.
// The recurrence, the decays and the state are fp32 whatever the dtype.
void ssd_scan(const SsdArgs& a) {
  const int64_t T = a.x.rows();
  const int H = a.n_heads, P = a.head_dim, N = a.d_state, G = a.n_groups, L = a.chunk;
  const int heads_per_group = H / G;
  const ScanOperands op(a.x, a.B, a.C);
  enum { kX, kB, kC };
  // dt after bias, softplus and clamping; A = -exp(A_log).
  const F32Rows DTv(a.dt), A_log(a.A_log), bias(a.dt_bias), Dv(a.D);
  std::vector<float> dt(size_t(T) * H), A(H);
  for (int h = 0; h < H; ++h) A[h] = -std::exp(A_log[h]);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      float v = softplus(DTv.row(t)[h] + bias[h]);
      dt[size_t(t) * H + h] = std::clamp(v, a.dt_min, a.dt_max);
    }
  // States of every head, from the caller's state or zero.
  // (the caller's fp32 state is updated in place: decode reads and writes
  // each head's state once a token, with no copy of it)
  std::vector<float> zero_state(a.state.defined() ? 0 : size_t(H) * P * N, 0.0f);
  float* S = a.state.defined() ? a.state.data<float>() : zero_state.data();

  // A few tokens (decode): the recurrence itself, token by token, per head
  // (2 P N multiply-adds a token), instead of chunk GEMMs of one row.
  constexpr int64_t kRecurrentTokens = 4;
  if (T <= kRecurrentTokens) {
    const DType xt = op.bf16 ? DType::BF16 : DType::F32;
    const int64_t HPN = int64_t(H) * P * N;
    parallel_for(H, HPN * T >= (1 << 16), [&](int h) {
      const int g = h / heads_per_group;
      std::vector<float> x(static_cast<size_t>(P)), Bt(static_cast<size_t>(N)),
          Ct(static_cast<size_t>(N)), y(static_cast<size_t>(P));
      float* Sh = S + size_t(h) * P * N;
      for (int64_t t = 0; t < T; ++t) {
        const float dth = dt[size_t(t) * H + h], decay = std::exp(dth * A[h]);
        widen(op.at(kX, t, int64_t(h) * P), xt, P, x.data());
        widen(op.at(kB, t, int64_t(g) * N), xt, N, Bt.data());
        widen(op.at(kC, t, int64_t(g) * N), xt, N, Ct.data());
        for (int p = 0; p < P; ++p) {
          float* sr = Sh + int64_t(p) * N;
          const float xb = dth * x[size_t(p)];
          float acc = 0;
#pragma omp simd reduction(+ : acc)
          for (int n = 0; n < N; ++n) {
            sr[n] = decay * sr[n] + xb * Bt[size_t(n)];
            acc += sr[n] * Ct[size_t(n)];
          }
          y[size_t(p)] = acc + Dv[h] * x[size_t(p)];
        }
        narrow(y.data(), P, a.y.dtype(),
               static_cast<char*>(a.y.row_ptr(t)) + int64_t(h) * P * dtype_size(a.y.dtype()));
      }
    });
  } else {
    const int64_t n_chunks = (T + L - 1) / L;
    std::vector<float> CB(size_t(n_chunks) * L * L);
    const int blas_threads = threads();

    for (int g = 0; g < G; ++g) {
      // CB[t][s] = C_t · B_s for every chunk, shared by the heads of the group.
      for (int64_t c = 0; c < n_chunks; ++c) {
        const int64_t c0 = c * L;
        const int l = int(std::min<int64_t>(L, T - c0));
        op.gemm(l, l, N, op.at(kC, c0, int64_t(g) * N), op.ld[kC], false,
                op.at(kB, c0, int64_t(g) * N), op.ld[kB], true, CB.data() + size_t(c) * L * L, L,
                false);
      }
      // Heads are independent: they run side by side, each through its chunks
      // in order (the state carries), with single-threaded GEMMs.
      const bool parallel = heads_per_group > 1 && blas_threads > 1 && T * P * N >= (1 << 16);
      if (parallel) openblas_set_num_threads(1);
#pragma omp parallel if (parallel)
      {
        std::vector<float> M(size_t(L) * L), Bw(size_t(L) * N), cum(L), dt_h(L), Yc(size_t(L) * P),
            Xf(static_cast<size_t>(P));
        std::vector<uint16_t> Mb, Bwb, Sb;
#pragma omp for schedule(dynamic)
        for (int h = g * heads_per_group; h < (g + 1) * heads_per_group; ++h) {
          float* Sh = S + size_t(h) * P * N;
          for (int64_t c = 0; c < n_chunks; ++c) {
            const int64_t c0 = c * L;
            const int l = int(std::min<int64_t>(L, T - c0));
            const float* CBc = CB.data() + size_t(c) * L * L;
            float run = 0;
            for (int t = 0; t < l; ++t) {
              dt_h[size_t(t)] = dt[size_t(c0 + t) * H + h];
              cum[t] = (run += dt_h[size_t(t)] * A[h]);
            }
            // Masked, decayed, dt-weighted quadratic form (lower triangle).
            for (int t = 0; t < l; ++t) {
              float* mr = M.data() + size_t(t) * L;
              const float* cbr = CBc + size_t(t) * L;
              const float ct = cum[t];
              const float* dth = dt_h.data();
              const float* cm = cum.data();
#pragma omp simd
              for (int s = 0; s <= t; ++s) mr[s] = cbr[s] * fast_exp(ct - cm[s]) * dth[s];
              for (int s = t + 1; s < L; ++s) mr[s] = 0.0f;
            }
            const void* Xh = op.at(kX, c0, int64_t(h) * P);
            const void* Cg = op.at(kC, c0, int64_t(g) * N);
            // Inter-chunk term first: Y = diag(e^cum) C S^T ...
            op.gemm(l, P, N, Cg, op.ld[kC], false, op.operand(Sh, int64_t(P) * N, Sb), N, true,
                    Yc.data(), P, false);
            for (int t = 0; t < l; ++t) {
              const float e = fast_exp(cum[t]);
              float* yr = Yc.data() + int64_t(t) * P;
              for (int p = 0; p < P; ++p) yr[p] *= e;
            }
            // ... plus the intra-chunk term M X ...
            op.gemm(l, P, l, op.operand(M.data(), int64_t(l) * L, Mb), L, false, Xh, op.ld[kX],
                    false, Yc.data(), P, true);
            // ... plus the D skip connection, stored in y's dtype.
            const float Dh = Dv[h];
            for (int t = 0; t < l; ++t) {
              const void* xr = op.at(kX, c0 + t, int64_t(h) * P);
              widen(xr, op.bf16 ? DType::BF16 : DType::F32, P, Xf.data());
              float* yr = Yc.data() + int64_t(t) * P;
              for (int p = 0; p < P; ++p) yr[p] += Dh * Xf[size_t(p)];
              narrow(yr, P, a.y.dtype(),
                     static_cast<char*>(a.y.row_ptr(c0 + t)) +
                         int64_t(h) * P * dtype_size(a.y.dtype()));
            }
            // Carry the state to the next chunk.
            const float last = cum[l - 1];
            for (int s = 0; s < l; ++s) {
              const float wgt = fast_exp(last - cum[s]) * dt_h[size_t(s)];
              widen(op.at(kB, c0 + s, int64_t(g) * N), op.bf16 ? DType::BF16 : DType::F32, N,
                    Bw.data() + size_t(s) * N);
              for (int n = 0; n < N; ++n) Bw[size_t(s) * N + n] *= wgt;
            }
            const float decay = fast_exp(last);
            for (int64_t i = 0; i < int64_t(P) * N; ++i) Sh[i] *= decay;
            op.gemm(P, N, l, Xh, op.ld[kX], true, op.operand(Bw.data(), int64_t(l) * N, Bwb), N,
                    false, Sh, N, true);
          }
        }
      }
      if (parallel) openblas_set_num_threads(blas_threads);
    }
  }
  if (a.log_decay.defined())
    for (int h = 0; h < H; ++h) {
      double sum = 0;
      for (int64_t t = 0; t < T; ++t) sum += double(dt[size_t(t) * H + h]) * A[h];
      a.log_decay.data<float>()[h] = float(sum);
    }
}

// The inter-chunk term for an incoming state S (sequence-parallel state
// passing): y_t += e^{cum_t} C_t S^T, cum_t = sum_{s<=t} dt_s A_h.
void ssd_state_correction(const SsdArgs& a) {
  const int64_t T = a.y.rows();
  const int H = a.n_heads, P = a.head_dim, N = a.d_state, hpg = a.n_heads / a.n_groups;
  constexpr int64_t kRows = 256;
  const F32Rows DTv(a.dt), Cv(a.C), A_log(a.A_log), bias(a.dt_bias);
  F32Out Y(a.y, true);
  std::vector<float> tmp(size_t(kRows) * P), cum(size_t(H), 0.0f), scale(size_t(kRows) * H);
  for (int64_t r0 = 0; r0 < T; r0 += kRows) {
    const int64_t n = std::min(kRows, T - r0);
    for (int64_t t = 0; t < n; ++t)
      for (int h = 0; h < H; ++h) {
        const float A = -std::exp(A_log[h]);
        const float dt = std::clamp(softplus(DTv.row(r0 + t)[h] + bias[h]), a.dt_min, a.dt_max);
        cum[size_t(h)] += dt * A;
        scale[size_t(t * H + h)] = std::exp(cum[size_t(h)]);
      }
    for (int h = 0; h < H; ++h) {
      const float* Cg = Cv.row(r0) + int64_t(h / hpg) * N;
      const float* Sh = a.state.data<float>() + int64_t(h) * P * N;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), P, N, 1.0f, Cg, int(Cv.ld), Sh,
                  N, 0.0f, tmp.data(), P);
      for (int64_t t = 0; t < n; ++t) {
        float* yr = Y.row(r0 + t) + int64_t(h) * P;
        const float e = scale[size_t(t * H + h)];
        for (int p = 0; p < P; ++p) yr[p] += e * tmp[size_t(t * P + p)];
      }
    }
  }
  Y.commit();
}

}  // namespace ss::cpu
