#include <cmath>
#include <vector>

#include "cpu/kernels.h"

namespace ss::cpu {

// Mamba (v1) selective scan: a sequential recurrence per channel, with a
// per-channel, per-state A (so no chunked matrix form as in Mamba2).
// Channels are independent and run in parallel.
void selective_scan(const SelectiveScanArgs& a) {
  const int64_t T = a.x.rows(), Di = a.x.cols(), N = a.A_log.numel() / Di;
  // Inputs in the compute dtype, read as fp32; the state is fp32 (as mamba_ssm keeps it).
  const F32Rows X(a.x), DT(a.dt), Bm(a.B), Cm(a.C), Z(a.z), Alog(a.A_log), bias_v(a.dt_bias), Dv(a.D);
  F32Out Y(a.y, false);
  float* st = a.state.defined() ? a.state.data<float>() : nullptr;
#pragma omp parallel if (T * Di * N > (1 << 15))
  {
    std::vector<float> A(N), h(N);
#pragma omp for schedule(static)
    for (int64_t c = 0; c < Di; ++c) {
      for (int64_t n = 0; n < N; ++n) {
        A[n] = -std::exp(Alog.p[c * N + n]);
        h[n] = st ? st[c * N + n] : 0.0f;
      }
      const float bias = bias_v[c], Dc = Dv[c];
      for (int64_t t = 0; t < T; ++t) {
        const float xv = X.row(t)[c];
        const float dt = softplus(DT.row(t)[c] + bias);
        const float* Bt = Bm.row(t);
        const float* Ct = Cm.row(t);
        float y = 0;
        for (int64_t n = 0; n < N; ++n) {
          h[n] = fast_exp(dt * A[n]) * h[n] + dt * Bt[n] * xv;
          y += h[n] * Ct[n];
        }
        y += Dc * xv;
        if (a.z.defined()) y *= silu(Z.row(t)[c]);
        Y.row(t)[c] = y;
      }
      if (st)
        for (int64_t n = 0; n < N; ++n) st[c * N + n] = h[n];
      if (a.dt_sum.defined()) {
        double sum = 0;
        for (int64_t t = 0; t < T; ++t) sum += softplus(DT.row(t)[c] + bias);
        a.dt_sum.data<float>()[c] = float(sum);
      }
    }
  }
  Y.commit();
}

// The contribution of an incoming state S (sequence-parallel state passing)
// to outputs scanned from a zero state: h_t gains e^{A cumdt_t} S, so
// y_t += silu(z_t) * sum_n C_t[n] e^{A[c][n] cumdt_t} S[c][n].
void selective_state_correction(const SelectiveScanArgs& a) {
  const int64_t T = a.x.rows(), Di = a.x.cols(), N = a.A_log.numel() / Di;
  const F32Rows DT(a.dt), Cm(a.C), Z(a.z), A_log(a.A_log), bias_v(a.dt_bias);
  F32Out Y(a.y, true);
  parallel_for(Di, T * Di * N > (1 << 15), [&](int64_t c) {
    const float bias = bias_v[c];
    const float* Alog = A_log.p + c * N;
    const float* S = a.state.data<float>() + c * N;
    float cum = 0;
    for (int64_t t = 0; t < T; ++t) {
      cum += softplus(DT.row(t)[c] + bias);
      const float* Ct = Cm.row(t);
      float acc = 0;
      for (int64_t n = 0; n < N; ++n) acc += Ct[n] * std::exp(-std::exp(Alog[n]) * cum) * S[n];
      if (a.z.defined()) acc *= silu(Z.row(t)[c]);
      Y.row(t)[c] += acc;
    }
  });
  Y.commit();
}

}  // namespace ss::cpu
