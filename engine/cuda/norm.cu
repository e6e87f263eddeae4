// RMSNorm and Mamba2's gated RMSNorm (also in its two-step form for groups
// that span ranks). Statistics in fp32 whatever the dtype.
#include "cuda/common.cuh"

namespace ss::SS_CUDA_NS {
namespace {

constexpr int kThreads = 256;

// The value normalised: x, or x * silu(z) for the gated form.
SS_DEV float normed_input(const Mat& x, const Mat& z, int64_t r, int64_t c) {
  const float v = at(x, r, c);
  return z.p ? v * silu(at(z, r, c)) : v;
}

// A block per (row, group of columns), looping when there are more of them
// than blocks: the group's sum of squares, then y = v / sqrt(mean + eps) * w.
__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(Mat y, Mat x, Mat z, Mat w, float eps, int64_t group) {
  pdl_begin();
  __shared__ float red[32];
  const int64_t groups = x.cols / group;
  for (int64_t item = blockIdx.x; item < x.rows * groups; item += gridDim.x) {
    const int64_t r = item / groups, c0 = (item % groups) * group;
    float ss = 0;
    for (int64_t c = c0 + threadIdx.x; c < c0 + group; c += blockDim.x) {
      const float v = normed_input(x, z, r, c);
      ss += v * v;
    }
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / float(group) + eps);
    for (int64_t c = c0 + threadIdx.x; c < c0 + group; c += blockDim.x)
      put(y, r, c, normed_input(x, z, r, c) * inv * (w.p ? at(w, 0, c) : 1.0f));
  }
}

// The same for a whole-row group in pieces of 8 values (eights_fit): a block
// per row, up to kMaxPieces pieces a thread held in registers, so x (and z)
// are read once. x and z of dtype DX, y of DY (a Mamba's fp32 residual into
// the block's dtype), w of y's.
constexpr int kMaxPieces = 4;

template <DType DX, DType DY, bool GATED>
__global__ void __launch_bounds__(kThreads) rmsnorm_pieces_kernel(Mat y, Mat x, Mat z, Mat w, float eps) {
  pdl_begin();
  constexpr int64_t ex = DX == DType::F32 ? 4 : 2, ey = DY == DType::F32 ? 4 : 2;
  __shared__ float red[32];
  const int64_t pieces = x.cols / 8;
  for (int64_t r = blockIdx.x; r < x.rows; r += gridDim.x) {
    float v[kMaxPieces][8];  // unrolled loops with constant indices: registers, not local memory
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxPieces; ++i) {
      const int64_t p = threadIdx.x + int64_t(i) * kThreads;
      if (p < pieces) {
        load8<DX>(static_cast<const char*>(x.p) + (r * x.ld + p * 8) * ex, v[i]);
        if constexpr (GATED) {
          float zv[8];
          load8<DX>(static_cast<const char*>(z.p) + (r * z.ld + p * 8) * ex, zv);
          for (int e = 0; e < 8; ++e) v[i][e] *= silu(zv[e]);
        }
        for (int e = 0; e < 8; ++e) ss += v[i][e] * v[i][e];
      }
    }
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / float(x.cols) + eps);
#pragma unroll
    for (int i = 0; i < kMaxPieces; ++i) {
      const int64_t p = threadIdx.x + int64_t(i) * kThreads;
      if (p < pieces) {
        float wv[8];
        if (w.p) load8<DY>(static_cast<const char*>(w.p) + p * 8 * ey, wv);
        for (int e = 0; e < 8; ++e) v[i][e] = v[i][e] * inv * (w.p ? wv[e] : 1.0f);
        store8<DY>(static_cast<char*>(y.p) + (r * y.ld + p * 8) * ey, v[i]);
      }
    }
  }
}

template <bool GATED>
bool launch_rmsnorm_pieces(const Mat& y, const Mat& x, const Mat& z, const Mat& w, float eps, Stream s) {
  void (*kernel)(Mat, Mat, Mat, Mat, float) = nullptr;
  if (x.dt == y.dt)
    kernel = for_dtype(x.dt, [](auto d) {
      return &rmsnorm_pieces_kernel<decltype(d)::value, decltype(d)::value, GATED>;
    });
  else if (x.dt == DType::F32 && y.dt == DType::BF16)
    kernel = &rmsnorm_pieces_kernel<DType::F32, DType::BF16, GATED>;
  else if (x.dt == DType::F32 && y.dt == DType::F16)
    kernel = &rmsnorm_pieces_kernel<DType::F32, DType::F16, GATED>;
  if (!kernel) return false;
  launch_dependent("rmsnorm", kernel, blocks_for(x.rows, 1), kThreads, 0, s, y, x, z, w, eps);
  return true;
}

// A block per row: its sums of squares of x * silu(z) per local group into
// ss[r, slot0 + g]; the row's other slots are zeroed.
__global__ void __launch_bounds__(kThreads) gated_sumsq_kernel(float* ss, int64_t slots, Mat x, Mat z,
                                                               int64_t local_group, int64_t slot0) {
  __shared__ float red[32];
  const int64_t groups = x.cols / local_group;
  for (int64_t r = blockIdx.x; r < x.rows; r += gridDim.x) {
    float* out = ss + r * slots;
    for (int64_t s = threadIdx.x; s < slots; s += blockDim.x)
      if (s < slot0 || s >= slot0 + groups) out[s] = 0.0f;
    for (int64_t g = 0; g < groups; ++g) {
      float sum = 0;
      for (int64_t c = g * local_group + threadIdx.x; c < (g + 1) * local_group; c += blockDim.x) {
        const float v = normed_input(x, z, r, c);
        sum += v * v;
      }
      sum = block_sum(sum, red);
      if (threadIdx.x == 0) out[slot0 + g] = sum;
    }
  }
}

__global__ void gated_apply_kernel(Mat y, Mat x, Mat z, Mat w, const float* ss, int64_t slots, float eps,
                                   int64_t local_group, int64_t total_group, int64_t slot0) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < x.rows * x.cols;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / x.cols, c = i % x.cols;
    const float inv = 1.0f / sqrtf(ss[r * slots + slot0 + c / local_group] / float(total_group) + eps);
    put(y, r, c, normed_input(x, z, r, c) * inv * at(w, 0, c));
  }
}

}  // namespace

void rmsnorm(const Mat& y, const Mat& x, const Mat& z, const Mat& w, float eps, int64_t group, Stream s) {
  expect(group > 0 && x.cols % group == 0, "rmsnorm", "the group does not divide the columns");
  const int64_t items = x.rows * (x.cols / group);
  if (items == 0) return;
  const bool whole = group == x.cols && x.cols <= int64_t(kThreads) * kMaxPieces * 8 && (!z.p || z.dt == x.dt) &&
                     eights_fit(z.p ? std::initializer_list<const Mat*>{&y, &x, &z}
                                    : std::initializer_list<const Mat*>{&y, &x},
                                x.cols) &&
                     (!w.p || (w.dt == y.dt && eights_fit({&w}, x.cols)));
  if (whole && (z.p ? launch_rmsnorm_pieces<true>(y, x, z, w, eps, s) : launch_rmsnorm_pieces<false>(y, x, z, w, eps, s)))
    return check_launch("rmsnorm");
  launch_dependent("rmsnorm", rmsnorm_kernel, blocks_for(items, 1), kThreads, 0, s, y, x, z, w, eps, group);
  check_launch("rmsnorm");
}

void gated_norm_sumsq(float* ss, int64_t slots, const Mat& x, const Mat& z, int64_t local_group, int64_t slot0,
                      Stream s) {
  expect(local_group > 0 && x.cols % local_group == 0 && slot0 + x.cols / local_group <= slots, "gated_norm_sumsq",
         "groups do not fit the slots");
  if (x.rows == 0) return;
  SS_LAUNCH(gated_sumsq_kernel, blocks_for(x.rows, 1), kThreads, 0, s)(ss, slots, x, z, local_group, slot0);
  check_launch("gated_norm_sumsq");
}

void gated_rmsnorm_apply(const Mat& y, const Mat& x, const Mat& z, const Mat& w, const float* ss, int64_t slots,
                         float eps, int64_t local_group, int64_t total_group, int64_t slot0, Stream s) {
  if (x.rows * x.cols == 0) return;
  SS_LAUNCH(gated_apply_kernel, blocks_for(x.rows * x.cols, kThreads), kThreads, 0, s)(
      y, x, z, w, ss, slots, eps, local_group, total_group, slot0);
  check_launch("gated_rmsnorm_apply");
}

}  // namespace ss::SS_CUDA_NS
