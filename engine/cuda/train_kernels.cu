// Backward kernels of the row-wise ops, the loss and the optimizer, in fp32
// registers over tensors of any dtype (as cpu/train_kernels.cpp; the same
// formulas, there with their derivations). Sums the cpu takes in double are
// double here too.
#include <algorithm>

#include "cuda/common.cuh"
#include "cuda/runtime.h"

namespace ss::SS_CUDA_NS {
namespace {

constexpr int kThreads = 256;

#define SS_FOR_EACH(n)                                                                                   \
  for (int64_t i_ = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, n_ = (n); i_ < n_;               \
       i_ += int64_t(gridDim.x) * blockDim.x)

// dtable[u] += sum of dy's rows of token u: a thread per (distinct token, column)
// walks that token's rows (order[offsets[j] .. offsets[j + 1])), no atomics.
__global__ void embedding_backward_kernel(Mat dtable, Mat dy, const int32_t* uniq, const int32_t* offsets,
                                          const int32_t* order, int64_t n_uniq) {
  SS_FOR_EACH(n_uniq * dy.cols) {
    const int64_t j = i_ / dy.cols, c = i_ % dy.cols;
    float acc = at(dtable, uniq[j], c);
    for (int32_t k = offsets[j]; k < offsets[j + 1]; ++k) acc += at(dy, order[k], c);
    put(dtable, uniq[j], c, acc);
  }
}

// A block per (row, group): y = x r w, r = 1/sqrt(mean(x^2) + eps):
// dx += r u - x r^3 mean(u x) with u = dy w; dw's per-row terms dy x r
// summed over rows in double (dw_acc) by atomics.
__global__ void __launch_bounds__(kThreads) rmsnorm_backward_kernel(Mat dx, Mat dy, Mat x, Mat w, float eps,
                                                                    int64_t group, double* dw_acc) {
  __shared__ float red[32];
  const int64_t groups = x.cols / group;
  for (int64_t item = blockIdx.x; item < x.rows * groups; item += gridDim.x) {
    const int64_t t = item / groups, c0 = (item % groups) * group;
    float ss = 0, ux = 0;
    for (int64_t c = c0 + threadIdx.x; c < c0 + group; c += blockDim.x) {
      const float xv = at(x, t, c), u = at(dy, t, c) * (w.p ? at(w, 0, c) : 1.0f);
      ss += xv * xv;
      ux += u * xv;
    }
    ss = block_sum(ss, red);
    ux = block_sum(ux, red);
    const float r = 1.0f / sqrtf(ss / float(group) + eps), k = r * r * r * ux / float(group);
    for (int64_t c = c0 + threadIdx.x; c < c0 + group; c += blockDim.x) {
      const float xv = at(x, t, c), g = at(dy, t, c), u = g * (w.p ? at(w, 0, c) : 1.0f);
      put(dx, t, c, at(dx, t, c) + r * u - k * xv);
      if (dw_acc) atomicAdd(&dw_acc[c], double(g) * xv * r);
    }
  }
}

// u = x silu(z), y = u r w: du = r dy w - u r^3 mean(dy w u); dx = du silu(z),
// dz = du x s (1 + z (1 - s)); dw's terms dy u r by atomics as above.
__global__ void __launch_bounds__(kThreads) gated_backward_kernel(Mat dx, Mat dz, Mat dy, Mat x, Mat z, Mat w,
                                                                  float eps, int64_t group, double* dw_acc) {
  __shared__ float red[32];
  const int64_t groups = x.cols / group;
  for (int64_t item = blockIdx.x; item < x.rows * groups; item += gridDim.x) {
    const int64_t t = item / groups, c0 = (item % groups) * group;
    float ss = 0, gu = 0;
    for (int64_t c = c0 + threadIdx.x; c < c0 + group; c += blockDim.x) {
      const float zv = at(z, t, c), s = 1.0f / (1.0f + expf(-zv)), u = at(x, t, c) * zv * s;
      ss += u * u;
      gu += at(dy, t, c) * at(w, 0, c) * u;
    }
    ss = block_sum(ss, red);
    gu = block_sum(gu, red);
    const float r = 1.0f / sqrtf(ss / float(group) + eps), k = r * r * r * gu / float(group);
    for (int64_t c = c0 + threadIdx.x; c < c0 + group; c += blockDim.x) {
      const float xv = at(x, t, c), zv = at(z, t, c), s = 1.0f / (1.0f + expf(-zv)), u = xv * zv * s;
      const float g = at(dy, t, c), du = r * g * at(w, 0, c) - k * u;
      put(dx, t, c, du * zv * s);
      put(dz, t, c, du * xv * s * (1.0f + zv * (1.0f - s)));
      atomicAdd(&dw_acc[c], double(g) * u * r);
    }
  }
}

// dw[c] += acc[c] (the rows' sum, taken in double).
__global__ void add_double_kernel(Mat dw, const double* acc, int64_t n) {
  SS_FOR_EACH(n) store(dw.p, i_, dw.dt, load(dw.p, i_, dw.dt) + float(acc[i_]));
}

// A thread per column: the rows in order, in double (as the cpu sums them).
__global__ void bias_backward_kernel(float* db, Mat dy) {
  SS_FOR_EACH(dy.cols) {
    double sum = 0;
    for (int64_t t = 0; t < dy.rows; ++t) sum += at(dy, t, i_);
    db[i_] += float(sum);
  }
}

__global__ void silu_mul_backward_kernel(Mat dgate, Mat dup, Mat dy, Mat gate, Mat up) {
  SS_FOR_EACH(dy.rows * dy.cols) {
    const int64_t t = i_ / dy.cols, c = i_ % dy.cols;
    const float g = at(gate, t, c), u = at(up, t, c), d = at(dy, t, c), s = 1.0f / (1.0f + expf(-g));
    put(dgate, t, c, d * u * s * (1.0f + g * (1.0f - s)));
    put(dup, t, c, d * g * s);
  }
}

// A block per row of fp32 logits.
__global__ void __launch_bounds__(kThreads) cross_entropy_kernel(Mat logits, float* loss, const int32_t* targets,
                                                                 float scale) {
  __shared__ float red[32];
  __shared__ double dred[kThreads];
  float* x = static_cast<float*>(logits.p);
  for (int64_t r = blockIdx.x; r < logits.rows; r += gridDim.x) {
    float* row = x + r * logits.ld;
    const int32_t tgt = targets[r];
    if (tgt < 0) {
      for (int64_t c = threadIdx.x; c < logits.cols; c += blockDim.x) row[c] = 0.0f;
      if (threadIdx.x == 0) loss[r] = 0.0f;
      continue;
    }
    const float xt = row[tgt];
    float mx = -INFINITY;
    for (int64_t c = threadIdx.x; c < logits.cols; c += blockDim.x) mx = fmaxf(mx, row[c]);
    mx = block_max(mx, red);  // every thread has read row[tgt] before any writes
    double sum = 0;
    for (int64_t c = threadIdx.x; c < logits.cols; c += blockDim.x) {
      const float e = expf(row[c] - mx);
      row[c] = e;
      sum += e;
    }
    sum = block_sum_double(sum, dred);
    const float inv = float(1.0 / sum);
    for (int64_t c = threadIdx.x; c < logits.cols; c += blockDim.x)
      row[c] = row[c] * inv * scale - (c == tgt ? scale : 0.0f);
    if (threadIdx.x == 0) loss[r] = float(double(mx) + log(sum) - double(xt));
  }
}

// out[0] += the tensor's sum of squares (or its count of non-finite values):
// per thread in fp32 over a stretch, per block, then across blocks in double.
__global__ void __launch_bounds__(kThreads) sum_squares_kernel(Mat t, int64_t n, bool nonfinite, double* acc) {
  __shared__ float red[32];
  float s = 0;
  SS_FOR_EACH(n) {
    const float v = load(t.p, i_, t.dt);
    s += nonfinite ? float(!isfinite(v)) : v * v;
  }
  s = block_sum(s, red);
  if (threadIdx.x == 0) atomicAdd(acc, double(s));
}
__global__ void add_total_kernel(float* out, const double* acc) {
  if (threadIdx.x == 0) out[0] += float(acc[0]);
}

__global__ void adamw_kernel(Mat param, float* master, Mat grad, float* m, float* v, int64_t n, AdamWStep a) {
  SS_FOR_EACH(n) {
    const float g = load(grad.p, i_, grad.dt) * a.grad_scale;
    m[i_] = a.beta1 * m[i_] + (1.0f - a.beta1) * g;
    v[i_] = a.beta2 * v[i_] + (1.0f - a.beta2) * g * g;
    float p = master ? master[i_] : load(param.p, i_, param.dt);
    p -= a.step_size * m[i_] / (sqrtf(v[i_] * a.inv_bc2) + a.eps) + a.lr * a.weight_decay * p;
    if (master) master[i_] = p;
    store(param.p, i_, param.dt, p);
  }
}

#undef SS_FOR_EACH

unsigned grid_for(int64_t n) { return blocks_for(n, kThreads); }

}  // namespace

void embedding_backward(const Mat& dtable, const Mat& dy, const int32_t* uniq, const int32_t* offsets,
                        const int32_t* order, int64_t n_uniq, Stream s) {
  if (n_uniq * dy.cols == 0) return;
  SS_LAUNCH(embedding_backward_kernel, grid_for(n_uniq * dy.cols), kThreads, 0, s)(dtable, dy, uniq, offsets, order,
                                                                                   n_uniq);
  check_launch("embedding_backward");
}

namespace {
// A zeroed double per column, for sums over rows taken by atomics.
double* column_sums(Scratch& scratch, int64_t n, Stream s) {
  auto* acc = static_cast<double*>(scratch.get(kScratchGrad, int64_t(sizeof(double)) * (n > 0 ? n : 1)));
  memset_device(acc, 0, int64_t(sizeof(double)) * n, s);
  return acc;
}
}  // namespace

void rmsnorm_backward(const Mat& dx, const Mat& dw, const Mat& dy, const Mat& x, const Mat& w, float eps, int64_t group,
                      Scratch& scratch, Stream s) {
  expect(group > 0 && x.cols % group == 0, "rmsnorm_backward", "the group does not divide the columns");
  if (x.rows * x.cols == 0) return;
  double* acc = dw.p ? column_sums(scratch, x.cols, s) : nullptr;
  SS_LAUNCH(rmsnorm_backward_kernel, blocks_for(x.rows * (x.cols / group), 1), kThreads, 0, s)(dx, dy, x, w, eps,
                                                                                              group, acc);
  check_launch("rmsnorm_backward");
  if (!acc) return;
  SS_LAUNCH(add_double_kernel, grid_for(x.cols), kThreads, 0, s)(dw, acc, x.cols);
  check_launch("rmsnorm_backward (dw)");
}

void gated_rmsnorm_backward(const Mat& dx, const Mat& dz, const Mat& dw, const Mat& dy, const Mat& x, const Mat& z,
                            const Mat& w, float eps, int64_t group, Scratch& scratch, Stream s) {
  expect(group > 0 && x.cols % group == 0, "gated_rmsnorm_backward", "the group does not divide the columns");
  if (x.rows * x.cols == 0) return;
  double* acc = column_sums(scratch, x.cols, s);
  SS_LAUNCH(gated_backward_kernel, blocks_for(x.rows * (x.cols / group), 1), kThreads, 0, s)(dx, dz, dy, x, z, w, eps,
                                                                                            group, acc);
  check_launch("gated_rmsnorm_backward");
  SS_LAUNCH(add_double_kernel, grid_for(x.cols), kThreads, 0, s)(dw, acc, x.cols);
  check_launch("gated_rmsnorm_backward (dw)");
}

void bias_backward(float* db, const Mat& dy, Stream s) {
  if (dy.cols == 0) return;
  SS_LAUNCH(bias_backward_kernel, grid_for(dy.cols), kThreads, 0, s)(db, dy);
  check_launch("bias_backward");
}

void silu_mul_backward(const Mat& dgate, const Mat& dup, const Mat& dy, const Mat& gate, const Mat& up, Stream s) {
  if (dy.rows * dy.cols == 0) return;
  SS_LAUNCH(silu_mul_backward_kernel, grid_for(dy.rows * dy.cols), kThreads, 0, s)(dgate, dup, dy, gate, up);
  check_launch("silu_mul_backward");
}

void cross_entropy(const Mat& logits, float* loss, const int32_t* targets, float scale, Stream s) {
  expect(logits.dt == DType::F32, "cross_entropy", "logits must be fp32");
  if (logits.rows == 0) return;
  SS_LAUNCH(cross_entropy_kernel, blocks_for(logits.rows, 1), kThreads, 0, s)(logits, loss, targets, scale);
  check_launch("cross_entropy");
}

void sum_squares(float* out, const Mat& t, bool nonfinite, Scratch& scratch, Stream s) {
  const int64_t n = t.rows * t.cols;
  auto* acc = static_cast<double*>(scratch.get(kScratchReduce, int64_t(sizeof(double))));
  memset_device(acc, 0, int64_t(sizeof(double)), s);
  if (n > 0) {
    SS_LAUNCH(sum_squares_kernel, std::min<unsigned>(grid_for(n), 1024), kThreads, 0, s)(t, n, nonfinite, acc);
    check_launch("sum_squares");
  }
  SS_LAUNCH(add_total_kernel, 1, 32, 0, s)(out, acc);
  check_launch("sum_squares (total)");
}

void adamw(const Mat& param, float* master, const Mat& grad, float* m, float* v, int64_t n, const AdamWStep& a,
           Stream s) {
  if (n == 0) return;
  SS_LAUNCH(adamw_kernel, grid_for(n), kThreads, 0, s)(param, master, grad, m, v, n, a);
  check_launch("adamw");
}

}  // namespace ss::SS_CUDA_NS
