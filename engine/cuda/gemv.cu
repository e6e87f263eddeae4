// y[m, n] (+)= sum_k x[m, k] w[n, k] for a few rows m: decode's products,
// which read every weight once per token and so run at the memory's rate or
// not at all. A warp takes a weight row at a time and streams it in 16-byte
// pieces, four in flight a lane; x's pieces come through the L1 with them.
// (Two rows a warp, eight pieces in flight, measured no faster on an H200.)
// Accumulation in fp32, the result rounded once on store.
#include "cuda/common.cuh"

namespace ss::SS_CUDA_NS {
namespace {

constexpr int kThreads = 256, kUnroll = 4;

template <DType DT, int MAXM>
__global__ void __launch_bounds__(kThreads) gemv_kernel(Mat y, Mat x, Mat w, bool accumulate) {
  constexpr int VEC = DT == DType::F32 ? 4 : 8;
  constexpr int64_t es = DT == DType::F32 ? 4 : 2;
  const int lane = int(threadIdx.x) % 32, M = int(x.rows);
  const int64_t pieces = x.cols / VEC, warps = int64_t(gridDim.x) * (kThreads / 32);
  const char* xb = static_cast<const char*>(x.p);
  for (int64_t n = int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32; n < w.rows; n += warps) {
    const char* wr = static_cast<const char*>(w.p) + n * w.ld * es;
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
      if (lane == 0) put(y, m, n, accumulate ? at(y, m, n) + sum : sum);
    }
  }
}

template <DType DT>
void launch(const Mat& y, const Mat& x, const Mat& w, bool accumulate, Stream s) {
  auto* kernel = x.rows == 1 ? &gemv_kernel<DT, 1> : &gemv_kernel<DT, 4>;
  // A warp a weight row, up to 8 blocks an SM's worth on the largest GPUs.
  SS_LAUNCH(kernel, unsigned(min64((w.rows + 7) / 8, 132 * 8)), kThreads, 0, s)(y, x, w, accumulate);
  check_launch("gemv");
}

}  // namespace

bool gemv_fits(const Mat& y, const Mat& x, const Mat& w) {
  const int vec = x.dt == DType::F32 ? 4 : 8;
  return x.rows >= 1 && x.rows <= 4 && x.dt == w.dt && x.dt != DType::I32 && x.cols == w.cols &&
         x.cols % vec == 0 && y.rows == x.rows && y.cols == w.rows && aligned16(x) && aligned16(w);
}

void gemv(const Mat& y, const Mat& x, const Mat& w, bool accumulate, Stream s) {
  expect(gemv_fits(y, x, w), "gemv", "needs 1 to 4 rows, one dtype, 16-byte aligned rows of whole pieces");
  if (w.rows == 0) return;
  if (x.dt == DType::BF16) launch<DType::BF16>(y, x, w, accumulate, s);
  else if (x.dt == DType::F16) launch<DType::F16>(y, x, w, accumulate, s);
  else launch<DType::F32>(y, x, w, accumulate, s);
}

}  // namespace ss::SS_CUDA_NS
