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

// The chunk kernels' products on CUDA cores, each an L x 64 tile of fp32
// sums in shared memory: a thread owns one column (tid % 64) and 16 rows
// (kRowsOf), keeping their sums in registers. The reduction runs outermost,
// four steps at a time: the row operand (the same for the 32 threads of a
// warp) comes as one 16-byte broadcast load, the column operand as four
// conflict-free loads, for 64 multiply-adds -- rather than two loads each.
constexpr int kRows = 16;              // rows a thread sums
constexpr int kCols = 64;              // columns of a tile
constexpr int kStride4 = 68;           // row stride of a broadcast operand: 16-byte aligned rows
constexpr int kStride1 = kCols + 1;    // row stride of a column operand: conflict-free columns
static_assert(L % 4 == 0 && KP == kCols && kThreads == kCols * (L / kRows), "one tile a block");

SS_DEV int col_of() { return int(threadIdx.x % kCols); }
SS_DEV int row_of(int i) { return int(threadIdx.x / kCols) * kRows + i; }  // rows of a warp: 16 in a run

// acc[i] += sum over k < kn (rounded up to 4) of row(row_of(i))[k] * col(k): `row` rows of
// kStride4 floats, `col` the column's k-th value at col[k * col_step].
SS_DEV void sum_rows(float (&acc)[kRows], const float* row, const float* col, int col_step, int kn) {
  for (int k = 0; k < kn; k += 4) {
    const float c0 = col[k * col_step], c1 = col[(k + 1) * col_step], c2 = col[(k + 2) * col_step],
                c3 = col[(k + 3) * col_step];
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      float r[4];
      unpack16<DType::F32>(load16(row + row_of(i) * kStride4 + k), r);
      acc[i] += r[0] * c0 + r[1] * c1 + r[2] * c2 + r[3] * c3;
    }
  }
}

// Block (chunk c0 + blockIdx.x, head h): state[blockIdx.x][h] (P x N, fp32)
// = sum_s x_s (B_s e^{cum_last - cum_s} dt_s)^T over the chunk's tokens:
// X^T [P][L] rows against Bw [L][n] columns, 64 state rows p at a time.
__global__ void __launch_bounds__(kThreads)
    ssd_chunk_state_kernel(SsdDev a, int64_t T, int64_t c0, const float* dtv, const float* cum, float* states) {
  const int P = a.head_dim, N = a.d_state, H = a.n_heads, h = int(blockIdx.y), g = h / (H / a.n_groups);
  const int64_t c = c0 + blockIdx.x, t0 = c * L;
  const int len = int(min64(L, T - t0));
  const int Pr = (P + kRows * 4 - 1) / (kRows * 4) * (kRows * 4);  // rows of Xt: whole tiles of 64
  SS_DYNAMIC_SMEM(float, smem);
  float* Xt = smem;                 // [Pr][kStride4]: x transposed, zeros past the chunk and past P
  float* Bw = Xt + Pr * kStride4;   // [L][kStride1]
  for (int i = threadIdx.x; i < L * Pr; i += blockDim.x) {
    const int s = i / Pr, p = i % Pr;
    Xt[p * kStride4 + s] = s < len && p < P ? at(a.x, t0 + s, int64_t(h) * P + p) : 0.0f;
  }
  const float last = cum[(t0 + len - 1) * H + h];
  float* out = states + (int64_t(blockIdx.x) * H + h) * int64_t(P) * N;
  const int n = col_of();
  for (int n0 = 0; n0 < N; n0 += KP) {
    const int kn = imin(KP, N - n0);
    __syncthreads();  // Xt is staged; the previous piece is read
    for (int i = threadIdx.x; i < L * KP; i += blockDim.x) {
      const int s = i / KP, k = i % KP;
      float v = 0.0f;
      if (s < len && k < kn) {
        const int64_t t = t0 + s;
        v = at(a.B, t, int64_t(g) * N + n0 + k) * expf(last - cum[t * H + h]) * dtv[t * H + h];
      }
      Bw[s * kStride1 + k] = v;
    }
    __syncthreads();
    for (int p0 = 0; p0 < P; p0 += kRows * 4) {
      float acc[kRows] = {};
      sum_rows(acc, Xt + p0 * kStride4, Bw + n, kStride1, len);
#pragma unroll
      for (int i = 0; i < kRows; ++i)
        if (p0 + row_of(i) < P && n < kn) out[int64_t(p0 + row_of(i)) * N + n0 + n] = acc[i];
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

// Block (chunk c0 + blockIdx.x, head h): the chunk's outputs, 64 columns p
// at a time: y = M X + (e^{cum_t} C) S_in^T + D x, with M = C B^T masked
// causally and scaled by the decay from s to t and dt_s.
__global__ void __launch_bounds__(kThreads)
    ssd_output_kernel(SsdDev a, int64_t T, int64_t c0, const float* dtv, const float* cum, const float* states) {
  const int P = a.head_dim, N = a.d_state, H = a.n_heads, h = int(blockIdx.y), g = h / (H / a.n_groups);
  const int64_t c = c0 + blockIdx.x, t0 = c * L;
  const int len = int(min64(L, T - t0));
  SS_DYNAMIC_SMEM(float, smem);
  float* M = smem;                  // [L][kStride4]
  float* R = M + L * kStride4;      // the rest, reused by each phase
  float* Rows = R;                  // [L][kStride4]: C (for M), e^{cum_t} C (for the state term)
  float* Cols = R + L * kStride4;   // [64][kStride1]: B (for M), S_in's rows p (for the state term), X
  const float* S_in = states + (int64_t(blockIdx.x) * H + h) * int64_t(P) * N;
  const int col = col_of();
  const int last_row = row_of(kRows - 1);  // the highest t this thread sums

  // M = C B^T over the chunk, d_state in pieces. A warp whose columns s all
  // lie past its rows t sums nothing: the mask zeroes them.
  float acc[kRows] = {};
  const bool visible = (col & ~31) <= last_row;
  for (int n0 = 0; n0 < N; n0 += KP) {
    const int kn = imin(KP, N - n0);
    __syncthreads();
    for (int i = threadIdx.x; i < L * KP; i += blockDim.x) {
      const int s = i / KP, k = i % KP;
      const bool ok = s < len && k < kn;
      Rows[s * kStride4 + k] = ok ? at(a.C, t0 + s, int64_t(g) * N + n0 + k) : 0.0f;
      Cols[s * kStride1 + k] = ok ? at(a.B, t0 + s, int64_t(g) * N + n0 + k) : 0.0f;
    }
    __syncthreads();
    if (visible) sum_rows(acc, Rows, Cols + col * kStride1, 1, kn);
  }
  // The causal mask, the decay from s to t and dt_s.
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int t = row_of(i), s = col;
    float v = 0.0f;
    if (s <= t && t < len) v = acc[i] * expf(cum[(t0 + t) * H + h] - cum[(t0 + s) * H + h]) * dtv[(t0 + s) * H + h];
    M[t * kStride4 + s] = v;
  }
  const float Dh = at(a.D, 0, h);
  for (int p0 = 0; p0 < P; p0 += kCols) {
    const int p = p0 + col;
#pragma unroll
    for (int i = 0; i < kRows; ++i) acc[i] = 0.0f;
    // (e^{cum_t} C) S_in^T, d_state in pieces.
    for (int n0 = 0; n0 < N; n0 += KP) {
      const int kn = imin(KP, N - n0);
      __syncthreads();  // M is complete, or the previous piece is read
      for (int i = threadIdx.x; i < L * KP; i += blockDim.x) {
        const int s = i / KP, k = i % KP;
        Rows[s * kStride4 + k] =
            s < len && k < kn ? at(a.C, t0 + s, int64_t(g) * N + n0 + k) * expf(cum[(t0 + s) * H + h]) : 0.0f;
        const int pp = p0 + s;  // Cols' rows are the state's rows p
        Cols[s * kStride1 + k] = pp < P && k < kn ? S_in[int64_t(pp) * N + n0 + k] : 0.0f;
      }
      __syncthreads();
      sum_rows(acc, Rows, Cols + col * kStride1, 1, kn);
    }
    // + M X: X's 64 columns from p0, the rows s up to this warp's last t.
    __syncthreads();  // the pieces are read
    for (int i = threadIdx.x; i < L * kCols; i += blockDim.x) {
      const int s = i / kCols, q = i % kCols;
      Cols[s * kStride1 + q] = s < len && p0 + q < P ? at(a.x, t0 + s, int64_t(h) * P + p0 + q) : 0.0f;
    }
    __syncthreads();
    sum_rows(acc, M, Cols + col, kStride1, imin(len, last_row + 1));
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int t = row_of(i);
      if (t < len && p < P) put(a.y, t0 + t, int64_t(h) * P + p, acc[i] + Dh * Cols[t * kStride1 + col]);
    }
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
  const size_t tile_rows = size_t(P + kRows * 4 - 1) / (kRows * 4) * (kRows * 4);
  const size_t state_smem = sizeof(float) * (tile_rows * kStride4 + size_t(L) * kStride1);
  const size_t out_smem = sizeof(float) * (2 * size_t(L) * kStride4 + size_t(L) * kStride1);
  auto* state_kernel = &ssd_chunk_state_kernel;
  auto* output_kernel = &ssd_output_kernel;
  allow_smem("ssd_scan (chunk states)", state_kernel, state_smem);
  allow_smem("ssd_scan (outputs)", output_kernel, out_smem);
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
