// CUDA's thread model on the host, so the cuda backend's kernels -- the very
// source nvcc compiles -- also build with a C++ compiler and run on a CPU
// (the cuda_emu library, which every CI run tests against the cpu backend).
//
// A launch is queued on its stream and runs later on that stream's thread
// (runtime_emu.cpp), the grid's blocks one after another. The threads of a
// block are fibers on that thread: each runs until it reaches a
// barrier (__syncthreads, __syncwarp, a shuffle), then the next one runs, and
// a barrier opens when every thread it waits for has arrived. So a missing
// __syncthreads shows as a wrong result (thread 0 runs a whole phase before
// thread 1 starts it), a barrier some threads skip or leave early is an
// error naming the block, and the order threads run in can be reversed
// (SHARDSCOPE_EMU_ORDER=reverse) to shake out the other direction of a race,
// or taken a warp at a time (SHARDSCOPE_EMU_ORDER=warps): each warp runs up
// to its next __syncthreads before the next warp starts.
// Dynamic shared memory starts each block filled with 0xff (NaN as floats),
// so a read before the write shows.
//
// What it cannot show: timing, occupancy, memory-model subtleties beyond
// barriers, and anything nvcc does differently from the host compiler.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// One copy per host thread, shared by the fibers (CUDA threads) of the block
// running on it: blocks run one at a time.
#define __shared__ static thread_local

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
extern thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
inline constexpr int warpSize = 32;

namespace ss::emu {

// Runs body() as every thread of every block of the grid. Throws
// std::runtime_error for a barrier not every thread of a block (or warp)
// reaches, and for a block of more than 1024 threads.
void launch(dim3 grid, dim3 block, size_t dynamic_smem, const std::function<void()>& body);
// Dynamic shared memory as a GPU gives it: 48 KiB a block unless the kernel
// opted in to more (allow_smem in common.cuh, cudaFuncSetAttribute on a GPU),
// and never past kSmemOptIn. A launch past what its kernel may have throws
// where it is made, as check_launch does on a GPU.
inline constexpr size_t kSmemDefault = size_t(48) << 10;
// 99 KiB: the least opt-in of the GPUs this build runs on (compute
// capability 8.6 and 8.9, which run its sm_80 code; 8.0 allows 163 KiB and
// 9.0 227 KiB: CUDA C++ Programming Guide, "Technical Specifications per
// Compute Capability"). A kernel that fits here fits each of them.
inline constexpr size_t kSmemOptIn = size_t(99) << 10;
void allow_smem(const char* name, const void* kernel, size_t bytes);
void check_smem(const void* kernel, size_t bytes);
// Queues `work` on `stream` (a runtime.h Stream): it runs on the stream's
// thread after everything queued there before it, as a GPU runs a stream's
// kernels after the host has moved on. The null stream runs it at once.
void enqueue(void* stream, std::function<void()> work);
void* dynamic_smem();
void sync_block();
void sync_warp();
// All 32 lanes of the warp call it with a value; each gets the value of lane `src`.
uint64_t warp_exchange(uint64_t value, int src);
// All 32 lanes of the warp call it with `bytes` of their own at `mine`; each
// gets lane i's at all + i * bytes (the warp-wide operand exchange of
// ldmatrix and mma.sync).
void warp_gather(const void* mine, size_t bytes, void* all);
// cp.async for the calling thread: a copy of 16 bytes (zeros unless fill)
// issued now lands only when async_wait lets its group complete, so a read
// before the wait sees the bytes that were there (NaN in fresh shared memory).
void async_copy16(void* dst, const void* src, bool fill);
void async_commit();                // closes the copies issued since the last commit into a group
void async_wait(int in_flight);     // completes all but the `in_flight` newest groups
inline unsigned lane_id() {
  const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  return t % 32u;
}

template <class T>
T exchange_as(T v, int src) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = warp_exchange(bits, src);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

// `kernel<<<grid, block, smem, stream>>>(args...)` for the emulator:
// SS_LAUNCH(kernel, grid, block, smem, stream)(args...). The arguments are
// copied as the launch is queued (a kernel's parameters are values), and the
// kernel runs later on the stream's thread.
template <class F>
struct Launcher {
  F kernel;
  dim3 grid, block;
  size_t smem;
  void* stream;
  template <class... A>
  void operator()(A&&... args) const {
    if constexpr (std::is_pointer_v<F>) check_smem(reinterpret_cast<const void*>(kernel), smem);
    enqueue(stream, [k = kernel, g = grid, b = block, m = smem, params = std::make_tuple(std::decay_t<A>(args)...)] {
      launch(g, b, m, [&] { std::apply(k, params); });
    });
  }
};
template <class F>
Launcher<F> make_launcher(F kernel, dim3 grid, dim3 block, size_t smem, void* stream) {
  return {kernel, grid, block, smem, stream};
}

}  // namespace ss::emu

inline void __syncthreads() { ss::emu::sync_block(); }
inline void __syncwarp(unsigned = 0xffffffffu) { ss::emu::sync_warp(); }

template <class T>
T __shfl_sync(unsigned, T v, int src, int width = 32) {
  const int lane = int(ss::emu::lane_id());
  return ss::emu::exchange_as(v, (lane / width) * width + (src % width));
}
template <class T>
T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
  const int lane = int(ss::emu::lane_id());
  const int seg = (lane / width) * width;
  return ss::emu::exchange_as(v, seg + ((lane - seg) ^ mask) % width);
}
template <class T>
T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
  const int lane = int(ss::emu::lane_id());
  const int seg = (lane / width) * width;
  const int src = lane - seg + int(delta) < width ? lane + int(delta) : lane;
  return ss::emu::exchange_as(v, src);
}
template <class T>
T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
  const int lane = int(ss::emu::lane_id());
  const int seg = (lane / width) * width;
  const int src = lane - int(delta) >= seg ? lane - int(delta) : lane;
  return ss::emu::exchange_as(v, src);
}

// Atomics: fibers of a block never interleave inside one, and blocks run in turn.
inline float atomicAdd(float* p, float v) {
  const float old = *p;
  *p = old + v;
  return old;
}
inline double atomicAdd(double* p, double v) {
  const double old = *p;
  *p = old + v;
  return old;
}
inline int atomicAdd(int* p, int v) {
  const int old = *p;
  *p = old + v;
  return old;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = old + v;
  return old;
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  const unsigned long long old = *p;
  *p = old + v;
  return old;
}
inline unsigned atomicMax(unsigned* p, unsigned v) {
  const unsigned old = *p;
  if (v > old) *p = v;
  return old;
}
inline int atomicMax(int* p, int v) {
  const int old = *p;
  if (v > old) *p = v;
  return old;
}

// Device math: the classification functions CUDA has at global scope, and
// what the host library lacks.
using std::isfinite;
using std::isinf;
using std::isnan;
using std::signbit;
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
template <class T>
inline T __ldcg(const T* p) {
  return *p;
}
// Blocks run one after another: every write of an earlier block is seen.
inline void __threadfence() {}

// A kernel with template arguments is named through a pointer first (the
// macro's arguments cannot hold their commas).
// The launch is queued on its stream (runtime_emu.cpp).
#define SS_LAUNCH(kernel, grid, block, smem, stream) \
  ::ss::emu::make_launcher(kernel, dim3(grid), dim3(block), size_t(smem), static_cast<void*>(stream))
