#include <algorithm>
#include <cmath>

#include "cpu/kernels.h"

namespace ss::cpu {

// Scratch slots used below: 0-2 inputs, 3 output, 4 the weight.

// RMSNorm over groups of `group` columns; with z, the Mamba2 gated form
// rmsnorm(x * silu(z)) (norm_before_gate = False). w may be undefined.
// Statistics in fp32 whatever the dtype.
void rmsnorm(const Tensor& y, const Tensor& x, const Tensor& z, const Tensor& w, float eps,
             int64_t group) {
  const int64_t T = x.rows(), n = x.cols();
  const float* W = vec_f32(w, 4);  // read by every thread
  parallel_for(T, T * n > (1 << 16), [&](int64_t t) {
    const float* xr = row_f32(x, t, 0);
    const float* zr = row_f32(z, t, 1);
    float* yr = row_out(y, t, 3);
    for (int64_t g0 = 0; g0 < n; g0 += group) {
      if (zr) silu_times(zr + g0, xr + g0, yr + g0, group);
      const float ss = sum_squares((zr ? yr : xr) + g0, group);
      const float inv = 1.0f / std::sqrt(ss / float(group) + eps);
      const float* src = zr ? yr : xr;
      for (int64_t i = g0; i < g0 + group; ++i) yr[i] = src[i] * inv * (W ? W[i] : 1.0f);
    }
    store_row(y, t, yr);
  });
}

// Rotary position embedding, rotate-half pairing as in HF Llama:
// (x_i, x_{i+d/2}) rotated by pos * inv_freq[i].
void rope(const Tensor& x, int n_heads, int head_dim, std::span<const int32_t> pos, std::span<const double> inv_freq) {
  const int half = head_dim / 2;
  const int64_t T = x.rows();
  parallel_for(T, T * n_heads * head_dim > (1 << 16), [&](int64_t t) {
    const float* in = row_f32(x, t, 0);
    float* row = row_out(x, t, 3);
    if (row != in) std::copy_n(in, x.cols(), row);
    for (int i = 0; i < half; ++i) {
      const double ang = double(pos[t]) * inv_freq[i];
      const float c = float(std::cos(ang)), s = float(std::sin(ang));
      for (int h = 0; h < n_heads; ++h) {
        float* hp = row + int64_t(h) * head_dim;
        const float a = hp[i], b = hp[i + half];
        hp[i] = a * c - b * s;
        hp[i + half] = b * c + a * s;
      }
    }
    store_row(x, t, row);
  });
}

// Gated norm whose groups span ranks, step 1: this rank's share of each
// group's sum of squares of x * silu(z), in fp32 (ss is f32).
void gated_norm_sumsq(const Tensor& ss, const Tensor& x, const Tensor& z, int64_t local_group,
                      int64_t slot0) {
  const int64_t T = x.rows(), n = x.cols(), slots = ss.cols();
  for (int64_t t = 0; t < T; ++t) {
    float* out = ss.data<float>() + t * slots;
    std::fill_n(out, slots, 0.0f);
    const float* xr = row_f32(x, t, 0);
    const float* zr = row_f32(z, t, 1);
    float* g = scratch(2, n);
    silu_times(zr, xr, g, n);
    for (int64_t g0 = 0; g0 < n; g0 += local_group)
      out[slot0 + g0 / local_group] += sum_squares(g + g0, std::min(local_group, n - g0));
  }
}

// Step 2, after the sums are reduced over the ranks sharing a group.
void gated_rmsnorm_apply(const Tensor& y, const Tensor& x, const Tensor& z, const Tensor& w,
                         const Tensor& ss, float eps, int64_t local_group, int64_t total_group,
                         int64_t slot0) {
  const int64_t T = x.rows(), n = x.cols(), slots = ss.cols();
  const float* W = vec_f32(w, 4);
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = row_f32(x, t, 0);
    const float* zr = row_f32(z, t, 1);
    float* yr = row_out(y, t, 3);
    const float* sr = ss.data<float>() + t * slots;
    silu_times(zr, xr, yr, n);
    for (int64_t g0 = 0; g0 < n; g0 += local_group) {
      const float inv = 1.0f / std::sqrt(sr[slot0 + g0 / local_group] / float(total_group) + eps);
      for (int64_t i = g0; i < std::min(n, g0 + local_group); ++i) yr[i] = yr[i] * inv * W[i];
    }
    store_row(y, t, yr);
  }
}

}  // namespace ss::cpu
