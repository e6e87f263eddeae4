// Depthwise causal conv over time, as Mamba's conv1d: y_t[c] = act(b[c] +
// sum_j w[c][j] xp_{t+j}[c]) over xp = the K-1 rows before x (the conv state:
// earlier tokens in decode, the previous rank's halo under sequence
// sharding; zeros when absent), then x. The state stays in its dtype (the
// compute dtype, as mamba_ssm keeps conv_state); the sums run in fp32.
#include "cuda/common.cuh"

namespace ss::SS_CUDA_NS {
namespace {

constexpr int kThreads = 256;

// Row m of the padded input, channel c.
SS_DEV float padded(const Mat& x, const Mat& state, int64_t H, int64_t m, int64_t c) {
  if (m >= H) return at(x, m - H, c);
  return state.p ? load(state.p, m * x.cols + c, state.dt) : 0.0f;
}

__global__ void conv1d_kernel(Mat y, Mat x, Mat w, Mat b, Mat state, bool silu_out) {
  const int64_t C = x.cols, K = w.cols, H = K - 1;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < x.rows * C; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / C, c = i % C;
    float acc = b.p ? at(b, 0, c) : 0.0f;
    for (int64_t j = 0; j < K; ++j) acc += at(w, c, j) * padded(x, state, H, t + j, c);
    put(y, t, c, silu_out ? silu(acc) : acc);
  }
}

// The same where x, y and the state share a dtype and their rows are
// 16-byte aligned runs of 8-value pieces (eights_fit), for kernel widths of 2
// to 4 (Mamba's is 4): a thread per piece of 8 channels and tile of tokens
// keeps the window of the last K rows in registers, so each input row is read
// once a tile (the tile's K-1 rows of history twice) rather than K times, in
// 16-byte loads, and the weights once a thread.
constexpr int kTileTokens = 16;

template <DType DT>
SS_DEV void padded8(const Mat& x, const Mat& state, int64_t H, int64_t m, int64_t c, float* out) {
  constexpr int64_t es = DT == DType::F32 ? 4 : 2;
  if (m >= H) return load8<DT>(static_cast<const char*>(x.p) + ((m - H) * x.ld + c) * es, out);
  if (state.p) return load8<DT>(static_cast<const char*>(state.p) + (m * x.cols + c) * es, out);
  for (int e = 0; e < 8; ++e) out[e] = 0.0f;
}

template <DType DT, int K>
__global__ void conv1d_eights_kernel(Mat y, Mat x, Mat w, Mat b, Mat state, bool silu_out) {
  constexpr int64_t es = DT == DType::F32 ? 4 : 2;
  constexpr int H = K - 1;
  const int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (c >= x.cols) return;
  float wt[8][K], bias[8];
  for (int e = 0; e < 8; ++e) {
    bias[e] = b.p ? at(b, 0, c + e) : 0.0f;
#pragma unroll
    for (int j = 0; j < K; ++j) wt[e][j] = at(w, c + e, j);
  }
  for (int64_t t0 = int64_t(blockIdx.y) * kTileTokens; t0 < x.rows; t0 += int64_t(gridDim.y) * kTileTokens) {
    const int64_t t1 = min64(x.rows, t0 + kTileTokens);
    float win[K][8];  // padded rows t .. t + H: the window of output t, oldest first
#pragma unroll
    for (int j = 0; j < H; ++j) padded8<DT>(x, state, H, t0 + j, c, win[j]);
    for (int64_t t = t0; t < t1; ++t) {
      padded8<DT>(x, state, H, t + H, c, win[H]);
      float out[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float acc = bias[e];
#pragma unroll
        for (int j = 0; j < K; ++j) acc += wt[e][j] * win[j][e];
        out[e] = silu_out ? silu(acc) : acc;
      }
      store8<DT>(static_cast<char*>(y.p) + (t * y.ld + c) * es, out);
#pragma unroll
      for (int j = 0; j < H; ++j)
#pragma unroll
        for (int e = 0; e < 8; ++e) win[j][e] = win[j + 1][e];
    }
  }
}

// The launcher of conv1d_eights_kernel for x's dtype and the width K (2 to 4).
void conv1d_eights(const Mat& y, const Mat& x, const Mat& w, const Mat& b, const Mat& state, bool silu_out,
                   Stream s) {
  constexpr int kPieces = 128;  // threads a block, each a piece of 8 channels
  const dim3 grid(blocks_for(x.cols / 8, kPieces),
                  unsigned(min64(65535, (x.rows + kTileTokens - 1) / kTileTokens)));
  auto* kernel = for_dtype(x.dt, [&](auto d) {
    constexpr DType DT = decltype(d)::value;
    return w.cols == 2 ? &conv1d_eights_kernel<DT, 2> : w.cols == 3 ? &conv1d_eights_kernel<DT, 3>
                                                                    : &conv1d_eights_kernel<DT, 4>;
  });
  SS_LAUNCH(kernel, grid, kPieces, 0, s)(y, x, w, b, state, silu_out);
}

// Whether conv1d_eights_kernel applies: one dtype, aligned 8-value pieces, K 2 to 4.
bool eights_apply(const Mat& y, const Mat& x, const Mat& w, const Mat& state) {
  if (w.cols < 2 || w.cols > 4 || y.dt != x.dt || (state.p && state.dt != x.dt)) return false;
  const Mat st{state.p, w.cols - 1, x.cols, x.cols, x.dt};
  return state.p ? eights_fit({&y, &x, &st}, x.cols) : eights_fit({&y, &x}, x.cols);
}

// The new state, the last K-1 rows of the padded input: a thread per
// channel, rows in increasing order, so an old state row still to be read
// (row T + r when T + r < K-1) is never overwritten before.
__global__ void conv_state_kernel(Mat x, Mat state, int64_t H) {
  const int64_t C = x.cols, T = x.rows;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < C; c += int64_t(gridDim.x) * blockDim.x)
    for (int64_t r = 0; r < H; ++r) store(state.p, r * C + c, state.dt, padded(x, state, H, T + r, c));
}

// Backward, step 1: the gradient at the pre-activation, a thread per (t, c).
__global__ void conv1d_dpre_kernel(Mat dy, Mat x, Mat w, Mat b, Mat state, bool silu_out, float* dpre) {
  const int64_t C = x.cols, K = w.cols, H = K - 1;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < x.rows * C; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / C, c = i % C;
    float pre = b.p ? at(b, 0, c) : 0.0f;
    for (int64_t j = 0; j < K; ++j) pre += at(w, c, j) * padded(x, state, H, t + j, c);
    float g = at(dy, t, c);
    if (silu_out) {
      const float sg = 1.0f / (1.0f + expf(-pre));
      g *= sg * (1.0f + pre * (1.0f - sg));
    }
    dpre[i] = g;
  }
}

// Step 2: the padded input's gradient, a thread per (row m of T + K - 1, c):
// rows from K - 1 on are dx, the first K - 1 the state's.
__global__ void conv1d_dx_kernel(Mat dx, Mat dstate, Mat w, const float* dpre, int64_t T, int64_t C) {
  const int64_t K = w.cols, H = K - 1;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (T + H) * C; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = i / C, c = i % C;
    float acc = 0.0f;
    for (int64_t j = 0; j < K; ++j)
      if (m - j >= 0 && m - j < T) acc += at(w, c, j) * dpre[(m - j) * C + c];
    if (m >= H) put(dx, m - H, c, acc);
    else if (dstate.p) store(dstate.p, m * C + c, dstate.dt, acc);
  }
}

// Step 3: dw[c][j] += sum_t dpre[t][c] xp[t + j][c]; index j = K is db[c] += sum_t dpre[t][c] (double sums).
__global__ void conv1d_dw_kernel(Mat dw, Mat db, Mat x, Mat state, const float* dpre, int64_t K) {
  const int64_t C = x.cols, T = x.rows, H = K - 1;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < C * (K + 1); i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i / (K + 1), j = i % (K + 1);
    double acc = 0;
    for (int64_t t = 0; t < T; ++t) acc += double(dpre[t * C + c]) * (j < K ? padded(x, state, H, t + j, c) : 1.0f);
    if (j < K) store(dw.p, c * K + j, dw.dt, load(dw.p, c * K + j, dw.dt) + float(acc));
    else if (db.p) store(db.p, c, db.dt, load(db.p, c, db.dt) + float(acc));
  }
}

}  // namespace

void conv1d_backward(const Mat& dx, const Mat& dw, const Mat& db, const Mat& dstate, const Mat& dy, const Mat& x,
                     const Mat& w, const Mat& b, const Mat& state, bool silu, Scratch& scratch, Stream s) {
  const int64_t T = x.rows, C = x.cols, K = w.cols;
  expect(w.rows == C && dx.rows == T && dx.cols == C, "conv1d_backward", "shape mismatch");
  if (T * C == 0) return;
  auto* dpre = static_cast<float*>(scratch.get(kScratchGrad, int64_t(sizeof(float)) * T * C));
  SS_LAUNCH(conv1d_dpre_kernel, blocks_for(T * C, kThreads), kThreads, 0, s)(dy, x, w, b, state, silu, dpre);
  check_launch("conv1d_backward (dpre)");
  SS_LAUNCH(conv1d_dx_kernel, blocks_for((T + K - 1) * C, kThreads), kThreads, 0, s)(dx, dstate, w, dpre, T, C);
  check_launch("conv1d_backward (dx)");
  SS_LAUNCH(conv1d_dw_kernel, blocks_for(C * (K + 1), kThreads), kThreads, 0, s)(dw, db, x, state, dpre, K);
  check_launch("conv1d_backward (dw)");
}

void conv1d_causal(const Mat& y, const Mat& x, const Mat& w, const Mat& b, const Mat& state, bool silu, Stream s) {
  expect(w.rows == x.cols && y.cols == x.cols && y.rows == x.rows, "conv1d", "shape mismatch");
  expect(!state.p || state.rows * state.cols == (w.cols - 1) * x.cols, "conv1d", "state shape");
  if (x.rows * x.cols > 0 && eights_apply(y, x, w, state)) {
    conv1d_eights(y, x, w, b, state, silu, s);
    check_launch("conv1d");
  } else if (x.rows * x.cols > 0) {
    SS_LAUNCH(conv1d_kernel, blocks_for(x.rows * x.cols, kThreads), kThreads, 0, s)(y, x, w, b, state, silu);
    check_launch("conv1d");
  }
  if (state.p && w.cols > 1 && x.cols > 0) {
    SS_LAUNCH(conv_state_kernel, blocks_for(x.cols, kThreads), kThreads, 0, s)(x, state, w.cols - 1);
    check_launch("conv1d (state)");
  }
}

}  // namespace ss::SS_CUDA_NS
