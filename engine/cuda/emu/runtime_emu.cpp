// The device runtime of the emulated build (runtime.h): "device" memory is
// host memory, streams run their work as it is queued, events are host
// timestamps, and the GEMM is cuBLAS's column-major definition computed on
// the host in fp32 -- so the backend's row-major to column-major mapping is
// checked by the same tests that check the kernels.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/runtime.h"

namespace ss::SS_CUDA_NS {
namespace {

struct EmuEvent {
  std::chrono::steady_clock::time_point t;
};

// A fresh address for each stream handle (never dereferenced).
Stream new_handle() { return static_cast<Stream>(new char); }

// A column of a column-major operand as fp32.
std::vector<float> widened(const void* p, DType dt, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<float> out(size_t(rows * cols));
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) out[size_t(c * rows + r)] = load(p, c * ld + r, dt);
  return out;
}

}  // namespace

void check_launch(const char*) {}

// Launches run one after another here; the flag only keeps the benchmark's
// two passes the same code.
namespace {
bool g_dependent = true;
}  // namespace
bool dependent_launch() { return g_dependent; }
void set_dependent_launch(bool on) { g_dependent = on; }
bool kernel_waits(const void*) { return true; }

std::string unavailable_reason() { return ""; }
int device_count() { return 1; }
DeviceProps device_props(int) {
  DeviceProps p;
  p.name = "emulated device (host CPU)";
  p.total_bytes = p.free_bytes = int64_t(16) << 30;
  p.cc_major = 9;
  p.sm_count = 1;
  return p;
}
void set_device(int) {}
std::string runtime_version() { return "emulated (no CUDA runtime)"; }

void* malloc_device(int64_t bytes, Stream) {
  const size_t rounded = (size_t(bytes) + 255) & ~size_t(255);
  return std::aligned_alloc(256, rounded ? rounded : 256);
}
void free_device(void* p, Stream) { std::free(p); }
void copy_to_device(void* dst, const void* src, int64_t bytes, Stream) { std::memcpy(dst, src, size_t(bytes)); }
void copy_to_host(void* dst, const void* src, int64_t bytes, Stream) { std::memcpy(dst, src, size_t(bytes)); }
void copy_on_device(void* dst, const void* src, int64_t bytes, Stream) { std::memmove(dst, src, size_t(bytes)); }
void copy_2d_on_device(void* dst, int64_t dpitch, const void* src, int64_t spitch, int64_t width, int64_t rows,
                       Stream) {
  for (int64_t r = 0; r < rows; ++r)
    std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, size_t(width));
}
void memset_device(void* p, int value, int64_t bytes, Stream) { std::memset(p, value, size_t(bytes)); }

Stream create_stream() { return new_handle(); }
void destroy_stream(Stream s) { delete static_cast<char*>(s); }
void sync_stream(Stream) {}
Event create_event() { return new EmuEvent; }
void destroy_event(Event e) { delete static_cast<EmuEvent*>(e); }
void record_event(Event e, Stream) { static_cast<EmuEvent*>(e)->t = std::chrono::steady_clock::now(); }
void wait_event(Stream, Event) {}
void sync_event(Event) {}
bool event_done(Event) { return true; }
double event_elapsed_ms(Event from, Event to) {
  return std::chrono::duration<double, std::milli>(static_cast<EmuEvent*>(to)->t - static_cast<EmuEvent*>(from)->t)
      .count();
}

Blas::Blas(Stream s) : m_stream(s) {}
Blas::~Blas() = default;

void Blas::gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* A, DType at,
                int64_t lda, const void* B, DType bt, int64_t ldb, float beta, void* C, DType ct, int64_t ldc,
                bool) {
  expect(at == bt && (at == DType::F32 || ct == at || ct == DType::F32), "gemm", "unsupported dtype combination");
  // Stored shapes: A is (trans_a ? k x m : m x k), B (trans_b ? n x k : k x n), column-major.
  const std::vector<float> a = widened(A, at, trans_a ? k : m, trans_a ? m : k, lda);
  const std::vector<float> b = widened(B, bt, trans_b ? n : k, trans_b ? k : n, ldb);
  std::vector<float> c = beta != 0 ? widened(C, ct, m, n, ldc) : std::vector<float>(size_t(m * n), 0.0f);
  if (m > 0 && n > 0)
    cblas_sgemm(CblasColMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(m),
                int(n), int(k), alpha, a.data(), std::max(1, int(trans_a ? k : m)), b.data(),
                std::max(1, int(trans_b ? n : k)), beta, c.data(), int(m));
  for (int64_t col = 0; col < n; ++col)
    for (int64_t r = 0; r < m; ++r) store(C, col * ldc + r, ct, c[size_t(col * m + r)]);
}

}  // namespace ss::SS_CUDA_NS
