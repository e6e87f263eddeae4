// y[m, n] (+)= sum_k x[m, k] w[n, k] for a few rows m: decode's products,
// which read every weight once per token and so run at the memory's rate or
// not at all. A warp takes a weight row at a time and streams it in 16-byte
// pieces, four in flight a lane; x's pieces come through the L1 with them.
// (Two rows a warp, eight pieces in flight, measured no faster on an H200.)
// A group of products of one x (gemv_group) is one launch over all their rows.
// Launched dependent (common.cuh): its first weights are on their way to the
// L2 while the kernel that makes x still runs.
// Accumulation in fp32, the result rounded once on store.
#include "cuda/common.cuh"

namespace ss::SS_CUDA_NS {
namespace {

constexpr int kThreads = 256, kUnroll = 4;

// The products of one launch: w[i]'s rows are rows first[i] .. first[i + 1]
// - 1 of their concatenation, so a group (q, k and v; gate and up) fills the
// GPU as one matrix does, in one launch.
struct GemvSet {
  Mat y[kMaxGemvGroup], w[kMaxGemvGroup];
  int64_t first[kMaxGemvGroup + 1] = {};
  int64_t total = 0;  // first[count]: every row of the launch
  int count = 0;
};

template <DType DT, int MAXM>
__global__ void __launch_bounds__(kThreads) gemv_kernel(GemvSet set, Mat x, bool accumulate) {
  constexpr int VEC = DT == DType::F32 ? 4 : 8;
  constexpr int64_t es = DT == DType::F32 ? 4 : 2;
  const int lane = int(threadIdx.x) % 32, M = int(x.rows);
  const int64_t pieces = x.cols / VEC, warps = int64_t(gridDim.x) * (kThreads / 32);
  const char* xb = static_cast<const char*>(x.p);
  // The product row n belongs to (constant indices: the set stays in parameter space).
  auto locate = [&](int64_t n, Mat& w, Mat& y, int64_t& row) {
    w = set.w[0];
    y = set.y[0];
    row = n;
#pragma unroll
    for (int i = 1; i < kMaxGemvGroup; ++i)
      if (i < set.count && n >= set.first[i]) {
        w = set.w[i];
        y = set.y[i];
        row = n - set.first[i];
      }
  };
  const int64_t n0 = int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  // Launched dependent: while the kernel before (the norm or activation that
  // makes x) finishes, the weights -- which no kernel writes -- start towards
  // the L2: the first 128-byte lines of this warp's first row, as many as its
  // first round of loads reads. Then x may be read.
  if (n0 < set.total) {
    Mat w, y;
    int64_t row;
    locate(n0, w, y, row);
    const int64_t lines = (pieces * 16 + 127) / 128;
    if (lane < lines && lane < 32 * kUnroll * 16 / 128)
      prefetch_l2(static_cast<const char*>(w.p) + row * w.ld * es + lane * 128);
  }
  pdl_wait();
  pdl_release();
  for (int64_t n = n0; n < set.total; n += warps) {
    Mat w, y;
    int64_t row;
    locate(n, w, y, row);
    const char* wr = static_cast<const char*>(w.p) + row * w.ld * es;
    float acc[MAXM];
    for (int m = 0; m < MAXM; ++m) acc[m] = 0.0f;
    for (int64_t p0 = lane; p0 < pieces; p0 += 32 * kUnroll) {
      Bytes16 wv[kUnroll];  // unrolled loops with constant indices: registers, not local memory
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t p = p0 + 32 * u;
        wv[u] = p < pieces ? load16(wr + p * 16) : Bytes16{0, 0, 0, 0};
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t p = p0 + 32 * u;
        if (p < pieces) {
          float wf[VEC];
          unpack16<DT>(wv[u], wf);
          for (int m = 0; m < MAXM && m < M; ++m) {
            float xf[VEC];
            unpack16<DT>(load16(xb + (m * x.ld + p * VEC) * es), xf);
            for (int e = 0; e < VEC; ++e) acc[m] += xf[e] * wf[e];
          }
        }
      }
    }
    for (int m = 0; m < MAXM && m < M; ++m) {
      const float sum = warp_sum(acc[m]);
      if (lane == 0) put(y, m, row, accumulate ? at(y, m, row) + sum : sum);
    }
  }
}

template <DType DT, int MAXM>
void launch_as(const GemvSet& set, const Mat& x, bool accumulate, Stream s) {
  auto* kernel = &gemv_kernel<DT, MAXM>;
  // A warp a weight row, at most one wave of blocks (they stride over the rest).
  static const int resident = resident_blocks(kernel, kThreads, 0);
  launch_dependent("gemv", kernel, dim3(unsigned(min64((set.total + 7) / 8, resident))), dim3(kThreads), 0, s, set, x,
                   accumulate);
}

void launch(const GemvSet& set, const Mat& x, bool accumulate, Stream s) {
  for_dtype(x.dt, [&](auto d) {
    constexpr DType DT = decltype(d)::value;
    if (x.rows == 1) launch_as<DT, 1>(set, x, accumulate, s);
    else launch_as<DT, 4>(set, x, accumulate, s);
  });
}

}  // namespace

bool gemv_fits(const Mat& y, const Mat& x, const Mat& w) {
  const int vec = x.dt == DType::F32 ? 4 : 8;
  return x.rows >= 1 && x.rows <= 4 && x.dt == w.dt && x.dt != DType::I32 && x.cols == w.cols &&
         x.cols % vec == 0 && y.rows == x.rows && y.cols == w.rows && aligned16(x) && aligned16(w);
}

void gemv(const Mat& y, const Mat& x, const Mat& w, bool accumulate, Stream s) {
  gemv_group(&y, x, &w, 1, accumulate, s);
}

void gemv_group(const Mat* ys, const Mat& x, const Mat* ws, int count, bool accumulate, Stream s) {
  expect(count >= 1 && count <= kMaxGemvGroup, "gemv", "1 to 4 products");
  GemvSet set;
  for (int i = 0; i < count; ++i) {
    expect(gemv_fits(ys[i], x, ws[i]), "gemv", "needs 1 to 4 rows, one dtype, 16-byte aligned rows of whole pieces");
    set.y[i] = ys[i];
    set.w[i] = ws[i];
    set.first[i + 1] = set.first[i] + ws[i].rows;
  }
  set.count = count;
  set.total = set.first[count];
  if (set.total == 0) return;
  launch(set, x, accumulate, s);
}

}  // namespace ss::SS_CUDA_NS
