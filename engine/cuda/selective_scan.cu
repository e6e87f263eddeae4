// Mamba's selective scan (Gu & Dao 2023, Alg. 2), per channel c with its own
// A[c][n]: dt = softplus(dt_raw + bias_c), h_t = e^{dt A} o h_{t-1} + dt B_t x_t,
// y_t = (h_t . C_t + D_c x_t) silu(z_t). A warp per channel walks the tokens
// in order, a lane per state (d_state <= 256), the dot product by shuffles;
// the state in fp32 whatever the dtype.
#include "cuda/common.cuh"

namespace ss::SS_CUDA_NS {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32, kMaxStates = 256 / 32;

__global__ void __launch_bounds__(kThreads) selective_scan_kernel(SelectiveDev a) {
  const int64_t T = a.x.rows, Di = a.x.cols, N = a.d_state;
  const int lane = int(threadIdx.x % 32);
  for (int64_t c = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; c < Di; c += int64_t(gridDim.x) * kWarps) {
    float A[kMaxStates], h[kMaxStates];
    for (int j = 0; j < kMaxStates; ++j) {
      const int64_t n = lane + 32 * j;
      A[j] = n < N ? -expf(load(a.A_log.p, c * N + n, a.A_log.dt)) : 0.0f;
      h[j] = n < N && a.state ? a.state[c * N + n] : 0.0f;
    }
    const float bias = at(a.dt_bias, 0, c), Dc = at(a.D, 0, c);
    double dt_total = 0;
    for (int64_t t = 0; t < T; ++t) {
      const float xv = at(a.x, t, c), dt = softplus(at(a.dt, t, c) + bias);
      dt_total += dt;
      float acc = 0.0f;
      for (int j = 0; j < kMaxStates; ++j) {
        const int64_t n = lane + 32 * j;
        if (n >= N) break;
        h[j] = expf(dt * A[j]) * h[j] + dt * at(a.B, t, n) * xv;
        acc += h[j] * at(a.C, t, n);
      }
      acc = warp_sum(acc);
      float y = acc + Dc * xv;
      if (a.z.p) y *= silu(at(a.z, t, c));
      if (lane == 0) put(a.y, t, c, y);
    }
    if (a.state)
      for (int j = 0; j < kMaxStates; ++j)
        if (lane + 32 * j < N) a.state[c * N + lane + 32 * j] = h[j];
    if (a.dt_sum && lane == 0) a.dt_sum[c] = float(dt_total);
  }
}

// y_t += silu(z_t) sum_n C_t[n] e^{A[c][n] cumdt_t} S[c][n], the incoming
// state's contribution to tokens scanned from zero.
__global__ void __launch_bounds__(kThreads) selective_correction_kernel(SelectiveDev a) {
  const int64_t T = a.y.rows, Di = a.y.cols, N = a.d_state;
  const int lane = int(threadIdx.x % 32);
  for (int64_t c = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; c < Di; c += int64_t(gridDim.x) * kWarps) {
    const float bias = at(a.dt_bias, 0, c);
    float cum = 0.0f;
    for (int64_t t = 0; t < T; ++t) {
      cum += softplus(at(a.dt, t, c) + bias);
      float acc = 0.0f;
      for (int64_t n = lane; n < N; n += 32)
        acc += at(a.C, t, n) * expf(-expf(load(a.A_log.p, c * N + n, a.A_log.dt)) * cum) * a.state[c * N + n];
      acc = warp_sum(acc);
      if (a.z.p) acc *= silu(at(a.z, t, c));
      if (lane == 0) put(a.y, t, c, at(a.y, t, c) + acc);
    }
  }
}

}  // namespace

void selective_scan(const SelectiveDev& a, Stream s) {
  expect(a.d_state > 0 && a.d_state <= 256, "selective_scan", "d_state 1 to 256");
  if (a.x.rows * a.x.cols == 0) return;
  SS_LAUNCH(selective_scan_kernel, blocks_for(a.x.cols, kWarps), kThreads, 0, s)(a);
  check_launch("selective_scan");
}

void selective_state_correction(const SelectiveDev& a, Stream s) {
  expect(a.state != nullptr && a.d_state > 0, "selective_state_correction", "needs the incoming state");
  if (a.y.rows * a.y.cols == 0) return;
  SS_LAUNCH(selective_correction_kernel, blocks_for(a.y.cols, kWarps), kThreads, 0, s)(a);
  check_launch("selective_state_correction");
}

}  // namespace ss::SS_CUDA_NS
