#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/kernels.h"

namespace ss::cpu {

// The SSD chunked scan (Dao & Gu 2024, "Transformers are SSMs", §6, the
// "minimal SSD" decomposition): within a chunk the output is a masked
// quadratic form (C B^T ∘ decay ∘ dt) X; across chunks a state S (head_dim ×
// d_state) carries the prefix: y_t += e^{cum_t} C_t S^T, and
// S <- e^{cum_L} S + X^T (B ∘ e^{cum_L - cum_s} dt_s). Every product is a GEMM.
void ssd_scan(const SsdArgs& a) {
  const int64_t T = a.x.rows();
  const int H = a.n_heads, P = a.head_dim, N = a.d_state, G = a.n_groups, L = a.chunk;
  const int heads_per_group = H / G;
  // dt after bias, softplus and clamping; A = -exp(A_log).
  // Inputs in the compute dtype, read as fp32; the recurrence and its state run in fp32.
  const F32Rows Xv(a.x), Bv(a.B), Cv(a.C), DTv(a.dt), A_log(a.A_log), bias(a.dt_bias), Dv(a.D);
  F32Out Yv(a.y, false);
  std::vector<float> dt(size_t(T) * H), A(H);
  for (int h = 0; h < H; ++h) A[h] = -std::exp(A_log[h]);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      float v = softplus(DTv.row(t)[h] + bias[h]);
      dt[size_t(t) * H + h] = std::clamp(v, a.dt_min, a.dt_max);
    }
  // States of every head, from the caller's state or zero.
  std::vector<float> S(size_t(H) * P * N, 0.0f);
  if (a.state.defined()) std::copy_n(a.state.data<float>(), S.size(), S.data());

  const float* X = Xv.p;
  const float* Bm = Bv.p;
  const float* Cm = Cv.p;
  float* Y = Yv.p;
  const int64_t ldx = Xv.ld, ldy = Yv.ld, ldb = Bv.ld, ldc = Cv.ld;
  const int64_t n_chunks = (T + L - 1) / L;
  std::vector<float> CB(size_t(n_chunks) * L * L);
  const int blas_threads = threads();

  for (int g = 0; g < G; ++g) {
    // CB[t][s] = C_t · B_s for every chunk, shared by the heads of the group.
    for (int64_t c = 0; c < n_chunks; ++c) {
      const int64_t c0 = c * L;
      const int l = int(std::min<int64_t>(L, T - c0));
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, l, l, N, 1.0f, Cm + c0 * ldc + int64_t(g) * N, int(ldc),
                  Bm + c0 * ldb + int64_t(g) * N, int(ldb), 0.0f, CB.data() + size_t(c) * L * L, L);
    }
    // Heads are independent: they run side by side, each through its chunks
    // in order (the state carries), with single-threaded GEMMs.
    const bool parallel = heads_per_group > 1 && blas_threads > 1 && T * P * N >= (1 << 16);
    if (parallel) openblas_set_num_threads(1);
#pragma omp parallel if (parallel)
    {
      std::vector<float> M(size_t(L) * L), Bw(size_t(L) * N), cum(L), dt_h(L);
#pragma omp for schedule(dynamic)
      for (int h = g * heads_per_group; h < (g + 1) * heads_per_group; ++h) {
        float* Sh = S.data() + size_t(h) * P * N;
        for (int64_t c = 0; c < n_chunks; ++c) {
          const int64_t c0 = c * L;
          const int l = int(std::min<int64_t>(L, T - c0));
          const float* Bg = Bm + c0 * ldb + int64_t(g) * N;
          const float* Cg = Cm + c0 * ldc + int64_t(g) * N;
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
            for (int s = t + 1; s < l; ++s) mr[s] = 0.0f;
          }
          const float* Xh = X + c0 * ldx + int64_t(h) * P;
          float* Yh = Y + c0 * ldy + int64_t(h) * P;
          // Inter-chunk term first: Y = diag(e^cum) C S^T ...
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, l, P, N, 1.0f, Cg, int(ldc), Sh, N, 0.0f, Yh,
                      int(ldy));
          for (int t = 0; t < l; ++t) {
            const float e = fast_exp(cum[t]);
            float* yr = Yh + int64_t(t) * ldy;
            for (int p = 0; p < P; ++p) yr[p] *= e;
          }
          // ... plus the intra-chunk term M X.
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, l, P, l, 1.0f, M.data(), L, Xh, int(ldx), 1.0f,
                      Yh, int(ldy));
          // D skip connection.
          const float Dh = Dv[h];
          for (int t = 0; t < l; ++t)
            for (int p = 0; p < P; ++p) Yh[int64_t(t) * ldy + p] += Dh * Xh[int64_t(t) * ldx + p];
          // Carry the state to the next chunk.
          const float last = cum[l - 1];
          for (int s = 0; s < l; ++s) {
            const float wgt = fast_exp(last - cum[s]) * dt_h[size_t(s)];
            const float* br = Bg + int64_t(s) * ldb;
            for (int n = 0; n < N; ++n) Bw[size_t(s) * N + n] = br[n] * wgt;
          }
          const float decay = fast_exp(last);
          for (int64_t i = 0; i < int64_t(P) * N; ++i) Sh[i] *= decay;
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, P, N, l, 1.0f, Xh, int(ldx), Bw.data(), N, 1.0f, Sh,
                      N);
        }
      }
    }
    if (parallel) openblas_set_num_threads(blas_threads);
  }
  Yv.commit();
  if (a.state.defined()) std::copy(S.begin(), S.end(), a.state.data<float>());
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
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), P, N, 1.0f, Cg, int(Cv.ld), Sh, N, 0.0f,
                  tmp.data(), P);
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
