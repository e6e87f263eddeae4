// Elementwise and row-gather kernels: a thread per value over 2-D views of
// any row stride and dtype, computing in fp32 and rounding once on store.
#include "cuda/common.cuh"

namespace ss::SS_CUDA_NS {
namespace {

constexpr int kThreads = 256;

// Thread i of the grid-stride loop handles value (i / cols, i % cols).
#define SS_FOR_EACH_VALUE(rows, cols)                                                                      \
  for (int64_t i_ = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, n_ = (rows) * (cols); i_ < n_;     \
       i_ += int64_t(gridDim.x) * blockDim.x)

__global__ void fill_kernel(Mat y, float v) {
  SS_FOR_EACH_VALUE(y.rows, y.cols) put(y, i_ / y.cols, i_ % y.cols, v);
}

__global__ void fill_random_kernel(Mat y, uint64_t seed, float scale) {
  SS_FOR_EACH_VALUE(y.rows, y.cols) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + uint64_t(i_) + 0x632be59bd9b4e019ull;  // splitmix64
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    put(y, i_ / y.cols, i_ % y.cols, scale * (float(x >> 40) * 1.1920928955078125e-07f - 1.0f));  // 2^-23
  }
}

__global__ void convert_kernel(Mat dst, Mat src) {
  SS_FOR_EACH_VALUE(dst.rows, dst.cols) {
    const int64_t r = i_ / dst.cols, c = i_ % dst.cols;
    put(dst, r, c, at(src, r, c));
  }
}

__global__ void add_kernel(Mat y, Mat a, Mat b) {
  SS_FOR_EACH_VALUE(y.rows, y.cols) {
    const int64_t r = i_ / y.cols, c = i_ % y.cols;
    put(y, r, c, at(a, r, c) + at(b, r, c));
  }
}

__global__ void add_bias_kernel(Mat y, Mat bias) {
  SS_FOR_EACH_VALUE(y.rows, y.cols) {
    const int64_t r = i_ / y.cols, c = i_ % y.cols;
    put(y, r, c, at(y, r, c) + at(bias, 0, c));
  }
}

__global__ void silu_mul_kernel(Mat y, Mat gate, Mat up) {
  pdl_begin();
  SS_FOR_EACH_VALUE(y.rows, y.cols) {
    const int64_t r = i_ / y.cols, c = i_ % y.cols;
    put(y, r, c, silu(at(gate, r, c)) * at(up, r, c));
  }
}

__global__ void embedding_kernel(Mat y, Mat table, const int32_t* tokens) {
  SS_FOR_EACH_VALUE(y.rows, y.cols) {
    const int64_t r = i_ / y.cols, c = i_ % y.cols;
    put(y, r, c, at(table, tokens[r], c));
  }
}

// The same in 16-byte pieces where pieces_fit: a piece per thread, its row
// found once for VEC values.
enum class Binary { Add, SiluMul };
#define SS_FOR_EACH_PIECE(rows, per_row)                                                                   \
  for (int64_t i_ = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, n_ = (rows) * (per_row); i_ < n_; \
       i_ += int64_t(gridDim.x) * blockDim.x)

template <DType DT>
SS_DEV const void* piece(const Mat& m, int64_t r, int64_t p) {
  constexpr int64_t es = DT == DType::F32 ? 4 : 2, VEC = 16 / es;
  return static_cast<const char*>(m.p) + (r * m.ld + p * VEC) * es;
}

template <DType DT, Binary OP>
__global__ void binary_pieces_kernel(Mat y, Mat a, Mat b) {
  pdl_begin();
  constexpr int VEC = DT == DType::F32 ? 4 : 8;
  const int64_t per_row = y.cols / VEC;
  SS_FOR_EACH_PIECE(y.rows, per_row) {
    const int64_t r = i_ / per_row, p = i_ % per_row;
    float av[VEC], bv[VEC];
    unpack16<DT>(load16(piece<DT>(a, r, p)), av);
    unpack16<DT>(load16(piece<DT>(b, r, p)), bv);
    for (int e = 0; e < VEC; ++e) av[e] = OP == Binary::Add ? av[e] + bv[e] : silu(av[e]) * bv[e];
    store16(const_cast<void*>(piece<DT>(y, r, p)), pack16<DT>(av));
  }
}

// Rows copied piece by piece: a strided copy within a dtype, or the
// embedding's gather (src row tokens[r]).
template <DType DT>
__global__ void copy_pieces_kernel(Mat y, Mat src, const int32_t* tokens) {
  constexpr int VEC = DT == DType::F32 ? 4 : 8;
  const int64_t per_row = y.cols / VEC;
  SS_FOR_EACH_PIECE(y.rows, per_row) {
    const int64_t r = i_ / per_row, p = i_ % per_row;
    store16(const_cast<void*>(piece<DT>(y, r, p)), load16(piece<DT>(src, tokens ? tokens[r] : r, p)));
  }
}
#undef SS_FOR_EACH_PIECE

// One block: each thread keeps the best of its columns (the lowest index
// among equal values), then the block reduces (value, index) pairs.
__global__ void argmax_kernel(Mat x, int64_t row, int32_t* out) {
  float best = -INFINITY;
  int64_t best_i = -1;
  for (int64_t c = threadIdx.x; c < x.cols; c += blockDim.x) {
    const float v = at(x, row, c);
    if (best_i < 0 || v > best) {
      best = v;
      best_i = c;
    }
  }
  __shared__ float vals[kThreads];
  __shared__ int64_t idx[kThreads];
  vals[threadIdx.x] = best;
  idx[threadIdx.x] = best_i;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      const float v = vals[threadIdx.x + half];
      const int64_t j = idx[threadIdx.x + half];
      const int64_t i = idx[threadIdx.x];
      // NaN never wins, as the cpu's `r[c] > r[best]` scan never picks one.
      if (j >= 0 && (i < 0 || v > vals[threadIdx.x] || (v == vals[threadIdx.x] && j < i))) {
        vals[threadIdx.x] = v;
        idx[threadIdx.x] = j;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = int32_t(idx[0] < 0 ? 0 : idx[0]);
}

__global__ void ssd_state_advance_kernel(float* state, const float* chunk, const float* log_decay, int64_t H,
                                         int64_t per) {
  SS_FOR_EACH_VALUE(H, per) state[i_] = expf(log_decay[i_ / per]) * state[i_] + chunk[i_];
}

__global__ void selective_state_advance_kernel(float* state, Mat A_log, const float* chunk, const float* dt_sum,
                                               int64_t C, int64_t N) {
  SS_FOR_EACH_VALUE(C, N) {
    const float decay = expf(-expf(load(A_log.p, i_, A_log.dt)) * dt_sum[i_ / N]);
    state[i_] = decay * state[i_] + chunk[i_];
  }
}

__global__ void sum_rows_kernel(void* dst, const void* src, int rows, int64_t count, DType dt) {
  SS_FOR_EACH_VALUE(1, count) {
    float acc = 0.0f;
    for (int r = 0; r < rows; ++r) acc += load(src, int64_t(r) * count + i_, dt);
    store(dst, i_, dt, acc);
  }
}

#undef SS_FOR_EACH_VALUE

unsigned grid_for(int64_t n) { return blocks_for(n, kThreads); }

template <Binary OP>
void binary_pieces(const Mat& y, const Mat& a, const Mat& b, Stream s) {
  const int vec = y.dt == DType::F32 ? 4 : 8;
  auto* kernel = for_dtype(y.dt, [](auto d) { return &binary_pieces_kernel<decltype(d)::value, OP>; });
  launch_dependent("elementwise", kernel, grid_for(y.rows * y.cols / vec), kThreads, 0, s, y, a, b);
}

void copy_pieces(const Mat& y, const Mat& src, const int32_t* tokens, Stream s) {
  const int vec = y.dt == DType::F32 ? 4 : 8;
  auto* kernel = for_dtype(y.dt, [](auto d) { return &copy_pieces_kernel<decltype(d)::value>; });
  SS_LAUNCH(kernel, grid_for(y.rows * y.cols / vec), kThreads, 0, s)(y, src, tokens);
}

}  // namespace

void fill(const Mat& y, float value, Stream s) {
  if (y.rows * y.cols == 0) return;
  SS_LAUNCH(fill_kernel, grid_for(y.rows * y.cols), kThreads, 0, s)(y, value);
  check_launch("fill");
}

void fill_random(const Mat& y, uint64_t seed, float scale, Stream s) {
  if (y.rows * y.cols == 0) return;
  SS_LAUNCH(fill_random_kernel, grid_for(y.rows * y.cols), kThreads, 0, s)(y, seed, scale);
  check_launch("fill_random");
}

void convert(const Mat& dst, const Mat& src, Stream s) {
  expect(dst.rows == src.rows && dst.cols == src.cols, "convert", "shapes differ");
  if (dst.rows * dst.cols == 0) return;
  if (pieces_fit({&dst, &src}, dst.cols)) {
    copy_pieces(dst, src, nullptr, s);
    return check_launch("convert");
  }
  SS_LAUNCH(convert_kernel, grid_for(dst.rows * dst.cols), kThreads, 0, s)(dst, src);
  check_launch("convert");
}

void add(const Mat& y, const Mat& a, const Mat& b, Stream s) {
  if (y.rows * y.cols == 0) return;
  if (pieces_fit({&y, &a, &b}, y.cols)) {
    binary_pieces<Binary::Add>(y, a, b, s);
    return check_launch("add");
  }
  SS_LAUNCH(add_kernel, grid_for(y.rows * y.cols), kThreads, 0, s)(y, a, b);
  check_launch("add");
}

void add_bias(const Mat& y, const Mat& bias, Stream s) {
  expect(bias.cols == y.cols, "add_bias", "bias length differs from the columns");
  if (y.rows * y.cols == 0) return;
  SS_LAUNCH(add_bias_kernel, grid_for(y.rows * y.cols), kThreads, 0, s)(y, bias);
  check_launch("add_bias");
}

void silu_mul(const Mat& y, const Mat& gate, const Mat& up, Stream s) {
  if (y.rows * y.cols == 0) return;
  if (pieces_fit({&y, &gate, &up}, y.cols)) {
    binary_pieces<Binary::SiluMul>(y, gate, up, s);
    return check_launch("silu_mul");
  }
  launch_dependent("silu_mul", silu_mul_kernel, grid_for(y.rows * y.cols), kThreads, 0, s, y, gate, up);
  check_launch("silu_mul");
}

void embedding(const Mat& y, const Mat& table, const int32_t* tokens, Stream s) {
  if (y.rows * y.cols == 0) return;
  if (pieces_fit({&y, &table}, y.cols)) {
    copy_pieces(y, table, tokens, s);
    return check_launch("embedding");
  }
  SS_LAUNCH(embedding_kernel, grid_for(y.rows * y.cols), kThreads, 0, s)(y, table, tokens);
  check_launch("embedding");
}

void sum_rows(void* dst, const void* src, int rows, int64_t count, DType dt, Stream s) {
  if (count == 0) return;
  SS_LAUNCH(sum_rows_kernel, grid_for(count), kThreads, 0, s)(dst, src, rows, count, dt);
  check_launch("sum_rows");
}

void argmax_row(const Mat& x, int64_t row, int32_t* out, Stream s) {
  expect(row >= 0 && row < x.rows && x.cols > 0, "argmax", "row out of range");
  SS_LAUNCH(argmax_kernel, 1, kThreads, 0, s)(x, row, out);
  check_launch("argmax");
}

void ssd_state_advance(float* state, const float* chunk, const float* log_decay, int64_t H, int64_t per, Stream s) {
  if (H * per == 0) return;
  SS_LAUNCH(ssd_state_advance_kernel, grid_for(H * per), kThreads, 0, s)(state, chunk, log_decay, H, per);
  check_launch("ssd_state_advance");
}

void selective_state_advance(float* state, const Mat& A_log, const float* chunk, const float* dt_sum, int64_t C,
                             int64_t N, Stream s) {
  if (C * N == 0) return;
  SS_LAUNCH(selective_state_advance_kernel, grid_for(C * N), kThreads, 0, s)(state, A_log, chunk, dt_sum, C, N);
  check_launch("selective_state_advance");
}

}  // namespace ss::SS_CUDA_NS
