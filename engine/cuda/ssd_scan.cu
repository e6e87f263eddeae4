// Mamba2's SSD scan (Dao & Gu 2024, "Transformers are SSMs", §6), per head h
// of group g: dt_t = clamp(softplus(dt_raw + bias_h)), a_t = dt_t A_h,
// S_t = e^{a_t} S_{t-1} + dt_t x_t B_t^T, y_t = S_t C_t + D_h x_t.
// In chunks of L = 64 tokens, in fp32 whatever the dtype (as mamba_ssm):
//   ssd_prep      dt, and cum_t = the sum of a within the chunk, per token
//   ssd_chunk_state  each chunk's own state from zero: X^T (B e^{cum_L - cum} dt)
//   ssd_pass      the states in order: S_in(c) = S, S = e^{cum_L(c)} S + state(c)
//   ssd_output    y = (C B^T o e^{cum_t - cum_s} dt_s, lower triangle) X
//                     + e^{cum_t} C S_in^T + D x
// A window of chunks at a time bounds the chunk states' scratch. A few
// tokens (decode) run the recurrence itself on the state, in place.
#include <algorithm>

#include "cuda/common.cuh"
#include "cuda/runtime.h"

namespace ss::SS_CUDA_NS {
namespace {

constexpr int kThreads = 256;
constexpr int L = 64;         // chunk length
constexpr int KP = 64;        // d_state columns staged at a time
constexpr int kMaxPer = 64;   // outputs per thread in ssd_output: L * head_dim / kThreads, head_dim <= 256
constexpr int64_t kRecurrentTokens = 16;

SS_DEV float dt_of(const SsdDev& a, int64_t t, int h) {
  const float v = softplus(at(a.dt, t, h) + at(a.dt_bias, 0, h));
  return fminf(fmaxf(v, a.dt_min), a.dt_max);
}
SS_DEV float A_of(const SsdDev& a, int h) { return -expf(at(a.A_log, 0, h)); }

// Block (chunk c, head h), L threads: dt and the chunk's running sum of a.
__global__ void ssd_prep_kernel(SsdDev a, int64_t T, float* dtv, float* cum, float* chunk_total) {
  const int64_t c = blockIdx.x, t = c * L + threadIdx.x;
  const int h = int(blockIdx.y), H = a.n_heads;
  __shared__ float av[L];
  const float d = t < T ? dt_of(a, t, h) : 0.0f;
  av[threadIdx.x] = d * A_of(a, h);
  __syncthreads();
  if (threadIdx.x == 0) {
    float run = 0.0f;
    for (int i = 0; i < L && c * L + i < T; ++i) {
      run += av[i];
      av[i] = run;
    }
    chunk_total[c * H + h] = run;
  }
  __syncthreads();
  if (t < T) {
    dtv[t * H + h] = d;
    cum[t * H + h] = av[threadIdx.x];
  }
}

// log_decay[h] = sum_t dt_t A_h, summed in double as the cpu does.
__global__ void ssd_log_decay_kernel(SsdDev a, int64_t T, const float* dtv) {
  const int h = int(blockIdx.x);
  __shared__ double red[kThreads];
  double sum = 0;
  const float A = A_of(a, h);
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x) sum += double(dtv[t * a.n_heads + h] * A);
  red[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) red[threadIdx.x] += red[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) a.log_decay[h] = float(red[0]);
}

// Block (chunk c0 + blockIdx.x, head h): state[blockIdx.x][h] (P x N, fp32)
// = sum_s x_s (B_s e^{cum_last - cum_s} dt_s)^T over the chunk's tokens.
__global__ void __launch_bounds__(kThreads)
    ssd_chunk_state_kernel(SsdDev a, int64_t T, int64_t c0, const float* dtv, const float* cum, float* states) {
  const int P = a.head_dim, N = a.d_state, H = a.n_heads, h = int(blockIdx.y), g = h / (H / a.n_groups);
  const int64_t c = c0 + blockIdx.x, t0 = c * L;
  const int len = int(min64(L, T - t0));
  SS_DYNAMIC_SMEM(float, smem);
  float* X = smem;            // [L][P + 1]
  float* Bw = X + L * (P + 1);  // [L][KP + 1]
  for (int i = threadIdx.x; i < L * P; i += blockDim.x) {
    const int s = i / P, p = i % P;
    X[s * (P + 1) + p] = s < len ? at(a.x, t0 + s, int64_t(h) * P + p) : 0.0f;
  }
  const float last = cum[(t0 + len - 1) * H + h];
  float* out = states + (int64_t(blockIdx.x) * H + h) * int64_t(P) * N;
  for (int n0 = 0; n0 < N; n0 += KP) {
    const int kn = imin(KP, N - n0);
    __syncthreads();  // X is staged; the previous piece is read
    for (int i = threadIdx.x; i < L * KP; i += blockDim.x) {
      const int s = i / KP, n = i % KP;
      float v = 0.0f;
      if (s < len && n < kn) {
        const int64_t t = t0 + s;
        v = at(a.B, t, int64_t(g) * N + n0 + n) * expf(last - cum[t * H + h]) * dtv[t * H + h];
      }
      Bw[s * (KP + 1) + n] = v;
    }
    __syncthreads();
    // Thread: column n = tid % KP, rows p = tid / KP + 4 i.
    const int n = threadIdx.x % KP;
    for (int p = threadIdx.x / KP; p < P; p += kThreads / KP) {
      float acc = 0.0f;
      for (int s = 0; s < len; ++s) acc += X[s * (P + 1) + p] * Bw[s * (KP + 1) + n];
      if (n < kn) out[int64_t(p) * N + n0 + n] = acc;
    }
  }
}

// A thread per state value (h, p, n), through the window's chunks in order:
// each chunk's state is replaced by the state entering it.
__global__ void ssd_pass_kernel(int64_t H, int64_t PN, int64_t c0, int64_t chunks, const float* chunk_total,
                                float* states, float* carry) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < H * PN; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = i / PN;
    float S = carry[i];
    for (int64_t c = 0; c < chunks; ++c) {
      float* st = states + c * H * PN + i;
      const float own = *st;
      *st = S;
      S = expf(chunk_total[(c0 + c) * H + h]) * S + own;
    }
    carry[i] = S;
  }
}

// Block (chunk c0 + blockIdx.x, head h): the chunk's outputs.
__global__ void __launch_bounds__(kThreads)
    ssd_output_kernel(SsdDev a, int64_t T, int64_t c0, const float* dtv, const float* cum, const float* states) {
  const int P = a.head_dim, N = a.d_state, H = a.n_heads, h = int(blockIdx.y), g = h / (H / a.n_groups);
  const int64_t c = c0 + blockIdx.x, t0 = c * L;
  const int len = int(min64(L, T - t0));
  SS_DYNAMIC_SMEM(float, smem);
  float* M = smem;               // [L][L + 1]
  float* R = M + L * (L + 1);    // the rest, reused by each phase
  const float* S_in = states + (int64_t(blockIdx.x) * H + h) * int64_t(P) * N;

  // M = C B^T over the chunk, d_state in pieces.
  float* Cp = R;                  // [L][KP + 1]
  float* Bp = Cp + L * (KP + 1);  // [L][KP + 1]
  float m_acc[L * L / kThreads];
  for (int i = 0; i < L * L / kThreads; ++i) m_acc[i] = 0.0f;
  for (int n0 = 0; n0 < N; n0 += KP) {
    const int kn = imin(KP, N - n0);
    __syncthreads();
    for (int i = threadIdx.x; i < L * KP; i += blockDim.x) {
      const int s = i / KP, n = i % KP;
      const bool ok = s < len && n < kn;
      Cp[s * (KP + 1) + n] = ok ? at(a.C, t0 + s, int64_t(g) * N + n0 + n) : 0.0f;
      Bp[s * (KP + 1) + n] = ok ? at(a.B, t0 + s, int64_t(g) * N + n0 + n) : 0.0f;
    }
    __syncthreads();
    for (int i = 0; i < L * L / kThreads; ++i) {
      const int idx = threadIdx.x + kThreads * i, t = idx / L, s = idx % L;
      float acc = 0.0f;
      for (int n = 0; n < kn; ++n) acc += Cp[t * (KP + 1) + n] * Bp[s * (KP + 1) + n];
      m_acc[i] += acc;
    }
  }
  // The causal mask, the decay from s to t and dt_s.
  for (int i = 0; i < L * L / kThreads; ++i) {
    const int idx = threadIdx.x + kThreads * i, t = idx / L, s = idx % L;
    float v = 0.0f;
    if (s <= t && t < len)
      v = m_acc[i] * expf(cum[(t0 + t) * H + h] - cum[(t0 + s) * H + h]) * dtv[(t0 + s) * H + h];
    M[t * (L + 1) + s] = v;
  }
  __syncthreads();  // M is complete; the pieces are read
  // Y = M X, X staged over the pieces' space.
  float* X = R;  // [L][P + 1]
  for (int i = threadIdx.x; i < L * P; i += blockDim.x) {
    const int s = i / P, p = i % P;
    X[s * (P + 1) + p] = s < len ? at(a.x, t0 + s, int64_t(h) * P + p) : 0.0f;
  }
  __syncthreads();
  float y[kMaxPer];
  for (int i = 0; i < kMaxPer; ++i) {
    y[i] = 0.0f;
    const int idx = threadIdx.x + kThreads * i;
    if (idx >= L * P) continue;
    const int t = idx / P, p = idx % P;
    float acc = 0.0f;
    for (int s = 0; s <= t; ++s) acc += M[t * (L + 1) + s] * X[s * (P + 1) + p];
    y[i] = acc;
  }
  // + e^{cum_t} C_t S_in^T, d_state in pieces: C [L][KP], S_in [P][KP].
  float* Sp = Cp + L * (KP + 1);  // [P][KP + 1]
  float z[kMaxPer];
  for (int i = 0; i < kMaxPer; ++i) z[i] = 0.0f;
  for (int n0 = 0; n0 < N; n0 += KP) {
    const int kn = imin(KP, N - n0);
    __syncthreads();  // X (first piece) or the previous piece is read
    for (int i = threadIdx.x; i < L * KP; i += blockDim.x) {
      const int s = i / KP, n = i % KP;
      Cp[s * (KP + 1) + n] = s < len && n < kn ? at(a.C, t0 + s, int64_t(g) * N + n0 + n) : 0.0f;
    }
    for (int i = threadIdx.x; i < P * KP; i += blockDim.x) {
      const int p = i / KP, n = i % KP;
      Sp[p * (KP + 1) + n] = n < kn ? S_in[int64_t(p) * N + n0 + n] : 0.0f;
    }
    __syncthreads();
    for (int i = 0; i < kMaxPer; ++i) {
      const int idx = threadIdx.x + kThreads * i;
      if (idx >= L * P) continue;
      const int t = idx / P, p = idx % P;
      float acc = 0.0f;
      for (int n = 0; n < kn; ++n) acc += Cp[t * (KP + 1) + n] * Sp[p * (KP + 1) + n];
      z[i] += acc;
    }
  }
  const float Dh = at(a.D, 0, h);
  for (int i = 0; i < kMaxPer; ++i) {
    const int idx = threadIdx.x + kThreads * i;
    if (idx >= L * P) continue;
    const int t = idx / P, p = idx % P;
    if (t >= len) continue;
    const int64_t tt = t0 + t, col = int64_t(h) * P + p;
    put(a.y, tt, col, y[i] + expf(cum[tt * H + h]) * z[i] + Dh * at(a.x, tt, col));
  }
}

// A few tokens: the recurrence, a block per head, a warp per state row p.
__global__ void __launch_bounds__(kThreads) ssd_recurrent_kernel(SsdDev a, int64_t T, float* states) {
  const int P = a.head_dim, N = a.d_state, H = a.n_heads, h = int(blockIdx.x), g = h / (H / a.n_groups);
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32), warps = kThreads / 32;
  float* S = states + int64_t(h) * P * N;
  const float A = A_of(a, h), Dh = at(a.D, 0, h);
  for (int64_t t = 0; t < T; ++t) {
    const float dt = dt_of(a, t, h), decay = expf(dt * A);
    for (int p = warp; p < P; p += warps) {
      const float x = at(a.x, t, int64_t(h) * P + p), xb = dt * x;
      float acc = 0.0f;
      for (int n = lane; n < N; n += 32) {
        const float s = decay * S[int64_t(p) * N + n] + xb * at(a.B, t, int64_t(g) * N + n);
        S[int64_t(p) * N + n] = s;
        acc += s * at(a.C, t, int64_t(g) * N + n);
      }
      acc = warp_sum(acc);
      if (lane == 0) put(a.y, t, int64_t(h) * P + p, acc + Dh * x);
    }
  }
}

// y_t += e^{cum_t} C_t S_h^T with cum over the whole sequence: the chunk's
// running sum plus the totals of the chunks before.
__global__ void ssd_correction_kernel(SsdDev a, int64_t T, const float* cum, const float* chunk_offset) {
  const int P = a.head_dim, N = a.d_state, H = a.n_heads;
  const int64_t n = T * H * P;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / (int64_t(H) * P);
    const int h = int(i / P % H), p = int(i % P), g = h / (H / a.n_groups);
    const float e = expf(chunk_offset[(t / L) * H + h] + cum[t * H + h]);
    const float* S = a.state + (int64_t(h) * P + p) * N;
    float acc = 0.0f;
    for (int k = 0; k < N; ++k) acc += at(a.C, t, int64_t(g) * N + k) * S[k];
    const int64_t col = int64_t(h) * P + p;
    put(a.y, t, col, at(a.y, t, col) + e * acc);
  }
}

// Exclusive prefix of the chunk totals, per head (a thread per head).
__global__ void ssd_chunk_offset_kernel(int64_t chunks, int H, const float* chunk_total, float* offset) {
  for (int h = int(blockIdx.x * blockDim.x + threadIdx.x); h < H; h += int(gridDim.x * blockDim.x)) {
    float run = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) {
      offset[c * H + h] = run;
      run += chunk_total[c * H + h];
    }
  }
}

void check_shapes(const SsdDev& a, const char* op) {
  expect(a.n_heads > 0 && a.n_groups > 0 && a.n_heads % a.n_groups == 0, op, "heads must be a multiple of groups");
  expect(a.head_dim > 0 && a.head_dim <= 256 && a.d_state > 0, op, "head width 1 to 256");
}

// dt, the within-chunk sums and the chunk totals in scratch.
struct Prep {
  float *dtv, *cum, *total;
};
Prep prep(const SsdDev& a, int64_t T, Scratch& scratch, Stream s) {
  const int64_t H = a.n_heads, chunks = (T + L - 1) / L;
  float* base = static_cast<float*>(scratch.get(kScratchScan, int64_t(sizeof(float)) * (2 * T * H + chunks * H)));
  Prep p{base, base + T * H, base + 2 * T * H};
  SS_LAUNCH(ssd_prep_kernel, dim3(unsigned(chunks), unsigned(H)), L, 0, s)(a, T, p.dtv, p.cum, p.total);
  check_launch("ssd_scan (prep)");
  return p;
}

}  // namespace

void ssd_scan(const SsdDev& a, Scratch& scratch, Stream s) {
  check_shapes(a, "ssd_scan");
  const int64_t T = a.x.rows, H = a.n_heads, P = a.head_dim, N = a.d_state, PN = P * N;
  if (T == 0) return;
  const Prep pr = prep(a, T, scratch, s);
  if (a.log_decay) {
    SS_LAUNCH(ssd_log_decay_kernel, unsigned(H), kThreads, 0, s)(a, T, pr.dtv);
    check_launch("ssd_scan (log decay)");
  }
  // The state carried in: the caller's (updated in place) or zeros.
  float* carry = a.state;
  if (!carry) {
    carry = static_cast<float*>(scratch.get(kScratchScan2, int64_t(sizeof(float)) * H * PN));
    memset_device(carry, 0, int64_t(sizeof(float)) * H * PN, s);
  }
  if (T <= kRecurrentTokens) {
    SS_LAUNCH(ssd_recurrent_kernel, unsigned(H), kThreads, 0, s)(a, T, carry);
    check_launch("ssd_scan (recurrent)");
    return;
  }
  const int64_t chunks = (T + L - 1) / L;
  constexpr int64_t kStateScratch = int64_t(64) << 20;
  const int64_t window = std::max<int64_t>(1, std::min<int64_t>(chunks, kStateScratch / (int64_t(sizeof(float)) * H * PN)));
  float* states = static_cast<float*>(scratch.get(kScratchScan3, int64_t(sizeof(float)) * window * H * PN));
  const size_t state_smem = sizeof(float) * (size_t(L) * (P + 1) + size_t(L) * (KP + 1));
  const size_t out_smem =
      sizeof(float) * (size_t(L) * (L + 1) + std::max<size_t>(std::max<size_t>(2 * L * (KP + 1), size_t(L) * (P + 1)),
                                                              size_t(L + P) * (KP + 1)));
  auto* state_kernel = &ssd_chunk_state_kernel;
  auto* output_kernel = &ssd_output_kernel;
  SS_SMEM_LIMIT(state_kernel, state_smem);
  SS_SMEM_LIMIT(output_kernel, out_smem);
  for (int64_t c0 = 0; c0 < chunks; c0 += window) {
    const int64_t wc = std::min(window, chunks - c0);
    SS_LAUNCH(state_kernel, dim3(unsigned(wc), unsigned(H)), kThreads, state_smem, s)(a, T, c0, pr.dtv, pr.cum,
                                                                                       states);
    check_launch("ssd_scan (chunk states)");
    SS_LAUNCH(ssd_pass_kernel, blocks_for(H * PN, kThreads), kThreads, 0, s)(H, PN, c0, wc, pr.total, states, carry);
    check_launch("ssd_scan (state passing)");
    SS_LAUNCH(output_kernel, dim3(unsigned(wc), unsigned(H)), kThreads, out_smem, s)(a, T, c0, pr.dtv, pr.cum,
                                                                                     states);
    check_launch("ssd_scan (outputs)");
  }
}

void ssd_state_correction(const SsdDev& a, Scratch& scratch, Stream s) {
  check_shapes(a, "ssd_state_correction");
  expect(a.state != nullptr, "ssd_state_correction", "needs the incoming state");
  const int64_t T = a.y.rows, H = a.n_heads;
  if (T == 0) return;
  const Prep pr = prep(a, T, scratch, s);
  const int64_t chunks = (T + L - 1) / L;
  float* offset = static_cast<float*>(scratch.get(kScratchScan2, int64_t(sizeof(float)) * chunks * H));
  SS_LAUNCH(ssd_chunk_offset_kernel, blocks_for(H, 64), 64, 0, s)(chunks, int(H), pr.total, offset);
  check_launch("ssd_state_correction (offsets)");
  SS_LAUNCH(ssd_correction_kernel, blocks_for(T * H * a.head_dim, kThreads), kThreads, 0, s)(a, T, pr.cum, offset);
  check_launch("ssd_state_correction");
}

}  // namespace ss::SS_CUDA_NS
