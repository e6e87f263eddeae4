// The Mamba (v1) selective scan's backward, chunked as mamba_ssm's is: a
// forward pass keeps the state only at chunk boundaries; then, from the last
// chunk, each chunk's states are recomputed from its checkpoint and the
// reverse recurrence runs through it, carrying the state's gradient
// dh (<- dh_{t+1} e^{dt_{t+1} A} + dpre_t C_t) into the chunk before. Per
// channel c and state n, with h_t = e^{dt_t A} h_{t-1} + dt_t x_t B_t,
// pre_t = sum_n h_t C_t + D x_t and y_t = pre_t silu(z_t):
//   dC_t += dpre_t h_t;  d(dt_t) += sum_n dh_t (A h_{t-1} e^{dt_t A} + x_t B_t);
//   dA += sum_t dh_t h_{t-1} e^{dt_t A} dt_t;  dx_t += dt_t sum_n dh_t B_t + D dpre_t;  dB_t += dh_t dt_t x_t.
// B and C are shared by every channel: each thread sums its channels' share
// in a buffer of its own, added up at the end.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/kernels.h"

namespace ss::cpu {

void selective_scan_backward(const SelectiveScanArgs& a, const Tensor& dy_t, const SelectiveGrads& g) {
  const int64_t T = a.x.rows(), Ch = a.x.cols(), N = a.A_log.numel() / std::max<int64_t>(1, Ch);
  const int64_t chunk = std::max(1, a.chunk), nchunks = (T + chunk - 1) / chunk;
  const F32Rows X(a.x), DT(a.dt), Z(a.z), Bm(a.B), Cm(a.C), DY(dy_t), bias(a.dt_bias), Alog(a.A_log), Dv(a.D);
  F32Out dX(g.dx, false), dDT(g.ddt, false), dZ(g.dz, false), dB(g.dB, false), dC(g.dC, false);
  F32Out gbias(g.d_dt_bias, true), gAlog(g.dA_log, true), gD(g.dD, true);
  const float* init = a.state.defined() ? a.state.data<float>() : nullptr;
  const float* dfinal = g.dstate_out.defined() ? g.dstate_out.data<float>() : nullptr;
  float* dinit = g.dstate_in.defined() ? g.dstate_in.data<float>() : nullptr;
  std::vector<double> dB_all(static_cast<size_t>(T * N), 0.0), dC_all(dB_all.size(), 0.0);
#pragma omp parallel
  {
    std::vector<double> dBm(dB_all.size(), 0.0), dCm(dB_all.size(), 0.0);
    std::vector<double> ckpt(static_cast<size_t>((nchunks + 1) * N)), hs(static_cast<size_t>((chunk + 1) * N));
    std::vector<double> dh(static_cast<size_t>(N)), A(static_cast<size_t>(N)), dA(static_cast<size_t>(N));
    std::vector<double> dt(static_cast<size_t>(T)), sig(static_cast<size_t>(T));
#pragma omp for schedule(dynamic, 8)
    for (int64_t c = 0; c < Ch; ++c) {
      for (int64_t n = 0; n < N; ++n) {
        A[size_t(n)] = -std::exp(double(Alog.p[c * N + n]));
        dA[size_t(n)] = 0;
        ckpt[size_t(n)] = init ? init[c * N + n] : 0.0;
        dh[size_t(n)] = dfinal ? dfinal[c * N + n] : 0.0;
      }
      for (int64_t t = 0; t < T; ++t) {
        const double v = double(DT.row(t)[c]) + bias.p[c];
        dt[size_t(t)] = v > 20 ? v : std::log1p(std::exp(v));
        sig[size_t(t)] = 1.0 / (1.0 + std::exp(-v));
      }
      // Checkpoints: the state entering every chunk.
      for (int64_t k = 0; k < nchunks; ++k) {
        double* in = ckpt.data() + k * N;
        double* out = in + N;
        std::copy(in, in + N, out);
        for (int64_t t = k * chunk; t < std::min(T, (k + 1) * chunk); ++t) {
          const double xb = dt[size_t(t)] * X.row(t)[c];
          for (int64_t n = 0; n < N; ++n) out[n] = std::exp(dt[size_t(t)] * A[size_t(n)]) * out[n] + xb * Bm.row(t)[n];
        }
      }
      double dDsum = 0, dbias = 0;
      for (int64_t k = nchunks - 1; k >= 0; --k) {
        const int64_t c0 = k * chunk, len = std::min(chunk, T - c0);
        // hs[j] = the state after token c0 + j - 1 (hs[0]: the chunk's checkpoint).
        std::copy(ckpt.begin() + k * N, ckpt.begin() + (k + 1) * N, hs.begin());
        for (int64_t j = 0; j < len; ++j) {
          const int64_t t = c0 + j;
          const double xb = dt[size_t(t)] * X.row(t)[c];
          for (int64_t n = 0; n < N; ++n)
            hs[size_t((j + 1) * N + n)] = std::exp(dt[size_t(t)] * A[size_t(n)]) * hs[size_t(j * N + n)] + xb * Bm.row(t)[n];
        }
        for (int64_t j = len - 1; j >= 0; --j) {
          const int64_t t = c0 + j;
          const double* h = hs.data() + (j + 1) * N;
          const double* hp = hs.data() + j * N;
          const float* Bt = Bm.row(t);
          const float* Ct = Cm.row(t);
          const double x = X.row(t)[c];
          double s = 0;
          for (int64_t n = 0; n < N; ++n) s += h[n] * Ct[n];
          const double pre = s + double(Dv.p[c]) * x;
          double dpre = DY.row(t)[c];
          if (a.z.defined()) {
            const double zv = Z.row(t)[c], sz = 1.0 / (1.0 + std::exp(-zv));
            dZ.row(t)[c] = float(dpre * pre * sz * (1.0 + zv * (1.0 - sz)));
            dpre *= zv * sz;
          }
          dDsum += dpre * x;
          double dx = dpre * Dv.p[c], ddt = 0;
          for (int64_t n = 0; n < N; ++n) {
            dh[size_t(n)] += dpre * Ct[n];
            dCm[size_t(t * N + n)] += dpre * h[n];
            const double e = std::exp(dt[size_t(t)] * A[size_t(n)]);
            const double dde = dh[size_t(n)] * hp[n] * e;  // d/d(dt A) of the decay term
            ddt += dde * A[size_t(n)] + dh[size_t(n)] * x * Bt[n];
            dA[size_t(n)] += dde * dt[size_t(t)];
            dx += dh[size_t(n)] * dt[size_t(t)] * Bt[n];
            dBm[size_t(t * N + n)] += dh[size_t(n)] * dt[size_t(t)] * x;
            dh[size_t(n)] *= e;  // into h_{t-1}'s gradient
          }
          dX.row(t)[c] = float(dx);
          const double draw = ddt * sig[size_t(t)];
          dDT.row(t)[c] = float(draw);
          dbias += draw;
        }
      }
      if (dinit)
        for (int64_t n = 0; n < N; ++n) dinit[c * N + n] = float(dh[size_t(n)]);
      for (int64_t n = 0; n < N; ++n) gAlog.p[c * N + n] += float(dA[size_t(n)] * A[size_t(n)]);
      gD.p[c] += float(dDsum);
      gbias.p[c] += float(dbias);
    }
#pragma omp critical
    for (size_t i = 0; i < dB_all.size(); ++i) {
      dB_all[i] += dBm[i];
      dC_all[i] += dCm[i];
    }
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      dB.row(t)[n] = float(dB_all[size_t(t * N + n)]);
      dC.row(t)[n] = float(dC_all[size_t(t * N + n)]);
    }
  for (F32Out* o : {&dX, &dDT, &dZ, &dB, &dC, &gbias, &gAlog, &gD}) o->commit();
}

}  // namespace ss::cpu
