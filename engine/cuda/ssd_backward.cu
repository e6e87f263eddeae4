// The Mamba2 SSD scan's backward: the chunked algorithm run in reverse, as
// cpu/ssd_backward.cpp derives it (its header has the formulas). A block per
// head: the chunk states are recomputed forward (kept in scratch), then the
// chunks are walked from the last, each taking the gradient of its final
// state and giving dx, d(dt), dB, dC, the gradient of every cumulative decay
// L_t (then of dt and A by a reverse sum) and its incoming state's gradient.
// Within a chunk the work is spread over the block's threads: the
// quadratic form by (t, s) pairs, the state terms by (p, n) entries. Sums
// over long ranges and the state gradients are double; B and C, shared by a
// group's heads, gather their gradients by atomics in fp32 scratch.
// Chunks of 64 tokens whatever a.chunk (the result does not depend on it).
#include <algorithm>

#include "cuda/common.cuh"
#include "cuda/runtime.h"

namespace ss::SS_CUDA_NS {
namespace {

constexpr int kThreads = 256;
constexpr int Lc = 64;

struct HeadScratch {
  float* S;      // (chunks + 1) x P x N: the state entering each chunk, then the final one
  double* dS;    // P x N: the gradient of the current chunk's final state
  double* dSin;  // P x N: ... of its incoming state
  double* CB;    // Lc x Lc: C_t . B_s
  double* DYX;   // Lc x Lc: dy_t . x_s
  float* dxb;    // Lc x P: the chunk's dx
  float* u;      // Lc x P: a per-(t, p) intermediate
};

SS_HD size_t head_scratch_bytes(int64_t chunks, int64_t PN, int64_t P) {
  return sizeof(float) * size_t((chunks + 1) * PN + 2 * Lc * P) + sizeof(double) * size_t(2 * PN + 2 * Lc * Lc);
}

SS_DEV HeadScratch scratch_of(char* base, int64_t chunks, int64_t PN, int64_t P) {
  HeadScratch s;
  double* d = reinterpret_cast<double*>(base);
  s.dS = d;
  s.dSin = d + PN;
  s.CB = d + 2 * PN;
  s.DYX = s.CB + Lc * Lc;
  float* f = reinterpret_cast<float*>(s.DYX + Lc * Lc);
  s.S = f;
  s.dxb = f + (chunks + 1) * PN;
  s.u = s.dxb + Lc * P;
  return s;
}

// dt after bias, softplus and the clamp, and d(dt)/d(raw dt) (0 where clamped).
SS_DEV void dt_and_slope(const SsdDev& a, int64_t t, int h, double& dt, double& slope) {
  const double v = double(at(a.dt, t, h)) + double(at(a.dt_bias, 0, h));
  const double sp = v > 20 ? v : log1p(exp(v));
  const bool clamped = sp < a.dt_min || sp > a.dt_max;
  dt = sp < a.dt_min ? a.dt_min : (sp > a.dt_max ? a.dt_max : sp);
  slope = clamped ? 0.0 : 1.0 / (1.0 + exp(-v));
}

__global__ void __launch_bounds__(kThreads)
    ssd_backward_kernel(SsdDev a, Mat dy, ScanGradsDev g, int64_t T, char* scratch, size_t per_head, float* dB_acc,
                        float* dC_acc) {
  const int h = int(blockIdx.x), H = a.n_heads, P = a.head_dim, N = a.d_state, G = a.n_groups, grp = h / (H / G);
  const int64_t PN = int64_t(P) * N, chunks = (T + Lc - 1) / Lc, GN = int64_t(G) * N;
  const HeadScratch hs = scratch_of(scratch + per_head * size_t(h), chunks, PN, P);
  const double A = -exp(double(at(a.A_log, 0, h))), Dh = at(a.D, 0, h);
  __shared__ double L[Lc], dL[Lc], ddt[Lc], dts[Lc], slopes[Lc], red[kThreads];
  auto xv = [&](int64_t t, int p) { return at(a.x, t, int64_t(h) * P + p); };
  auto bv = [&](int64_t t, int q) { return at(a.B, t, int64_t(grp) * N + q); };
  auto cv = [&](int64_t t, int q) { return at(a.C, t, int64_t(grp) * N + q); };
  auto dyv = [&](int64_t t, int p) { return at(dy, t, int64_t(h) * P + p); };

  // The chunk's dt, slopes and cumulative decays L (thread 0, in order).
  auto load_chunk = [&](int64_t c0, int n) {
    if (threadIdx.x == 0) {
      double acc = 0;
      for (int t = 0; t < n; ++t) {
        dt_and_slope(a, c0 + t, h, dts[t], slopes[t]);
        L[t] = (acc += dts[t] * A);
      }
    }
    __syncthreads();
  };

  // Forward: S[k] enters chunk k. Entry (p, q) of a state depends only on entry (p, q) of the one before.
  for (int64_t e = threadIdx.x; e < PN; e += blockDim.x) hs.S[e] = a.state ? a.state[int64_t(h) * PN + e] : 0.0f;
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t c0 = k * Lc;
    const int n = int(min64(Lc, T - c0));
    load_chunk(c0, n);
    const double Le = L[n - 1];
    const float* in = hs.S + k * PN;
    float* out = hs.S + (k + 1) * PN;
    for (int64_t e = threadIdx.x; e < PN; e += blockDim.x) {
      const int p = int(e / N), q = int(e % N);
      double acc = exp(Le) * in[e];
      for (int s = 0; s < n; ++s) acc += exp(Le - L[s]) * dts[s] * xv(c0 + s, p) * bv(c0 + s, q);
      out[e] = float(acc);
    }
    __syncthreads();  // L is reloaded next
  }

  for (int64_t e = threadIdx.x; e < PN; e += blockDim.x)
    hs.dS[e] = g.dstate_out ? g.dstate_out[int64_t(h) * PN + e] : 0.0;
  double dA = 0, dDsum = 0, dbias = 0;  // thread 0's sums (dDsum: every thread's share)
  double* dS = hs.dS;
  double* dSin = hs.dSin;
  for (int64_t k = chunks - 1; k >= 0; --k) {
    const int64_t c0 = k * Lc;
    const int n = int(min64(Lc, T - c0));
    load_chunk(c0, n);
    const float* Sin = hs.S + k * PN;
    for (int i = threadIdx.x; i < Lc; i += blockDim.x) dL[i] = ddt[i] = 0;
    for (int64_t e = threadIdx.x; e < PN; e += blockDim.x) dSin[e] = 0;
    // D skip and the pair matrices C_t . B_s, dy_t . x_s.
    for (int e = threadIdx.x; e < n * P; e += blockDim.x) {
      const int t = e / P, p = e % P;
      const float d = dyv(c0 + t, p);
      dDsum += double(d) * xv(c0 + t, p);
      hs.dxb[t * P + p] = float(Dh * d);
    }
    for (int e = threadIdx.x; e < n * n; e += blockDim.x) {
      const int t = e / n, s = e % n;
      if (s > t) continue;
      double cb = 0, dyx = 0;
      for (int q = 0; q < N; ++q) cb += double(cv(c0 + t, q)) * bv(c0 + s, q);
      for (int p = 0; p < P; ++p) dyx += double(dyv(c0 + t, p)) * xv(c0 + s, p);
      hs.CB[t * Lc + s] = cb;
      hs.DYX[t * Lc + s] = dyx;
    }
    __syncthreads();
    // Intra-chunk: y_t += sum_{s<=t} e^{L_t - L_s} (C_t . B_s) dt_s x_s.
    for (int e = threadIdx.x; e < n * P; e += blockDim.x) {  // dx_s
      const int s = e / P, p = e % P;
      double acc = 0;
      for (int t = s; t < n; ++t) acc += exp(L[t] - L[s]) * hs.CB[t * Lc + s] * dyv(c0 + t, p);
      hs.dxb[s * P + p] += float(acc * dts[s]);
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) {  // d(dt_s), and dL: row sums in, column sums out
      double dd = 0, row = 0, col = 0;
      for (int t = i; t < n; ++t) {
        const double M = exp(L[t] - L[i]) * hs.CB[t * Lc + i];
        dd += M * hs.DYX[t * Lc + i];
        col += hs.DYX[t * Lc + i] * dts[i] * M;
      }
      for (int s = 0; s <= i; ++s) row += hs.DYX[i * Lc + s] * dts[s] * exp(L[i] - L[s]) * hs.CB[i * Lc + s];
      ddt[i] += dd;
      dL[i] += row - col;
    }
    for (int e = threadIdx.x; e < n * N; e += blockDim.x) {  // dC_t and dB_s of the quadratic form
      const int i = e / N, q = e % N;
      double dc = 0, db = 0;
      for (int s = 0; s <= i; ++s) dc += hs.DYX[i * Lc + s] * dts[s] * exp(L[i] - L[s]) * bv(c0 + s, q);
      for (int t = i; t < n; ++t) db += hs.DYX[t * Lc + i] * dts[i] * exp(L[t] - L[i]) * cv(c0 + t, q);
      atomicAdd(&dC_acc[(c0 + i) * GN + int64_t(grp) * N + q], float(dc));
      atomicAdd(&dB_acc[(c0 + i) * GN + int64_t(grp) * N + q], float(db));
    }
    // The incoming state's term: y_t += e^{L_t} S_in C_t.
    for (int64_t e = threadIdx.x; e < PN; e += blockDim.x) {  // dS_in
      const int p = int(e / N), q = int(e % N);
      double acc = 0;
      for (int t = 0; t < n; ++t) acc += exp(L[t]) * dyv(c0 + t, p) * cv(c0 + t, q);
      dSin[e] += acc;
    }
    for (int e = threadIdx.x; e < n * N; e += blockDim.x) {  // dC_t
      const int t = e / N, q = e % N;
      double acc = 0;
      for (int p = 0; p < P; ++p) acc += double(Sin[int64_t(p) * N + q]) * dyv(c0 + t, p);
      atomicAdd(&dC_acc[(c0 + t) * GN + int64_t(grp) * N + q], float(exp(L[t]) * acc));
    }
    for (int e = threadIdx.x; e < n * P; e += blockDim.x) {  // u[t][p] = (S_in C_t)_p
      const int t = e / P, p = e % P;
      double acc = 0;
      for (int q = 0; q < N; ++q) acc += double(Sin[int64_t(p) * N + q]) * cv(c0 + t, q);
      hs.u[t * P + p] = float(acc);
    }
    __syncthreads();
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
      double dot = 0;
      for (int p = 0; p < P; ++p) dot += double(dyv(c0 + t, p)) * hs.u[t * P + p];
      dL[t] += exp(L[t]) * dot;
    }
    // The chunk's final state: S_out = e^{L_e} S_in + sum_s e^{L_e - L_s} dt_s x_s B_s^T.
    const double Le = L[n - 1], eLe = exp(Le);
    double sdot = 0;
    for (int64_t e = threadIdx.x; e < PN; e += blockDim.x) {
      dSin[e] += eLe * dS[e];
      sdot += dS[e] * Sin[e];
    }
    sdot = block_sum_double(sdot, red);  // also orders u's reads above before its reuse below
    for (int e = threadIdx.x; e < n * P; e += blockDim.x) {  // u[s][p] = (dS B_s)_p
      const int s = e / P, p = e % P;
      double acc = 0;
      for (int q = 0; q < N; ++q) acc += dS[int64_t(p) * N + q] * bv(c0 + s, q);
      hs.u[s * P + p] = float(acc);
    }
    __syncthreads();
    double tail = 0;  // this thread's share of dL at the chunk's last token
    for (int s = threadIdx.x; s < n; s += blockDim.x) {
      double qs = 0;
      for (int p = 0; p < P; ++p) qs += double(xv(c0 + s, p)) * hs.u[s * P + p];
      const double w = exp(Le - L[s]), term = w * dts[s] * qs;
      tail += term;
      dL[s] -= term;
      ddt[s] += w * qs;
    }
    for (int e = threadIdx.x; e < n * P; e += blockDim.x) {
      const int s = e / P, p = e % P;
      hs.dxb[s * P + p] += float(exp(Le - L[s]) * dts[s] * hs.u[s * P + p]);
    }
    for (int e = threadIdx.x; e < n * N; e += blockDim.x) {
      const int s = e / N, q = e % N;
      double acc = 0;
      for (int p = 0; p < P; ++p) acc += dS[int64_t(p) * N + q] * xv(c0 + s, p);
      atomicAdd(&dB_acc[(c0 + s) * GN + int64_t(grp) * N + q], float(exp(Le - L[s]) * dts[s] * acc));
    }
    tail = block_sum_double(tail, red);
    if (threadIdx.x == 0) {
      dL[n - 1] += eLe * sdot + tail;
      // L_t = sum_{r<=t} dt_r A: da_r = sum_{t>=r} dL_t, then dt and A, then the raw dt.
      double da = 0;
      for (int r = n - 1; r >= 0; --r) {
        da += dL[r];
        ddt[r] += da * A;
        dA += da * dts[r];
        const double draw = ddt[r] * slopes[r];
        put(g.ddt, c0 + r, h, float(draw));
        dbias += draw;
      }
    }
    for (int e = threadIdx.x; e < n * P; e += blockDim.x) put(g.dx, c0 + e / P, int64_t(h) * P + e % P, hs.dxb[e]);
    __syncthreads();
    double* swap = dS;
    dS = dSin;
    dSin = swap;
  }
  if (g.dstate_in)
    for (int64_t e = threadIdx.x; e < PN; e += blockDim.x) g.dstate_in[int64_t(h) * PN + e] = float(dS[e]);
  dDsum = block_sum_double(dDsum, red);
  if (threadIdx.x == 0) {
    put(g.dA_log, 0, h, at(g.dA_log, 0, h) + float(dA * A));  // A = -exp(A_log)
    put(g.dD, 0, h, at(g.dD, 0, h) + float(dDsum));
    put(g.d_dt_bias, 0, h, at(g.d_dt_bias, 0, h) + float(dbias));
  }
}

__global__ void write_group_grads_kernel(Mat dB, Mat dC, const float* dB_acc, const float* dC_acc) {
  const int64_t n = dB.rows * dB.cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    put(dB, i / dB.cols, i % dB.cols, dB_acc[i]);
    put(dC, i / dB.cols, i % dB.cols, dC_acc[i]);
  }
}

}  // namespace

void ssd_scan_backward(const SsdDev& a, const Mat& dy, const ScanGradsDev& g, Scratch& scratch, Stream s) {
  expect(a.n_heads > 0 && a.n_groups > 0 && a.n_heads % a.n_groups == 0, "ssd_scan_backward",
         "heads must be a multiple of groups");
  const int64_t T = a.x.rows, H = a.n_heads, PN = int64_t(a.head_dim) * a.d_state, GN = int64_t(a.n_groups) * a.d_state;
  if (T == 0) return;
  const int64_t chunks = (T + Lc - 1) / Lc;
  const size_t per_head = (head_scratch_bytes(chunks, PN, a.head_dim) + 255) & ~size_t(255);
  char* heads = static_cast<char*>(scratch.get(kScratchGrad, int64_t(per_head) * H));
  auto* acc = static_cast<float*>(scratch.get(kScratchGrad2, int64_t(sizeof(float)) * 2 * T * GN));
  memset_device(acc, 0, int64_t(sizeof(float)) * 2 * T * GN, s);
  SS_LAUNCH(ssd_backward_kernel, unsigned(H), kThreads, 0, s)(a, dy, g, T, heads, per_head, acc, acc + T * GN);
  check_launch("ssd_scan_backward");
  SS_LAUNCH(write_group_grads_kernel, blocks_for(T * GN, kThreads), kThreads, 0, s)(g.dB, g.dC, acc, acc + T * GN);
  check_launch("ssd_scan_backward (dB, dC)");
}

}  // namespace ss::SS_CUDA_NS
