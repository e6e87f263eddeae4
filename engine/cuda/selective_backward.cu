// The Mamba (v1) selective scan's backward, chunked as cpu/selective_backward.cpp
// (its header has the formulas): the state is kept at chunk boundaries in a
// forward pass; then, from the last chunk, each chunk's states are recomputed
// from its checkpoint and the reverse recurrence runs through it. A warp per
// channel, a lane per state (d_state <= 256), double arithmetic as the cpu's;
// B and C, shared by every channel, gather their gradients by atomics.
#include "cuda/common.cuh"
#include "cuda/runtime.h"

namespace ss::SS_CUDA_NS {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32, kMax = 256 / 32;

__global__ void __launch_bounds__(kThreads)
    selective_backward_kernel(SelectiveDev a, Mat dy, ScanGradsDev g, int64_t chunk, double* ckpt_all,
                              double* hs_all, float* dB_acc, float* dC_acc) {
  const int64_t T = a.x.rows, Ch = a.x.cols, N = a.d_state, chunks = (T + chunk - 1) / chunk;
  const int lane = int(threadIdx.x % 32);
  for (int64_t c = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; c < Ch; c += int64_t(gridDim.x) * kWarps) {
    double* ckpt = ckpt_all + c * (chunks + 1) * N;  // the state entering each chunk
    double* hs = hs_all + c * (chunk + 1) * N;       // one chunk's states, recomputed
    double A[kMax], dA[kMax], dh[kMax];
    for (int j = 0; j < kMax; ++j) {
      const int64_t n = lane + 32 * j;
      A[j] = n < N ? -exp(double(load(a.A_log.p, c * N + n, a.A_log.dt))) : 0.0;
      dA[j] = 0;
      dh[j] = n < N && g.dstate_out ? g.dstate_out[c * N + n] : 0.0;
      if (n < N) ckpt[n] = a.state ? a.state[c * N + n] : 0.0;
    }
    const double bias = at(a.dt_bias, 0, c), Dc = at(a.D, 0, c);
    auto dt_of = [&](int64_t t) {
      const double v = double(at(a.dt, t, c)) + bias;
      return v > 20 ? v : log1p(exp(v));
    };
    for (int64_t k = 0; k < chunks; ++k)
      for (int j = 0; j < kMax; ++j) {
        const int64_t n = lane + 32 * j;
        if (n >= N) break;
        double h = ckpt[k * N + n];
        for (int64_t t = k * chunk; t < min64(T, (k + 1) * chunk); ++t) {
          const double dt = dt_of(t);
          h = exp(dt * A[j]) * h + dt * at(a.x, t, c) * at(a.B, t, n);
        }
        ckpt[(k + 1) * N + n] = h;
      }
    double dDsum = 0, dbias = 0;
    for (int64_t k = chunks - 1; k >= 0; --k) {
      const int64_t c0 = k * chunk, len = min64(chunk, T - c0);
      for (int j = 0; j < kMax; ++j) {  // hs[i]: the state after token c0 + i - 1
        const int64_t n = lane + 32 * j;
        if (n >= N) break;
        double h = ckpt[k * N + n];
        hs[n] = h;
        for (int64_t i = 0; i < len; ++i) {
          const double dt = dt_of(c0 + i);
          h = exp(dt * A[j]) * h + dt * at(a.x, c0 + i, c) * at(a.B, c0 + i, n);
          hs[(i + 1) * N + n] = h;
        }
      }
      for (int64_t i = len - 1; i >= 0; --i) {
        const int64_t t = c0 + i;
        const double x = at(a.x, t, c), dt = dt_of(t), v = double(at(a.dt, t, c)) + bias;
        double s = 0;
        for (int j = 0; j < kMax; ++j) {
          const int64_t n = lane + 32 * j;
          if (n < N) s += hs[(i + 1) * N + n] * at(a.C, t, n);
        }
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        const double pre = s + Dc * x;
        double dpre = at(dy, t, c);
        if (a.z.p) {
          const double zv = at(a.z, t, c), sz = 1.0 / (1.0 + exp(-zv));
          if (lane == 0) put(g.dz, t, c, float(dpre * pre * sz * (1.0 + zv * (1.0 - sz))));
          dpre *= zv * sz;
        }
        dDsum += dpre * x;
        double dx = 0, ddt = 0;
        for (int j = 0; j < kMax; ++j) {
          const int64_t n = lane + 32 * j;
          if (n >= N) break;
          const double Bt = at(a.B, t, n), Ct = at(a.C, t, n), hp = hs[i * N + n];
          dh[j] += dpre * Ct;
          atomicAdd(&dC_acc[t * N + n], float(dpre * hs[(i + 1) * N + n]));
          const double e = exp(dt * A[j]), dde = dh[j] * hp * e;
          ddt += dde * A[j] + dh[j] * x * Bt;
          dA[j] += dde * dt;
          dx += dh[j] * dt * Bt;
          atomicAdd(&dB_acc[t * N + n], float(dh[j] * dt * x));
          dh[j] *= e;
        }
        for (int o = 16; o > 0; o >>= 1) {
          dx += __shfl_xor_sync(0xffffffffu, dx, o);
          ddt += __shfl_xor_sync(0xffffffffu, ddt, o);
        }
        const double draw = ddt / (1.0 + exp(-v));
        if (lane == 0) {
          put(g.dx, t, c, float(dx + dpre * Dc));
          put(g.ddt, t, c, float(draw));
        }
        dbias += draw;
      }
    }
    for (int j = 0; j < kMax; ++j) {
      const int64_t n = lane + 32 * j;
      if (n >= N) break;
      if (g.dstate_in) g.dstate_in[c * N + n] = float(dh[j]);
      const int64_t idx = c * N + n;
      store(g.dA_log.p, idx, g.dA_log.dt, load(g.dA_log.p, idx, g.dA_log.dt) + float(dA[j] * A[j]));
    }
    if (lane == 0) {
      put(g.dD, 0, c, at(g.dD, 0, c) + float(dDsum));
      put(g.d_dt_bias, 0, c, at(g.d_dt_bias, 0, c) + float(dbias));
    }
  }
}

__global__ void write_bc_grads_kernel(Mat dB, Mat dC, const float* dB_acc, const float* dC_acc) {
  const int64_t n = dB.rows * dB.cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    put(dB, i / dB.cols, i % dB.cols, dB_acc[i]);
    put(dC, i / dB.cols, i % dB.cols, dC_acc[i]);
  }
}

}  // namespace

void selective_scan_backward(const SelectiveDev& a, const Mat& dy, const ScanGradsDev& g, int64_t chunk,
                             Scratch& scratch, Stream s) {
  expect(a.d_state > 0 && a.d_state <= 256 && chunk > 0, "selective_scan_backward", "d_state 1 to 256");
  const int64_t T = a.x.rows, Ch = a.x.cols, N = a.d_state, chunks = (T + chunk - 1) / chunk;
  if (T * Ch == 0) return;
  auto* ckpt = static_cast<double*>(scratch.get(kScratchGrad, int64_t(sizeof(double)) * Ch * (chunks + 1) * N));
  auto* hs = static_cast<double*>(scratch.get(kScratchGrad3, int64_t(sizeof(double)) * Ch * (chunk + 1) * N));
  auto* acc = static_cast<float*>(scratch.get(kScratchGrad2, int64_t(sizeof(float)) * 2 * T * N));
  memset_device(acc, 0, int64_t(sizeof(float)) * 2 * T * N, s);
  SS_LAUNCH(selective_backward_kernel, blocks_for(Ch, kWarps), kThreads, 0, s)(a, dy, g, chunk, ckpt, hs, acc,
                                                                                acc + T * N);
  check_launch("selective_scan_backward");
  SS_LAUNCH(write_bc_grads_kernel, blocks_for(T * N, kThreads), kThreads, 0, s)(g.dB, g.dC, acc, acc + T * N);
  check_launch("selective_scan_backward (dB, dC)");
}

}  // namespace ss::SS_CUDA_NS
