// nvcuda::wmma for the emulator: every lane of a warp holds the whole tile
// (its layout on a GPU is opaque to the code, so kernels only move fragments
// through load / store / mma, which is what this models), the 16-bit types
// as their bits, and the API's rules checked: the warp calls each operation
// together (a warp barrier), pointers are 32-byte aligned and leading
// dimensions a multiple of 16 bytes.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/dtype.h"
#include "cuda/emu/emu.h"

struct __nv_bfloat16 {
  uint16_t bits;
};
struct __half {
  uint16_t bits;
};
using half = __half;

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static constexpr int rows = std::is_same_v<Use, matrix_b> ? K : M;
  static constexpr int cols = std::is_same_v<Use, matrix_a> ? K : N;
  static constexpr int num_elements = rows * cols;
  float x[num_elements];  // (r, c) at x[r * cols + c]
};

namespace detail {
inline float to_float(__nv_bfloat16 v) { return ss::bf16_to_f32(v.bits); }
inline float to_float(__half v) { return ss::f16_to_f32(v.bits); }
inline float to_float(float v) { return v; }
template <class T>
void check(const T* p, unsigned ldm, const char* op) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0)
    throw std::runtime_error(std::string("emulated wmma::") + op + ": pointer not 32-byte aligned");
  if ((ldm * sizeof(T)) % 16 != 0)
    throw std::runtime_error(std::string("emulated wmma::") + op + ": leading dimension " + std::to_string(ldm) +
                             " is not a multiple of 16 bytes");
}
}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, float v) {
  for (float& e : f.x) e = v;
}

// matrix_a / matrix_b: the layout is the fragment's.
template <class Use, int M, int N, int K, class T, class Layout, class E>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const E* p, unsigned ldm) {
  static_assert(!std::is_same_v<Use, accumulator>, "an accumulator load takes a layout_t");
  detail::check(p, ldm, "load_matrix_sync");
  using F = fragment<Use, M, N, K, T, Layout>;
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c)
      f.x[r * F::cols + c] =
          detail::to_float(std::is_same_v<Layout, row_major> ? p[r * ldm + c] : p[r + size_t(c) * ldm]);
  ss::emu::sync_warp();
}

template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm, layout_t layout) {
  detail::check(p, ldm, "load_matrix_sync");
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) f.x[r * N + c] = layout == mem_row_major ? p[r * ldm + c] : p[r + size_t(c) * ldm];
  ss::emu::sync_warp();
}

template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm, layout_t layout) {
  detail::check(p, ldm, "store_matrix_sync");
  ss::emu::sync_warp();  // every lane has its fragment before any stores
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) (layout == mem_row_major ? p[r * ldm + c] : p[r + size_t(c) * ldm]) = f.x[r * N + c];
  ss::emu::sync_warp();
}

template <int M, int N, int K, class T, class LA, class LB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, T, LA>& a,
              const fragment<matrix_b, M, N, K, T, LB>& b, const fragment<accumulator, M, N, K, float>& c) {
  float out[M * N];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float acc = c.x[i * N + j];
      for (int k = 0; k < K; ++k) acc += a.x[i * K + k] * b.x[k * N + j];
      out[i * N + j] = acc;
    }
  for (int i = 0; i < M * N; ++i) d.x[i] = out[i];
  ss::emu::sync_warp();
}

}  // namespace nvcuda::wmma
