#include <algorithm>

#include "cpu/kernels.h"

namespace ss::cpu {

// Depthwise causal conv: y_t[c] = b[c] + sum_j w[c][j] * xp_{t+j}[c], where xp
// is x prefixed by the K-1 previous inputs (the conv state: the cache from
// earlier tokens in decode, or the previous rank's halo in sequence sharding).
// The state is kept in the compute dtype (as mamba_ssm keeps conv_state);
// the sums run in fp32.
void conv1d_causal(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b,
                   const Tensor& state, bool silu_out) {
  const int64_t T = x.rows(), C = x.cols(), K = w.cols(), H = K - 1;
  constexpr int64_t kMaxKernel = 7;  // scratch slots 0..6 hold input rows, 7 the output
  if (K > kMaxKernel)
    throw std::logic_error("conv1d: kernel width " + std::to_string(K) + " is over 7");
  // The taps transposed to [K, C], so each tap is one vectorised pass over
  // the channels (each channel's sum still runs over j = 0..K-1 in order).
  std::vector<float> W(size_t(C * K)), Wt(size_t(C * K)), bias, st;
  widen(w.raw(), w.dtype(), C * K, W.data());
  for (int64_t c = 0; c < C; ++c)
    for (int64_t j = 0; j < K; ++j) Wt[size_t(j * C + c)] = W[size_t(c * K + j)];
  if (b.defined()) {
    bias.resize(size_t(C));
    widen(b.raw(), b.dtype(), C, bias.data());
  }
  if (state.defined()) {
    st.resize(size_t(H * C));
    widen(state.raw(), state.dtype(), H * C, st.data());
  }
  parallel_for(T, T * C * K > (1 << 16), [&](int64_t t) {
    // The K input rows this output row reads: from the state, or from x.
    // (null: a zero row before the start of the sequence; scratch slot j widens row j).
    const float* rows[kMaxKernel];
    for (int64_t j = 0; j < K; ++j) {
      const int64_t r = t + j;
      rows[j] = r < H ? (st.empty() ? nullptr : st.data() + r * C) : row_f32(x, r - H, int(j));
    }
    float* yr = row_out(y, t, kMaxKernel);
    if (bias.empty())
      std::fill_n(yr, C, 0.0f);
    else
      std::copy_n(bias.data(), C, yr);
    for (int64_t j = 0; j < K; ++j) {
      if (!rows[j]) continue;
      const float* wj = Wt.data() + j * C;
      const float* xj = rows[j];
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yr[c] += wj[c] * xj[c];
    }
    if (silu_out) silu_in_place(yr, C);
    store_row(y, t, yr);
  });
  if (state.defined() && H > 0) {  // new state: the last K-1 rows of the padded input
    std::vector<float> next(static_cast<size_t>(H * C));
    for (int64_t r = 0; r < H; ++r) {
      const int64_t pr = T + r;  // row of the padded input
      const float* src = pr < H ? st.data() + pr * C : row_f32(x, pr - H, 0);
      std::copy_n(src, C, next.data() + r * C);
    }
    narrow(next.data(), H * C, state.dtype(), state.raw());
  }
}

}  // namespace ss::cpu
