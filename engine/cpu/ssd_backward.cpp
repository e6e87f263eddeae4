// The Mamba2 SSD scan's backward: the chunked algorithm run in reverse.
//
// Per head, with a_t = dt_t A and L_t the cumulative sum of a inside the
// chunk, a chunk of tokens s <= t maps its incoming state S_in to
//   y_t   = sum_s e^{L_t - L_s} (C_t . B_s) dt_s x_s + e^{L_t} S_in C_t + D x_t
//   S_out = e^{L_e} S_in + sum_s e^{L_e - L_s} dt_s x_s B_s^T      (e: the chunk's last token)
// A first pass recomputes each chunk's S_in (the forward's chunk states);
// the backward then walks the chunks from the last: each takes dS_out (the
// gradient of its final state, from the chunk after it) and dy, and gives
// dx, d(dt), dB, dC, the gradient of every L_t (then of a, dt and A through
// a reverse cumulative sum) and dS_in, which becomes the previous chunk's
// dS_out. The intra-chunk terms are the quadratic (attention-like) form, the
// state terms rank-1 updates: no sequential per-token recurrence. Arithmetic
// is double in this first version (the tests hold it to the float64
// reference's finite differences at 1e-5).
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/kernels.h"

namespace ss::cpu {

void ssd_scan_backward(const SsdArgs& a, const Tensor& dy_t, const SsdGrads& g) {
  const int64_t T = a.x.rows();
  const int H = a.n_heads, P = a.head_dim, N = a.d_state, G = a.n_groups, per_group = H / G;
  const int64_t chunk = a.chunk, nchunks = (T + chunk - 1) / chunk;
  const F32Rows X(a.x), DT(a.dt), Bm(a.B), Cm(a.C), DY(dy_t);
  const F32Rows bias(a.dt_bias), Alog(a.A_log), Dv(a.D);
  F32Out dX(g.dx, false), dDT(g.ddt, false), dB(g.dB, false), dC(g.dC, false);
  F32Out gbias(g.d_dt_bias, true), gAlog(g.dA_log, true), gD(g.dD, true);
  for (int64_t t = 0; t < T; ++t) {
    std::fill_n(dB.row(t), G * N, 0.0f);
    std::fill_n(dC.row(t), G * N, 0.0f);
  }
  const float* init = a.state.defined() ? a.state.data<float>() : nullptr;
  const float* dfinal = g.dstate_out.defined() ? g.dstate_out.data<float>() : nullptr;
  float* dinit = g.dstate_in.defined() ? g.dstate_in.data<float>() : nullptr;

  // Heads of one group share B and C: a group's heads run on one thread.
#pragma omp parallel for schedule(dynamic)
  for (int grp = 0; grp < G; ++grp) {
    const size_t pn = static_cast<size_t>(P) * static_cast<size_t>(N), len = static_cast<size_t>(chunk);
    std::vector<double> S(static_cast<size_t>(nchunks + 1) * pn), dS(pn), dSin(pn);
    std::vector<double> dt(static_cast<size_t>(T)), sig(static_cast<size_t>(T)), L(len), dL(len), ddt(len);
    for (int h = grp * per_group; h < (grp + 1) * per_group; ++h) {
      const double A = -std::exp(double(Alog[h])), D = Dv[h];
      for (int64_t t = 0; t < T; ++t) {
        const double v = double(DT.row(t)[h]) + bias[h];
        const double sp = v > 20 ? v : std::log1p(std::exp(v));
        const bool clamped = sp < a.dt_min || sp > a.dt_max;
        dt[size_t(t)] = std::clamp(sp, double(a.dt_min), double(a.dt_max));
        sig[size_t(t)] = clamped ? 0.0 : 1.0 / (1.0 + std::exp(-v));  // d softplus / dv
      }
      auto xv = [&](int64_t t) { return X.row(t) + int64_t(h) * P; };
      auto bv = [&](int64_t t) { return Bm.row(t) + int64_t(grp) * N; };
      auto cv = [&](int64_t t) { return Cm.row(t) + int64_t(grp) * N; };
      auto dyv = [&](int64_t t) { return DY.row(t) + int64_t(h) * P; };
      // Forward chunk states: S[k] enters chunk k.
      double* S0 = S.data();
      for (int64_t i = 0; i < int64_t(P) * N; ++i) S0[i] = init ? init[int64_t(h) * P * N + i] : 0.0;
      for (int64_t k = 0; k < nchunks; ++k) {
        const int64_t c0 = k * chunk, n = std::min(chunk, T - c0);
        double acc = 0;
        for (int64_t t = 0; t < n; ++t) L[size_t(t)] = (acc += dt[size_t(c0 + t)] * A);
        const double* in = S.data() + size_t(k) * P * N;
        double* out = S.data() + size_t(k + 1) * P * N;
        const double Le = L[size_t(n - 1)];
        for (int64_t i = 0; i < int64_t(P) * N; ++i) out[i] = std::exp(Le) * in[i];
        for (int64_t s = 0; s < n; ++s) {
          const double w = std::exp(Le - L[size_t(s)]) * dt[size_t(c0 + s)];
          const float* x = xv(c0 + s);
          const float* b = bv(c0 + s);
          for (int p = 0; p < P; ++p)
            for (int q = 0; q < N; ++q) out[size_t(p) * N + q] += w * x[p] * b[q];
        }
      }
      for (int64_t i = 0; i < int64_t(P) * N; ++i) dS[size_t(i)] = dfinal ? dfinal[int64_t(h) * P * N + i] : 0.0;
      double dA = 0, dDsum = 0, dbias = 0;
      for (int64_t k = nchunks - 1; k >= 0; --k) {
        const int64_t c0 = k * chunk, n = std::min(chunk, T - c0);
        double acc = 0;
        for (int64_t t = 0; t < n; ++t) L[size_t(t)] = (acc += dt[size_t(c0 + t)] * A);
        std::fill(dL.begin(), dL.end(), 0.0);
        std::fill(ddt.begin(), ddt.end(), 0.0);
        std::fill(dSin.begin(), dSin.end(), 0.0);
        const double* Sin = S.data() + size_t(k) * P * N;
        // D skip: dx = D dy.
        for (int64_t t = 0; t < n; ++t) {
          const float* dy = dyv(c0 + t);
          const float* x = xv(c0 + t);
          float* dx = dX.row(c0 + t) + int64_t(h) * P;
          for (int p = 0; p < P; ++p) {
            dDsum += double(dy[p]) * x[p];
            dx[p] = float(D * dy[p]);
          }
        }
        // Intra-chunk: y_t += sum_{s<=t} e^{L_t-L_s} (C_t.B_s) dt_s x_s.
        for (int64_t t = 0; t < n; ++t) {
          const float* dy = dyv(c0 + t);
          const float* ct = cv(c0 + t);
          float* dct = dC.row(c0 + t) + int64_t(grp) * N;
          for (int64_t s = 0; s <= t; ++s) {
            const float* bs = bv(c0 + s);
            const float* x = xv(c0 + s);
            double cb = 0, dyx = 0;
            for (int q = 0; q < N; ++q) cb += double(ct[q]) * bs[q];
            for (int p = 0; p < P; ++p) dyx += double(dy[p]) * x[p];
            const double e = std::exp(L[size_t(t)] - L[size_t(s)]), M = e * cb, dts = dt[size_t(c0 + s)];
            float* dx = dX.row(c0 + s) + int64_t(h) * P;
            for (int p = 0; p < P; ++p) dx[p] += float(M * dts * dy[p]);
            ddt[size_t(s)] += M * dyx;
            const double dM = dyx * dts;  // dL/dM_ts
            dL[size_t(t)] += dM * M;
            dL[size_t(s)] -= dM * M;
            const double dcb = dM * e;
            float* dbs = dB.row(c0 + s) + int64_t(grp) * N;
            for (int q = 0; q < N; ++q) {
              dct[q] += float(dcb * bs[q]);
              dbs[q] += float(dcb * ct[q]);
            }
          }
        }
        // The incoming state's term: y_t += e^{L_t} S_in C_t.
        for (int64_t t = 0; t < n; ++t) {
          const float* dy = dyv(c0 + t);
          const float* ct = cv(c0 + t);
          float* dct = dC.row(c0 + t) + int64_t(grp) * N;
          const double e = std::exp(L[size_t(t)]);
          double dot = 0;  // dy . (S_in C_t)
          for (int p = 0; p < P; ++p) {
            double v = 0;
            for (int q = 0; q < N; ++q) {
              v += Sin[size_t(p) * N + q] * ct[q];
              dSin[size_t(p) * N + q] += e * dy[p] * ct[q];
            }
            dot += double(dy[p]) * v;
          }
          for (int q = 0; q < N; ++q) {
            double v = 0;
            for (int p = 0; p < P; ++p) v += Sin[size_t(p) * N + q] * dy[p];
            dct[q] += float(e * v);
          }
          dL[size_t(t)] += e * dot;
        }
        // The chunk's final state: S_out = e^{L_e} S_in + sum_s e^{L_e-L_s} dt_s x_s B_s^T.
        const double Le = L[size_t(n - 1)], eLe = std::exp(Le);
        double sdot = 0;
        for (int64_t i = 0; i < int64_t(P) * N; ++i) {
          dSin[size_t(i)] += eLe * dS[size_t(i)];
          sdot += dS[size_t(i)] * Sin[size_t(i)];
        }
        dL[size_t(n - 1)] += eLe * sdot;
        std::vector<double> dSb(static_cast<size_t>(P));
        for (int64_t s = 0; s < n; ++s) {
          const float* x = xv(c0 + s);
          const float* bs = bv(c0 + s);
          double qs = 0;
          for (int p = 0; p < P; ++p) {
            double v = 0;
            for (int q = 0; q < N; ++q) v += dS[size_t(p) * N + q] * bs[q];
            dSb[size_t(p)] = v;
            qs += double(x[p]) * v;
          }
          const double w = std::exp(Le - L[size_t(s)]), dts = dt[size_t(c0 + s)], term = w * dts * qs;
          dL[size_t(n - 1)] += term;
          dL[size_t(s)] -= term;
          ddt[size_t(s)] += w * qs;
          float* dx = dX.row(c0 + s) + int64_t(h) * P;
          for (int p = 0; p < P; ++p) dx[p] += float(w * dts * dSb[size_t(p)]);
          float* dbs = dB.row(c0 + s) + int64_t(grp) * N;
          for (int q = 0; q < N; ++q) {
            double v = 0;
            for (int p = 0; p < P; ++p) v += dS[size_t(p) * N + q] * x[p];
            dbs[q] += float(w * dts * v);
          }
        }
        // L_t = sum_{r<=t} dt_r A: da_r = sum_{t>=r} dL_t; then dt and A; then the raw dt through softplus.
        double da = 0;
        for (int64_t r = n - 1; r >= 0; --r) {
          da += dL[size_t(r)];
          ddt[size_t(r)] += da * A;
          dA += da * dt[size_t(c0 + r)];
          const double draw = ddt[size_t(r)] * sig[size_t(c0 + r)];
          dDT.row(c0 + r)[h] = float(draw);
          dbias += draw;
        }
        dS.swap(dSin);
      }
      if (dinit)
        for (int64_t i = 0; i < int64_t(P) * N; ++i) dinit[int64_t(h) * P * N + i] = float(dS[size_t(i)]);
      gAlog.p[h] += float(dA * A);  // A = -exp(A_log)
      gD.p[h] += float(dDsum);
      gbias.p[h] += float(dbias);
    }
  }
  for (F32Out* o : {&dX, &dDT, &dB, &dC, &gbias, &gAlog, &gD}) o->commit();
}

}  // namespace ss::cpu
