// The device runtime the cuda backend stands on: devices, memory, streams,
// events, copies and cuBLAS's GEMM. Two implementations: runtime_cuda.cpp
// (the CUDA runtime, cuBLAS loaded at run time) and runtime_emu.cpp (host
// memory, each stream's work run in order on a thread of its own, a host
// GEMM with cuBLAS's column-major semantics), so the backend's own code is
// the same in both builds.
// Every failure throws std::runtime_error naming the call and the reason.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "cuda/kernels.h"

namespace ss::SS_CUDA_NS {

using Event = void*;  // a cudaEvent_t

// Why this process cannot use a GPU ("CUDA driver not found", "no CUDA
// device", ...), or "" when it can.
std::string unavailable_reason();
int device_count();  // 0 when unavailable

struct DeviceProps {
  std::string name;
  int64_t total_bytes = 0, free_bytes = 0;
  int cc_major = 0, cc_minor = 0, sm_count = 0;
  double memory_bandwidth = 0;  // bytes/s from the memory clock and bus width (0 when unknown)
};
DeviceProps device_props(int device);
void set_device(int device);
std::string runtime_version();  // "CUDA runtime 13.0, driver 13.0"

// Programmatic dependent launch (common.cuh's launch_dependent): whether a
// kernel launched so may start while the kernel before it in its stream
// finishes. On for devices of compute capability 9.0 and newer unless
// SHARDSCOPE_CUDA_PDL=0; the benchmark turns it off and on to measure it.
bool dependent_launch();
void set_dependent_launch(bool on);
// Whether a kernel's code was compiled for sm_90 or newer, so that its
// griddepcontrol.wait is there (asked of the runtime once a kernel).
bool kernel_waits(const void* kernel);

// Stream-ordered memory on `s` (a pool keeps freed blocks for reuse).
void* malloc_device(int64_t bytes, Stream s);  // null when the device has no room
void free_device(void* p, Stream s);

// Copies on `s`. To the device: returns once `src` may be reused. To the
// host: returns when the bytes are there.
void copy_to_device(void* dst, const void* src, int64_t bytes, Stream s);
void copy_to_host(void* dst, const void* src, int64_t bytes, Stream s);
void copy_on_device(void* dst, const void* src, int64_t bytes, Stream s);
// `rows` rows of `width` bytes, rows `dpitch` / `spitch` bytes apart.
void copy_2d_on_device(void* dst, int64_t dpitch, const void* src, int64_t spitch, int64_t width, int64_t rows,
                       Stream s);
void memset_device(void* p, int value, int64_t bytes, Stream s);

Stream create_stream();
void destroy_stream(Stream s);
void sync_stream(Stream s);
// cudaLaunchHostFunc: fn(arg) on a host thread once the work queued on s
// before it is done; the work queued after it waits for it.
void launch_host_func(Stream s, void (*fn)(void*), void* arg);
Event create_event();
void destroy_event(Event e);
void record_event(Event e, Stream s);
void wait_event(Stream s, Event e);  // work queued on s after this waits for e
void sync_event(Event e);
bool event_done(Event e);
double event_elapsed_ms(Event from, Event to);

// cuBLAS's cublasGemmEx, column-major: C[m,n] = alpha op(A) op(B) + beta C,
// op(A) m x k (A stored k x m when trans_a), op(B) k x n, accumulating in
// fp32 (TF32 tensor cores for fp32 operands only when `tf32`).
class Blas {
 public:
  explicit Blas(Stream s);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* A, DType at,
            int64_t lda, const void* B, DType bt, int64_t ldb, float beta, void* C, DType ct, int64_t ldc,
            bool tf32);

 private:
  void* m_handle = nullptr;
  void* m_workspace = nullptr;
  Stream m_stream = nullptr;
};

}  // namespace ss::SS_CUDA_NS
