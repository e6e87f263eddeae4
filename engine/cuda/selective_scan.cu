// Mamba's selective scan (Gu & Dao 2023, Alg. 2), per channel c with its own
// A[c][n]: dt = softplus(dt_raw + bias_c), h_t = e^{dt A} o h_{t-1} + dt B_t x_t,
// y_t = (h_t . C_t + D_c x_t) silu(z_t). A segment of S lanes per channel
// (S: d_state rounded up to a power of two, 8 to 32; a warp holds 32 / S
// channels) walks the tokens in order, a lane per state (PER states a lane
// past 32), the dot product by shuffles within the segment; the state in fp32
// whatever the dtype. Tokens go U at a time: their loads are issued together,
// so a step waits for memory once per U tokens, and the U dot products'
// shuffles, off the state's chain, overlap.
#include "cuda/common.cuh"

namespace ss::SS_CUDA_NS {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32, kMaxStates = 256 / 32;

template <int S>
SS_DEV float segment_sum(float v) {
#pragma unroll
  for (int o = S / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int S, int PER, int U>
__global__ void __launch_bounds__(kThreads) selective_scan_kernel(SelectiveDev a) {
  constexpr int kChannels = 32 / S;  // a warp's
  const int64_t T = a.x.rows, Di = a.x.cols, N = a.d_state;
  const int lane = int(threadIdx.x % S), seg = int(threadIdx.x % 32 / S);
  for (int64_t base = (int64_t(blockIdx.x) * kWarps + threadIdx.x / 32) * kChannels; base < Di;
       base += int64_t(gridDim.x) * kWarps * kChannels) {
    const int64_t c = base + seg;
    const bool live = c < Di;  // a dead segment still shuffles with the live ones
    float A[PER], h[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int64_t n = lane + S * j;
      A[j] = live && n < N ? -expf(load(a.A_log.p, c * N + n, a.A_log.dt)) : 0.0f;
      h[j] = live && n < N && a.state ? a.state[c * N + n] : 0.0f;
    }
    const float bias = live ? at(a.dt_bias, 0, c) : 0.0f, Dc = live ? at(a.D, 0, c) : 0.0f;
    double dt_total = 0;
    for (int64_t t0 = 0; t0 < T; t0 += U) {
      float xv[U], dtv[U], zv[U], Bv[U][PER], Cv[U][PER];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t t = t0 + u;
        const bool ok = live && t < T;
        xv[u] = ok ? at(a.x, t, c) : 0.0f;
        dtv[u] = ok ? softplus(at(a.dt, t, c) + bias) : 0.0f;  // 0 past the end: the state stays
        zv[u] = ok && a.z.p ? at(a.z, t, c) : 0.0f;
#pragma unroll
        for (int j = 0; j < PER; ++j) {
          const int64_t n = lane + S * j;
          Bv[u][j] = ok && n < N ? at(a.B, t, n) : 0.0f;
          Cv[u][j] = ok && n < N ? at(a.C, t, n) : 0.0f;
        }
      }
      float part[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        dt_total += dtv[u];
        part[u] = 0.0f;
#pragma unroll
        for (int j = 0; j < PER; ++j) {
          h[j] = expf(dtv[u] * A[j]) * h[j] + dtv[u] * Bv[u][j] * xv[u];
          part[u] += h[j] * Cv[u][j];
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) part[u] = segment_sum<S>(part[u]);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (lane != 0 || !live || t0 + u >= T) continue;
        float y = part[u] + Dc * xv[u];
        if (a.z.p) y *= silu(zv[u]);
        put(a.y, t0 + u, c, y);
      }
    }
    if (live && a.state)
#pragma unroll
      for (int j = 0; j < PER; ++j)
        if (lane + S * j < N) a.state[c * N + lane + S * j] = h[j];
    if (live && a.dt_sum && lane == 0) a.dt_sum[c] = float(dt_total);
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
  // d_state 8 or less: 4 channels a warp; 16 or less: 2; else one, with
  // d_state / 32 states a lane (rounded up to 1, 2, 4 or 8).
  const int64_t N = a.d_state;
  auto* kernel = N <= 8    ? &selective_scan_kernel<8, 1, 8>
                 : N <= 16 ? &selective_scan_kernel<16, 1, 8>
                 : N <= 32 ? &selective_scan_kernel<32, 1, 8>
                 : N <= 64 ? &selective_scan_kernel<32, 2, 2>
                 : N <= 128 ? &selective_scan_kernel<32, 4, 2>
                            : &selective_scan_kernel<32, kMaxStates, 2>;
  const int64_t per_block = a.d_state <= 8 ? 4 * kWarps : a.d_state <= 16 ? 2 * kWarps : kWarps;
  SS_LAUNCH(kernel, blocks_for(a.x.cols, per_block), kThreads, 0, s)(a);
  check_launch("selective_scan");
}

void selective_state_correction(const SelectiveDev& a, Stream s) {
  expect(a.state != nullptr && a.d_state > 0, "selective_state_correction", "needs the incoming state");
  if (a.y.rows * a.y.cols == 0) return;
  SS_LAUNCH(selective_correction_kernel, blocks_for(a.y.cols, kWarps), kThreads, 0, s)(a);
  check_launch("selective_state_correction");
}

}  // namespace ss::SS_CUDA_NS
