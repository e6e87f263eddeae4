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

}  // namespace

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
