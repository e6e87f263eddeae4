// Rotary position embedding in place, HF Llama's rotate-half pairing.
#include "cuda/common.cuh"

namespace ss::SS_CUDA_NS {
namespace {

constexpr int kThreads = 256;

constexpr int kMaxHalf = 256;

// Token position p's cos and sin per pair into cs, for the whole block (in
// double, as the cpu kernel takes them, so long positions keep their
// precision); the block's previous use of cs is over first.
SS_DEV void token_angles(float (*cs)[kMaxHalf], int32_t p, const double* inv_freq, int half) {
  __syncthreads();
  for (int j = int(threadIdx.x); j < half; j += int(blockDim.x)) {
    const double ang = double(p) * inv_freq[j];
    cs[0][j] = float(cos(ang));
    cs[1][j] = float(sin(ang));
  }
  __syncthreads();
}
// The pair (a, b) rotated by the angle of cos c and sin s.
SS_DEV void rotate(float& a, float& b, float c, float s) {
  const float a0 = a;
  a = a0 * c - b * s;
  b = b * c + a0 * s;
}

// A block per token: the token's angles once into shared memory for every
// head, then a thread per (head, pair).
__global__ void rope_kernel(Mat x, int n_heads, int head_dim, const int32_t* pos, const double* inv_freq) {
  pdl_begin();
  __shared__ float cs[2][kMaxHalf];
  const int half = head_dim / 2;
  for (int64_t t = blockIdx.x; t < x.rows; t += gridDim.x) {
    token_angles(cs, pos[t], inv_freq, half);
    for (int i = int(threadIdx.x); i < n_heads * half; i += int(blockDim.x)) {
      const int h = i / half, j = i % half;
      const int64_t col = int64_t(h) * head_dim + j;
      float a = at(x, t, col), b = at(x, t, col + half);
      rotate(a, b, cs[0][j], cs[1][j]);
      put(x, t, col, a);
      put(x, t, col + half, b);
    }
  }
}

// The same with 8 pairs a thread in pieces of 8 values (eights_fit and
// half a head a whole number of pieces).
template <DType DT>
__global__ void rope_pieces_kernel(Mat x, int n_heads, int head_dim, const int32_t* pos, const double* inv_freq) {
  pdl_begin();
  constexpr int64_t es = DT == DType::F32 ? 4 : 2;
  __shared__ float cs[2][kMaxHalf];
  const int half = head_dim / 2, per_head = half / 8;
  for (int64_t t = blockIdx.x; t < x.rows; t += gridDim.x) {
    token_angles(cs, pos[t], inv_freq, half);
    for (int i = int(threadIdx.x); i < n_heads * per_head; i += int(blockDim.x)) {
      const int j0 = (i % per_head) * 8;
      char* lo = static_cast<char*>(x.p) + (t * x.ld + int64_t(i / per_head) * head_dim + j0) * es;
      char* hi = lo + int64_t(half) * es;
      float a[8], b[8];
      load8<DT>(lo, a);
      load8<DT>(hi, b);
      for (int e = 0; e < 8; ++e) rotate(a[e], b[e], cs[0][j0 + e], cs[1][j0 + e]);
      store8<DT>(lo, a);
      store8<DT>(hi, b);
    }
  }
}

}  // namespace

void rope(const Mat& x, int n_heads, int head_dim, const int32_t* pos, const double* inv_freq, Stream s) {
  expect(head_dim % 2 == 0 && head_dim / 2 <= kMaxHalf && x.cols == int64_t(n_heads) * head_dim, "rope",
         "shape mismatch (or a head wider than 512)");
  if (x.rows * n_heads == 0) return;
  if (head_dim % 16 == 0 && eights_fit({&x}, x.cols)) {
    auto* kernel = for_dtype(x.dt, [](auto d) { return &rope_pieces_kernel<decltype(d)::value>; });
    launch_dependent("rope", kernel, blocks_for(x.rows, 1), kThreads, 0, s, x, n_heads, head_dim, pos, inv_freq);
    return check_launch("rope");
  }
  launch_dependent("rope", rope_kernel, blocks_for(x.rows, 1), kThreads, 0, s, x, n_heads, head_dim, pos, inv_freq);
  check_launch("rope");
}

}  // namespace ss::SS_CUDA_NS
