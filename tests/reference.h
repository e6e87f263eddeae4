// Naive float64 references for the cpu kernels (engine/cpu/*.cpp).
//
// Written from the definitions in engine/core/backend.h, not from the kernels:
// plain loops, no blocking, no chunking, no online softmax. Every matrix is a
// dense row-major std::vector<double> with its dimensions passed alongside.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace ref {

using Vec = std::vector<double>;

inline double silu(double v) {
  return v / (1.0 + std::exp(-v));
}
inline double softplus(double v) {
  return std::log1p(std::exp(v));
}

inline Vec to_double(const std::vector<float>& v) {
  return Vec(v.begin(), v.end());
}

// ||got - want|| / ||want|| over all elements (the absolute norm when want is 0).
inline double rel_l2(const std::vector<float>& got, const Vec& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  if (!std::isfinite(num)) return std::numeric_limits<double>::infinity();
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// y[M,N] = x[M,K] · w[N,K]^T (+ y0 when given).
inline Vec matmul(const Vec& x, const Vec& w, int64_t M, int64_t N, int64_t K,
                  const Vec* y0 = nullptr) {
  Vec y(size_t(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = y0 ? (*y0)[size_t(m * N + n)] : 0.0;
      for (int64_t k = 0; k < K; ++k) acc += x[size_t(m * K + k)] * w[size_t(n * K + k)];
      y[size_t(m * N + n)] = acc;
    }
  return y;
}

// RMSNorm per row over groups of `group` columns: x / sqrt(mean(x^2) + eps) * w.
// With z (Mamba2 gated norm, norm_before_gate = False) the normalised value is
// x * silu(z). w may be null (weight one).
inline Vec rmsnorm(const Vec& x, const Vec* z, const Vec* w, int64_t T, int64_t n, int64_t group,
                   double eps) {
  Vec y(size_t(T * n));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g0 = 0; g0 < n; g0 += group) {
      Vec u(static_cast<size_t>(group));
      double ss = 0;
      for (int64_t i = 0; i < group; ++i) {
        const size_t e = size_t(t * n + g0 + i);
        u[size_t(i)] = x[e] * (z ? silu((*z)[e]) : 1.0);
        ss += u[size_t(i)] * u[size_t(i)];
      }
      const double r = 1.0 / std::sqrt(ss / double(group) + eps);
      for (int64_t i = 0; i < group; ++i)
        y[size_t(t * n + g0 + i)] = u[size_t(i)] * r * (w ? (*w)[size_t(g0 + i)] : 1.0);
    }
  return y;
}

// Rotary embedding, rotate-half pairing: (x_i, x_{i+d/2}) of every head turned
// by the angle pos * inv_freq[i]; unscaled, inv_freq[i] = theta^(-2i/d)
// (RoFormer, Su et al. 2021, eq. 34).
inline Vec rope(const Vec& x, int64_t T, int n_heads, int head_dim, const std::vector<int32_t>& pos,
                const std::vector<double>& inv_freq) {
  Vec y = x;
  const int half = head_dim / 2;
  const int64_t cols = int64_t(n_heads) * head_dim;
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < n_heads; ++h)
      for (int i = 0; i < half; ++i) {
        const double ang = double(pos[size_t(t)]) * inv_freq[size_t(i)];
        const size_t a = size_t(t * cols + h * head_dim + i), b = a + size_t(half);
        y[a] = x[a] * std::cos(ang) - x[b] * std::sin(ang);
        y[b] = x[b] * std::cos(ang) + x[a] * std::sin(ang);
      }
  return y;
}

inline std::vector<double> rope_freqs(double theta, int head_dim) {
  std::vector<double> f;
  for (int i = 0; i < head_dim / 2; ++i) f.push_back(1.0 / std::pow(theta, 2.0 * i / head_dim));
  return f;
}
inline Vec rope(const Vec& x, int64_t T, int n_heads, int head_dim, const std::vector<int32_t>& pos, double theta) {
  return rope(x, T, n_heads, head_dim, pos, rope_freqs(theta, head_dim));
}

// Attention by position: query i attends to every key j with k_pos[j] <= q_pos[i]
// through an explicit softmax; query head h reads kv head h / (n_heads / n_kv_heads).
// `lse` receives log(sum_j exp(score_ij)) per [query, head]; a query that sees
// no key gets o = 0 and lse = -inf.
inline Vec attention(const Vec& q, const Vec& k, const Vec& v, int64_t Tq, int64_t Tk, int n_heads,
                     int n_kv_heads, int head_dim, double scale, const std::vector<int32_t>& q_pos,
                     const std::vector<int32_t>& k_pos, Vec* lse = nullptr) {
  const int64_t hq = int64_t(n_heads) * head_dim, hkv = int64_t(n_kv_heads) * head_dim;
  const int group = n_heads / n_kv_heads;
  Vec o(size_t(Tq * hq), 0.0);
  if (lse) lse->assign(size_t(Tq * n_heads), 0.0);
  for (int64_t i = 0; i < Tq; ++i)
    for (int h = 0; h < n_heads; ++h) {
      const int kvh = h / group;
      std::vector<int64_t> keys;
      Vec score;
      for (int64_t j = 0; j < Tk; ++j) {
        if (k_pos[size_t(j)] > q_pos[size_t(i)]) continue;
        double s = 0;
        for (int d = 0; d < head_dim; ++d)
          s += q[size_t(i * hq + h * head_dim + d)] * k[size_t(j * hkv + kvh * head_dim + d)];
        keys.push_back(j);
        score.push_back(s * scale);
      }
      if (keys.empty()) {
        if (lse) (*lse)[size_t(i * n_heads + h)] = -std::numeric_limits<double>::infinity();
        continue;
      }
      double mx = -std::numeric_limits<double>::infinity();
      for (double s : score) mx = std::max(mx, s);
      double sum = 0;
      for (double& s : score) sum += (s = std::exp(s - mx));
      for (size_t n = 0; n < keys.size(); ++n)
        for (int d = 0; d < head_dim; ++d)
          o[size_t(i * hq + h * head_dim + d)] +=
              score[n] / sum * v[size_t(keys[n] * hkv + kvh * head_dim + d)];
      if (lse) (*lse)[size_t(i * n_heads + h)] = mx + std::log(sum);
    }
  return o;
}

// Depthwise causal conv over time: y_t[c] = b[c] + sum_j w[c][j] * xp[t+j][c]
// where xp = (state rows, then x rows) and state holds the K-1 inputs before x
// (zeros when null). `state_out` receives the last K-1 rows of xp.
inline Vec conv1d_causal(const Vec& x, const Vec& w, const Vec* b, const Vec* state, int64_t T,
                         int64_t C, int64_t K, bool silu_out, Vec* state_out = nullptr) {
  Vec xp(size_t((T + K - 1) * C), 0.0);
  for (int64_t r = 0; r < K - 1; ++r)
    for (int64_t c = 0; c < C; ++c)
      xp[size_t(r * C + c)] = state ? (*state)[size_t(r * C + c)] : 0.0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) xp[size_t((t + K - 1) * C + c)] = x[size_t(t * C + c)];
  Vec y(size_t(T * C));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = b ? (*b)[size_t(c)] : 0.0;
      for (int64_t j = 0; j < K; ++j) acc += w[size_t(c * K + j)] * xp[size_t((t + j) * C + c)];
      y[size_t(t * C + c)] = silu_out ? silu(acc) : acc;
    }
  if (state_out) state_out->assign(xp.end() - (K - 1) * C, xp.end());
  return y;
}

// Mamba2 SSD as its sequential recurrence, token by token, per head h in group
// g = h / (n_heads / n_groups):
//   dt_t = clamp(softplus(dt_raw + dt_bias_h), dt_min, dt_max), A_h = -exp(A_log_h)
//   S_t = exp(dt_t A_h) S_{t-1} + dt_t x_t B_t^T,   y_t = S_t C_t + D_h x_t
// `state` (n_heads x head_dim x d_state) is S_{-1} on entry (zero when empty)
// and S_{T-1} on return.
struct SsdProblem {
  int64_t T = 0;
  int n_heads = 0, head_dim = 0, n_groups = 0, d_state = 0;
  double dt_min = 0, dt_max = std::numeric_limits<double>::infinity();
  Vec x, dt, dt_bias, A_log, D, B, C;  // [T, H*P], [T, H], [H] x3, [T, G*N] x2
};

inline Vec ssd_scan(const SsdProblem& p, Vec& state) {
  const int H = p.n_heads, P = p.head_dim, N = p.d_state, G = p.n_groups;
  const int64_t T = p.T;
  if (state.empty()) state.assign(size_t(H) * P * N, 0.0);
  Vec y(size_t(T * H * P));
  for (int h = 0; h < H; ++h) {
    const int g = h / (H / G);
    const double A = -std::exp(p.A_log[size_t(h)]);
    double* S = state.data() + size_t(h) * P * N;
    for (int64_t t = 0; t < T; ++t) {
      double dt = softplus(p.dt[size_t(t * H + h)] + p.dt_bias[size_t(h)]);
      dt = std::min(std::max(dt, p.dt_min), p.dt_max);
      const double decay = std::exp(dt * A);
      const double* Bt = p.B.data() + size_t(t * G * N + g * N);
      const double* Ct = p.C.data() + size_t(t * G * N + g * N);
      for (int i = 0; i < P; ++i) {
        const double xv = p.x[size_t(t * H * P + h * P + i)];
        double acc = 0;
        for (int n = 0; n < N; ++n) {
          double& s = S[size_t(i) * N + n];
          s = decay * s + dt * xv * Bt[n];
          acc += s * Ct[n];
        }
        y[size_t(t * H * P + h * P + i)] = acc + p.D[size_t(h)] * xv;
      }
    }
  }
  return y;
}

// Mamba (v1) selective scan, per channel c and state n:
//   dt = softplus(dt_raw + dt_bias_c), h_t = exp(dt A_cn) h_{t-1} + dt B_t x_t, A_cn =
//   -exp(A_log_cn) y_t = (sum_n h_t C_t + D_c x_t) * silu(z_t)        (no gate when z is empty)
// `state` (channels x d_state) is read and overwritten like ssd_scan's.
struct SelectiveProblem {
  int64_t T = 0, channels = 0, d_state = 0;
  Vec x, dt, z, dt_bias, D, A_log, B, C;  // [T,Ch] x3, [Ch] x2, [Ch,N], [T,N] x2
};

inline Vec selective_scan(const SelectiveProblem& p, Vec& state) {
  const int64_t T = p.T, Ch = p.channels, N = p.d_state;
  if (state.empty()) state.assign(size_t(Ch * N), 0.0);
  Vec y(size_t(T * Ch));
  for (int64_t c = 0; c < Ch; ++c)
    for (int64_t t = 0; t < T; ++t) {
      const double xv = p.x[size_t(t * Ch + c)];
      const double dt = softplus(p.dt[size_t(t * Ch + c)] + p.dt_bias[size_t(c)]);
      double acc = 0;
      for (int64_t n = 0; n < N; ++n) {
        double& h = state[size_t(c * N + n)];
        h = std::exp(-dt * std::exp(p.A_log[size_t(c * N + n)])) * h +
            dt * p.B[size_t(t * N + n)] * xv;
        acc += h * p.C[size_t(t * N + n)];
      }
      acc += p.D[size_t(c)] * xv;
      if (!p.z.empty()) acc *= silu(p.z[size_t(t * Ch + c)]);
      y[size_t(t * Ch + c)] = acc;
    }
  return y;
}

}  // namespace ref
