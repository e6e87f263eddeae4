// Rotary position embedding in place, HF Llama's rotate-half pairing: a
// thread per (token, head, pair); the angle in double, as the cpu kernel
// takes it, so long positions keep their precision.
#include "cuda/common.cuh"

namespace ss::SS_CUDA_NS {
namespace {

constexpr int kThreads = 256;

__global__ void rope_kernel(Mat x, int n_heads, int head_dim, const int32_t* pos, const double* inv_freq) {
  const int half = head_dim / 2;
  const int64_t n = x.rows * n_heads * half;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / (int64_t(n_heads) * half);
    const int h = int(i / half % n_heads), j = int(i % half);
    const double ang = double(pos[t]) * inv_freq[j];
    const float c = float(cos(ang)), s = float(sin(ang));
    const int64_t col = int64_t(h) * head_dim + j;
    const float a = at(x, t, col), b = at(x, t, col + half);
    put(x, t, col, a * c - b * s);
    put(x, t, col + half, b * c + a * s);
  }
}

}  // namespace

void rope(const Mat& x, int n_heads, int head_dim, const int32_t* pos, const double* inv_freq, Stream s) {
  expect(head_dim % 2 == 0 && x.cols == int64_t(n_heads) * head_dim, "rope", "shape mismatch");
  const int64_t n = x.rows * n_heads * (head_dim / 2);
  if (n == 0) return;
  SS_LAUNCH(rope_kernel, blocks_for(n, kThreads), kThreads, 0, s)(x, n_heads, head_dim, pos, inv_freq);
  check_launch("rope");
}

}  // namespace ss::SS_CUDA_NS
