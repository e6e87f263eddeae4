// Backward kernels of the elementwise and row-wise ops, the loss and the
// optimizer, in fp32 registers over tensors of any float dtype. Each is
// checked against a float64 reference in tests/tst_backward.cpp.
#ifdef _OPENMP
#include <omp.h>
#endif

#include <cmath>
#include <vector>

#include "cpu/kernels.h"

namespace ss::cpu {

// dtable[tokens[t]] += dy[t]: rows of repeated tokens add up, so the columns
// are split over threads and every thread walks all tokens.
void embedding_backward(const Tensor& dtable, const Tensor& dy, std::span<const int32_t> tokens) {
  const int64_t T = dy.rows(), d = dy.cols();
  const F32Rows g(dy);
  F32Out out(dtable, true);
#pragma omp parallel for schedule(static) if (T * d > (1 << 16))
  for (int64_t c0 = 0; c0 < d; c0 += 64) {
    const int64_t c1 = std::min(d, c0 + 64);
    for (int64_t t = 0; t < T; ++t) {
      float* o = out.row(tokens[size_t(t)]);
      const float* gr = g.row(t);
      for (int64_t c = c0; c < c1; ++c) o[c] += gr[c];
    }
  }
  out.commit();
}

// y = x r w with r = 1/sqrt(mean_g(x^2) + eps) per group g of columns. With
// u = dy * w: dx = r u - x r^3 mean_g(u x), dw = sum_rows dy x r.
void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      float eps, int64_t group) {
  const int64_t T = x.rows(), n = x.cols();
  const float* wf = vec_f32(w, 7);
  std::vector<float> wcopy;
  if (wf) wcopy.assign(wf, wf + n);  // scratch slots are per thread: keep one for every thread
  std::vector<double> dw_sum(w.defined() ? size_t(n) : 0, 0.0);
#pragma omp parallel if (T * n > (1 << 15))
  {
    std::vector<double> dw_mine(dw_sum.size(), 0.0);
    std::vector<float> u(static_cast<size_t>(n));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float* xr = row_f32(x, t, 0);
      const float* gr = row_f32(dy, t, 1);
      const float* in = row_f32(dx, t, 2);
      float* out = row_out(dx, t, 3);
      if (out != in) std::copy_n(in, n, out);
      for (int64_t c = 0; c < n; ++c) u[size_t(c)] = wcopy.empty() ? gr[c] : gr[c] * wcopy[size_t(c)];
      for (int64_t g0 = 0; g0 < n; g0 += group) {
        float ss = 0, ux = 0;
        for (int64_t c = g0; c < g0 + group; ++c) {
          ss += xr[c] * xr[c];
          ux += u[size_t(c)] * xr[c];
        }
        const float r = 1.0f / std::sqrt(ss / float(group) + eps);
        const float k = r * r * r * ux / float(group);
        for (int64_t c = g0; c < g0 + group; ++c) out[c] += r * u[size_t(c)] - k * xr[c];
        if (!dw_mine.empty())
          for (int64_t c = g0; c < g0 + group; ++c) dw_mine[size_t(c)] += double(gr[c]) * xr[c] * r;
      }
      store_row(dx, t, out);
    }
    if (!dw_mine.empty()) {
#pragma omp critical
      for (int64_t c = 0; c < n; ++c) dw_sum[size_t(c)] += dw_mine[size_t(c)];
    }
  }
  if (!w.defined()) return;
  F32Out o(dw, true);
  for (int64_t c = 0; c < n; ++c) o.p[c] += float(dw_sum[size_t(c)]);
  o.commit();
}

// db[n] += sum_t dy[t, n], the column sums in double (rows in order, so the
// result does not depend on the thread count).
void bias_backward(const Tensor& db, const Tensor& dy) {
  const int64_t T = dy.rows(), n = dy.cols();
  std::vector<double> sum(size_t(n), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const float* r = row_f32(dy, t, 0);
    for (int64_t c = 0; c < n; ++c) sum[size_t(c)] += r[c];
  }
  float* out = db.data<float>();
  for (int64_t c = 0; c < n; ++c) out[c] += float(sum[size_t(c)]);
}

// y = silu(g) u: dg = dy u s (1 + g (1 - s)) with s = sigmoid(g); du = dy silu(g).
void silu_mul_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dy, const Tensor& gate,
                       const Tensor& up) {
  const int64_t T = dy.rows(), n = dy.cols();
  parallel_for(T, T * n > (1 << 16), [&](int64_t t) {
    const float* g = row_f32(gate, t, 0);
    const float* u = row_f32(up, t, 1);
    const float* d = row_f32(dy, t, 2);
    float* dg = row_out(dgate, t, 3);
    float* du = row_out(dup, t, 4);
    for (int64_t c = 0; c < n; ++c) {
      const float s = 1.0f / (1.0f + fast_exp(-g[c]));
      dg[c] = d[c] * u[c] * s * (1.0f + g[c] * (1.0f - s));
      du[c] = d[c] * g[c] * s;
    }
    store_row(dgate, t, dg);
    store_row(dup, t, du);
  });
}

// y = act(b + sum_j w[c][j] xp[t+j][c]) over xp = (K-1 state rows, then x),
// act = silu or identity: the pre-activation is recomputed, then
// dxp[m] = sum_j w[c][j] dpre[m-j], dw[c][j] += sum_t dpre[t] xp[t+j], db += sum_t dpre.
void conv1d_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dstate, const Tensor& dy,
                     const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& state, bool silu_out) {
  const int64_t T = x.rows(), C = x.cols(), K = w.cols();
  const F32Rows X(x), DY(dy), W(w), Bv(b), St(state);
  F32Out dX(dx, false), dW(dw, true), dB(db, true), dSt(dstate, false);
  auto xp = [&](int64_t m, int64_t c) -> float {  // the padded input
    if (m >= K - 1) return X.row(m - (K - 1))[c];
    return state.defined() ? St.p[m * C + c] : 0.0f;
  };
  parallel_for(C, T * C * K > (1 << 16), [&](int64_t c) {
    std::vector<float> dpre(static_cast<size_t>(T));
    const float* wc = W.row(c);
    double db_c = 0;
    for (int64_t t = 0; t < T; ++t) {
      float pre = b.defined() ? Bv.p[c] : 0.0f;
      for (int64_t j = 0; j < K; ++j) pre += wc[j] * xp(t + j, c);
      float g = DY.row(t)[c];
      if (silu_out) {
        const float sg = 1.0f / (1.0f + std::exp(-pre));
        g *= sg * (1.0f + pre * (1.0f - sg));
      }
      dpre[size_t(t)] = g;
      db_c += g;
    }
    for (int64_t j = 0; j < K; ++j) {
      double acc = 0;
      for (int64_t t = 0; t < T; ++t) acc += double(dpre[size_t(t)]) * xp(t + j, c);
      dW.row(c)[j] += float(acc);
    }
    if (b.defined()) dB.p[c] += float(db_c);
    for (int64_t m = 0; m < T + K - 1; ++m) {
      float acc = 0;
      for (int64_t j = 0; j < K; ++j)
        if (m - j >= 0 && m - j < T) acc += wc[j] * dpre[size_t(m - j)];
      if (m >= K - 1) dX.row(m - (K - 1))[c] = acc;
      else if (dstate.defined()) dSt.p[m * C + c] = acc;
    }
  });
  for (F32Out* o : {&dX, &dW, &dB, &dSt})
    if (o->t.defined()) o->commit();
}

// y = u r w with u = x silu(z), r = 1/sqrt(mean_g(u^2) + eps): du from the
// RMSNorm backward, then dx = du silu(z), dz = du x silu'(z); dw += sum dy u r.
void gated_rmsnorm_backward(const Tensor& dx, const Tensor& dz, const Tensor& dw, const Tensor& dy, const Tensor& x,
                            const Tensor& z, const Tensor& w, float eps, int64_t group) {
  const int64_t T = x.rows(), n = x.cols();
  const F32Rows X(x), Z(z), DY(dy), W(w);
  F32Out dX(dx, false), dZ(dz, false), dW(dw, true);
  std::vector<double> dw_sum(static_cast<size_t>(n), 0.0);
#pragma omp parallel if (T * n > (1 << 15))
  {
    std::vector<double> mine(static_cast<size_t>(n), 0.0);
    std::vector<float> u(static_cast<size_t>(n)), sz(static_cast<size_t>(n));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float *xr = X.row(t), *zr = Z.row(t), *g = DY.row(t);
      for (int64_t c = 0; c < n; ++c) {
        sz[size_t(c)] = 1.0f / (1.0f + std::exp(-zr[c]));
        u[size_t(c)] = xr[c] * zr[c] * sz[size_t(c)];
      }
      for (int64_t g0 = 0; g0 < n; g0 += group) {
        float ss = 0, gu = 0;
        for (int64_t c = g0; c < g0 + group; ++c) {
          ss += u[size_t(c)] * u[size_t(c)];
          gu += g[c] * W.p[c] * u[size_t(c)];
        }
        const float r = 1.0f / std::sqrt(ss / float(group) + eps), k = r * r * r * gu / float(group);
        for (int64_t c = g0; c < g0 + group; ++c) {
          const float du = r * g[c] * W.p[c] - k * u[size_t(c)];
          const float s = sz[size_t(c)], silu_z = zr[c] * s;
          dX.row(t)[c] = du * silu_z;
          dZ.row(t)[c] = du * xr[c] * s * (1.0f + zr[c] * (1.0f - s));
          mine[size_t(c)] += double(g[c]) * u[size_t(c)] * r;
        }
      }
    }
#pragma omp critical
    for (int64_t c = 0; c < n; ++c) dw_sum[size_t(c)] += mine[size_t(c)];
  }
  for (int64_t c = 0; c < n; ++c) dW.p[c] += float(dw_sum[size_t(c)]);
  for (F32Out* o : {&dX, &dZ, &dW}) o->commit();
}

// Per row: lse = log sum exp(x); loss = lse - x[target]; x <- scale (softmax(x) - onehot).
void cross_entropy(const Tensor& logits, const Tensor& loss, std::span<const int32_t> targets, float scale) {
  const int64_t R = logits.rows(), V = logits.cols();
#pragma omp parallel for schedule(static) if (R * V > (1 << 15))
  for (int64_t r = 0; r < R; ++r) {
    float* x = logits.data<float>() + r * logits.ld();
    const int32_t tgt = targets[size_t(r)];
    if (tgt < 0) {
      std::fill_n(x, V, 0.0f);
      loss.data<float>()[r] = 0;
      continue;
    }
    const float xt = x[tgt];
    float mx = -INFINITY;
    for (int64_t c = 0; c < V; ++c) mx = std::max(mx, x[c]);
    double sum = 0;
    for (int64_t c = 0; c < V; ++c) {
      x[c] = std::exp(x[c] - mx);
      sum += x[c];
    }
    const float inv = float(1.0 / sum);
    loss.data<float>()[r] = float(double(mx) + std::log(sum) - double(xt));
    for (int64_t c = 0; c < V; ++c) x[c] *= inv * scale;
    x[tgt] -= scale;
  }
}

namespace {
// fn(fp32 values, count) over a contiguous tensor of any float dtype, a block
// at a time (widened into the stack when not fp32), blocks over threads; the
// block results are summed as double.
template <class F>
double sum_over_blocks(const Tensor& t, F&& fn) {
  const int64_t n = t.numel();
  constexpr int64_t kBlock = 4096;
  double total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total) if (n > (1 << 16))
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t len = std::min(kBlock, n - i0);
    float buf[kBlock];
    const float* p = buf;
    if (t.dtype() == DType::F32) p = t.data<float>() + i0;
    else widen(static_cast<const char*>(t.raw()) + i0 * dtype_size(t.dtype()), t.dtype(), len, buf);
    total += fn(p, len);
  }
  return total;
}
}  // namespace

void sum_squares(const Tensor& out, const Tensor& t) {
  out.data<float>()[0] += float(sum_over_blocks(t, [](const float* p, int64_t len) {
    float s = 0;
    for (int64_t i = 0; i < len; ++i) s += p[i] * p[i];
    return double(s);
  }));
}

void count_nonfinite(const Tensor& out, const Tensor& t) {
  out.data<float>()[0] += float(sum_over_blocks(t, [](const float* p, int64_t len) {
    int64_t bad = 0;
    for (int64_t i = 0; i < len; ++i) bad += !std::isfinite(p[i]);
    return double(bad);
  }));
}

// AdamW on fp32 values: the master copy when the parameter is 16-bit (the
// parameter then receives the rounded result), else the parameter itself.
void adamw(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
           const AdamWArgs& a) {
  const int64_t n = param.numel();
  const float bc1 = 1.0f - std::pow(a.beta1, float(a.step)), bc2 = 1.0f - std::pow(a.beta2, float(a.step));
  const float step = a.lr / bc1, inv_bc2 = 1.0f / bc2;
  float* pm = master.defined() ? master.data<float>() : param.data<float>();
  float* mm = m.data<float>();
  float* vv = v.data<float>();
  constexpr int64_t kBlock = 4096;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t len = std::min(kBlock, n - i0);
    float gbuf[kBlock];
    const float* g = gbuf;
    if (grad.dtype() == DType::F32) g = grad.data<float>() + i0;
    else widen(static_cast<const char*>(grad.raw()) + i0 * dtype_size(grad.dtype()), grad.dtype(), len, gbuf);
    for (int64_t i = 0; i < len; ++i) {
      const int64_t j = i0 + i;
      const float gi = g[i] * a.grad_scale;
      mm[j] = a.beta1 * mm[j] + (1.0f - a.beta1) * gi;
      vv[j] = a.beta2 * vv[j] + (1.0f - a.beta2) * gi * gi;
      pm[j] -= step * mm[j] / (std::sqrt(vv[j] * inv_bc2) + a.eps) + a.lr * a.weight_decay * pm[j];
    }
    if (master.defined())
      narrow(pm + i0, len, param.dtype(), static_cast<char*>(param.raw()) + i0 * dtype_size(param.dtype()));
  }
}

}  // namespace ss::cpu
