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
  if (x.rows * x.cols > 0) {
    SS_LAUNCH(conv1d_kernel, blocks_for(x.rows * x.cols, kThreads), kThreads, 0, s)(y, x, w, b, state, silu);
    check_launch("conv1d");
  }
  if (state.p && w.cols > 1 && x.cols > 0) {
    SS_LAUNCH(conv_state_kernel, blocks_for(x.cols, kThreads), kThreads, 0, s)(x, state, w.cols - 1);
    check_launch("conv1d (state)");
  }
}

}  // namespace ss::SS_CUDA_NS
