#include <algorithm>

#include "cpu/kernels.h"

namespace ss::cpu {

// Depthwise causal conv: y_t[c] = b[c] + sum_j w[c][j] * xp_{t+j}[c], where xp
// is x prefixed by the K-1 previous inputs (the conv state: the cache from
// earlier tokens in decode, or the previous rank's halo in sequence sharding).
void conv1d_causal(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& state,
                   bool silu_out) {
  const int64_t T = x.rows(), C = x.cols(), K = w.cols(), H = K - 1;
  const float* W = w.data<float>();
  const float* bias = b.defined() ? b.data<float>() : nullptr;
  float* st = state.defined() ? state.data<float>() : nullptr;
  auto xp = [&](int64_t r, int64_t c) -> float {  // row r of the padded input
    if (r < H) return st ? st[r * C + c] : 0.0f;
    return x.data<float>()[(r - H) * x.ld() + c];
  };
#pragma omp parallel for schedule(static) if (T * C * K > (1 << 16))
  for (int64_t t = 0; t < T; ++t) {
    float* yr = y.data<float>() + t * y.ld();
    for (int64_t c = 0; c < C; ++c) {
      float acc = bias ? bias[c] : 0.0f;
      for (int64_t j = 0; j < K; ++j) acc += W[c * K + j] * xp(t + j, c);
      yr[c] = silu_out ? silu(acc) : acc;
    }
  }
  if (st && H > 0) {  // new state: the last K-1 rows of the padded input
    std::vector<float> next(static_cast<size_t>(H * C));
    for (int64_t r = 0; r < H; ++r)
      for (int64_t c = 0; c < C; ++c) next[size_t(r * C + c)] = xp(T + r, c);
    std::copy(next.begin(), next.end(), st);
  }
}

}  // namespace ss::cpu
