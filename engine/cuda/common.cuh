// What every kernel file of the cuda backend shares: the device headers (or
// the emulator's), the launch macro, loads and stores of any storage dtype
// computing in fp32, and warp and block reductions.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/kernels.h"
#include "cuda/runtime.h"

#ifdef __CUDACC__
#include <cuda_fp16.h>
#include <cuda_runtime.h>
// kernel<<<grid, block, smem, stream>>> (a kernel with template arguments is
// named through a pointer first: the macro's arguments cannot hold commas).
#define SS_LAUNCH(kernel, grid, block, smem, stream) \
  kernel<<<(grid), (block), (smem), static_cast<cudaStream_t>(stream)>>>
#define SS_DYNAMIC_SMEM(T, name)                          \
  extern __shared__ __align__(128) unsigned char ss_smem_[]; \
  T* name = reinterpret_cast<T*>(ss_smem_)
#else
#include "cuda/emu/emu.h"
#define SS_DYNAMIC_SMEM(T, name) T* name = reinterpret_cast<T*>(::ss::emu::dynamic_smem())
#endif

#define SS_HD __host__ __device__ __forceinline__
#define SS_DEV __device__ __forceinline__

namespace ss::SS_CUDA_NS {

// After a launch: on a GPU, throws with the launch's error (bad configuration,
// too much shared memory); under the emulator a launch that fails fails its
// stream, whose next copy to the host or sync_stream throws.
void check_launch(const char* kernel);

// Before a launch of `kernel` with `bytes` of dynamic shared memory a block:
// past the 48 KiB every GPU gives, the kernel opts in to them. Throws, naming
// `name` and the GPU's limit, where the GPU has fewer (a launch would fail
// with "invalid argument"). The emulator keeps the opt-in, refuses a launch
// past it, and allows at most the least of the build's GPUs (emu.h).
template <class Kernel>
void allow_smem(const char* name, Kernel kernel, size_t bytes) {
#ifdef __CUDACC__
  if (bytes <= (size_t(48) << 10) ||
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)) == cudaSuccess)
    return;
  static_cast<void>(cudaGetLastError());  // the refusal is reported here, not by the next launch
  int device = 0, most = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    most = 0;
  throw std::runtime_error(std::string(name) + ": a block needs " + std::to_string((bytes + 1023) >> 10) +
                           " KiB of shared memory; this GPU allows " + std::to_string(most >> 10) + " KiB");
#else
  ::ss::emu::allow_smem(name, reinterpret_cast<const void*>(kernel), bytes);
#endif
}

// Programmatic dependent launch (compute capability 9.0): a kernel started
// by launch_dependent may run while the kernel before it in the stream
// finishes. Until it calls pdl_wait() (every block must, before it reads or
// writes global memory; prefetch_l2 is the exception) that kernel's writes
// may be unseen. A kernel that calls pdl_release() lets its dependent's
// blocks be scheduled before it ends. Off (and these no-ops) below sm_90,
// with SHARDSCOPE_CUDA_PDL=0, and in the emulator, whose launches run in order.
SS_DEV void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
SS_DEV void pdl_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}
// Brings the line holding p into the L2 (no register, no ordering: safe before
// pdl_wait, since every SM's writes land in the L2).
SS_DEV void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.L2 [%0];" ::"l"(p));  // a generic address
#else
  static_cast<void>(p);
#endif
}

// The start of a kernel launched dependent that needs the kernel before's
// results from its first instruction: wait for them, then let the next
// kernel's blocks be scheduled.
SS_DEV void pdl_begin() {
  pdl_wait();
  pdl_release();
}

// kernel<<<grid, block, smem, s>>>(args...), dependent where
// dependent_launch() allows and the kernel's code has its wait (it was
// compiled for sm_90 or newer: a build for older architectures alone, run on
// a newer GPU, has none). Throws, naming `name`, when the launch fails.
#ifdef __CUDACC__
template <class... P, class... A>
void launch_dependent(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, Stream s,
                      const A&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = static_cast<cudaStream_t>(s);
  cfg.attrs = &attr;
  cfg.numAttrs = dependent_launch() && kernel_waits(reinterpret_cast<const void*>(kernel)) ? 1 : 0;
  if (cudaLaunchKernelEx(&cfg, kernel, args...) != cudaSuccess) check_launch(name);
}
#else
template <class K, class... A>
void launch_dependent(const char* name, K kernel, dim3 grid, dim3 block, size_t smem, Stream s, const A&... args) {
  static_cast<void>(name);
  SS_LAUNCH(kernel, grid, block, smem, s)(args...);
}
#endif

// Throws std::logic_error("<op>: <what>") when !ok (shape checks of launchers).
inline void expect(bool ok, const char* op, const char* what) {
  if (!ok) throw std::logic_error(std::string("cuda ") + op + ": " + what);
}
// How many blocks of `kernel` (with `threads` threads and `smem` bytes of
// dynamic shared memory) the whole GPU holds at once: a grid of that many
// runs in one wave. Asked of the device each time (the launchers keep it:
// a process drives one GPU); the emulator, which has no occupancy, answers
// 1024.
template <class Kernel>
int resident_blocks(Kernel kernel, int threads, size_t smem) {
#ifdef __CUDACC__
  int device = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess)
    throw std::runtime_error("cuda: the occupancy of a kernel could not be read");
  return sms * per_sm > 0 ? sms * per_sm : 1;
#else
  static_cast<void>(kernel), static_cast<void>(threads), static_cast<void>(smem);
  return 1024;
#endif
}
// Blocks for n items at `per` a block, at least 1.
inline unsigned blocks_for(int64_t n, int64_t per) {
  const int64_t b = (n + per - 1) / per;
  return unsigned(b < 1 ? 1 : (b > 65535 * 1024 ? 65535 * 1024 : b));
}

SS_HD float bits_to_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
SS_HD uint32_t float_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

// bf16: the top half of an fp32; rounding to nearest even (NaN kept quiet),
// bit for bit as core/dtype.h's f32_to_bf16.
SS_HD float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }
SS_HD uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// fp16 (IEEE binary16), rounding to nearest even with subnormals and
// overflow to infinity, NaN as 0x7e00 with its sign: as core/dtype.h's
// f32_to_f16 and the F16C instructions the cpu backend uses.
SS_HD float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31;
  const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in fp32
    const float v = float(mant) * 5.9604644775390625e-08f;
    return bits_to_float(float_to_bits(v) | sign);
  }
  if (exp == 31) return bits_to_float(sign | 0x7f800000u | (mant << 13));
  return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
}
SS_HD uint16_t float_to_f16(float f) {
  const uint32_t u = float_to_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds to infinity
  if (a < 0x38800000u) {                                  // below 2^-14: subnormal grid 2^-24
    // a * 2^24 rounded half to even: add the magic 0.5 * 2^24... via integer
    // arithmetic on the mantissa with its implicit bit.
    const uint32_t exp = a >> 23;
    if (exp < 102) return sign;  // below 2^-25: rounds to zero
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // value = mant * 2^(exp-150); in units of 2^-24: mant >> (126 - exp)
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return uint16_t(sign | q);
  }
  // Normal: keep 10 mantissa bits, round half to even; a carry into the
  // exponent is the right result (up to infinity, excluded above).
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
  return uint16_t(sign | (((r >> 13) - (112u << 10)) & 0x7fffu));
}

// A value of any storage dtype, as fp32; and an fp32 rounded into one.
SS_HD float load(const void* p, int64_t i, DType dt) {
  switch (dt) {
    case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return f16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::I32: return float(static_cast<const int32_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}
SS_HD void store(void* p, int64_t i, DType dt, float v) {
  switch (dt) {
    case DType::BF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(v); break;
    case DType::F16: static_cast<uint16_t*>(p)[i] = float_to_f16(v); break;
    case DType::I32: static_cast<int32_t*>(p)[i] = int32_t(v); break;
    default: static_cast<float*>(p)[i] = v;
  }
}
SS_HD float at(const Mat& m, int64_t r, int64_t c) { return load(m.p, r * m.ld + c, m.dt); }
SS_HD void put(const Mat& m, int64_t r, int64_t c, float v) { store(m.p, r * m.ld + c, m.dt, v); }

// Sixteen bytes in one load or store (8 bf16/fp16 or 4 fp32 values); the
// address must be 16-byte aligned.
#ifdef __CUDACC__
using Bytes16 = uint4;
#else
struct alignas(16) Bytes16 {
  uint32_t x, y, z, w;
};
#endif
SS_DEV Bytes16 load16(const void* p) { return *static_cast<const Bytes16*>(p); }
SS_DEV void store16(void* p, Bytes16 v) { *static_cast<Bytes16*>(p) = v; }
// Whether row r, column c of m starts a 16-byte aligned run (for load16).
SS_HD bool aligned16(const Mat& m) {
  const int64_t es = m.dt == DType::F32 || m.dt == DType::I32 ? 4 : 2;
  return reinterpret_cast<uintptr_t>(m.p) % 16 == 0 && (m.ld * es) % 16 == 0;
}
// The VEC = 16 / sizeof values of a Bytes16 as fp32 (16-bit dtypes: 8, fp32: 4).
template <DType DT>
SS_DEV void unpack16(Bytes16 b, float* out) {
  const uint32_t w[4] = {b.x, b.y, b.z, b.w};
  for (int i = 0; i < 4; ++i) {
    if constexpr (DT == DType::F32) {
      out[i] = bits_to_float(w[i]);
    } else if constexpr (DT == DType::BF16) {
      out[2 * i] = bits_to_float(w[i] << 16);
      out[2 * i + 1] = bits_to_float(w[i] & 0xffff0000u);
    } else {
      out[2 * i] = f16_to_float(uint16_t(w[i] & 0xffffu));
      out[2 * i + 1] = f16_to_float(uint16_t(w[i] >> 16));
    }
  }
}

// VEC fp32 values rounded into a Bytes16 of dtype DT (the inverse of unpack16).
template <DType DT>
SS_DEV Bytes16 pack16(const float* v) {
  uint32_t w[4];
  for (int i = 0; i < 4; ++i) {
    if constexpr (DT == DType::F32) w[i] = float_to_bits(v[i]);
    else if constexpr (DT == DType::BF16) w[i] = uint32_t(float_to_bf16(v[2 * i])) | uint32_t(float_to_bf16(v[2 * i + 1])) << 16;
    else w[i] = uint32_t(float_to_f16(v[2 * i])) | uint32_t(float_to_f16(v[2 * i + 1])) << 16;
  }
  return Bytes16{w[0], w[1], w[2], w[3]};
}
// Eight values of dtype DT as fp32 and back: one 16-byte piece of a 16-bit
// dtype, two of fp32 (16-byte aligned addresses).
template <DType DT>
SS_DEV void load8(const void* p, float* out) {
  unpack16<DT>(load16(p), out);
  if constexpr (DT == DType::F32) unpack16<DT>(load16(static_cast<const char*>(p) + 16), out + 4);
}
template <DType DT>
SS_DEV void store8(void* p, const float* v) {
  store16(p, pack16<DT>(v));
  if constexpr (DT == DType::F32) store16(static_cast<char*>(p) + 16, pack16<DT>(v + 4));
}
// Whether each view is 16-byte aligned with rows of whole 8-value pieces
// (cols values), whatever its dtype.
inline bool eights_fit(std::initializer_list<const Mat*> ms, int64_t cols) {
  if (cols % 8 != 0) return false;
  for (const Mat* m : ms)
    if (m->dt == DType::I32 || !aligned16(*m)) return false;
  return true;
}
// Whether every view is of dtype dt, 16-byte aligned, with rows of whole
// 16-byte pieces (cols values): the vectorised kernels' condition.
inline bool pieces_fit(std::initializer_list<const Mat*> ms, int64_t cols) {
  const DType dt = (*ms.begin())->dt;
  if (dt == DType::I32 || cols % (dt == DType::F32 ? 4 : 8) != 0) return false;
  for (const Mat* m : ms)
    if (m->dt != dt || !aligned16(*m)) return false;
  return true;
}
// What `pick(DTypeTag<DT>{})` returns for dt's DT (bf16, fp16, else fp32): a
// launcher's instance of a kernel template, chosen in one place,
//   auto* kernel = for_dtype(x.dt, [](auto d) { return &some_kernel<decltype(d)::value>; });
template <DType DT>
using DTypeTag = std::integral_constant<DType, DT>;
template <class Pick>
auto for_dtype(DType dt, Pick&& pick) {
  if (dt == DType::BF16) return pick(DTypeTag<DType::BF16>{});
  if (dt == DType::F16) return pick(DTypeTag<DType::F16>{});
  return pick(DTypeTag<DType::F32>{});
}

SS_HD float silu(float v) { return v / (1.0f + expf(-v)); }
SS_HD float softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }
SS_HD int imin(int a, int b) { return a < b ? a : b; }
SS_HD int imax(int a, int b) { return a > b ? a : b; }
SS_HD int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
SS_HD int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// Reductions: every lane of the warp (every thread of the block) calls them.
SS_DEV float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
SS_DEV float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// The block's sum, in every thread (blockDim.x a multiple of 32, 1-D
// blocks); `red` is shared memory of 32 floats, free again on return.
SS_DEV float block_sum(float v, float* red) {
  const unsigned lane = threadIdx.x % 32u, warp = threadIdx.x / 32u, warps = blockDim.x / 32u;
  v = warp_sum(v);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < warps ? red[lane] : 0.0f;
  t = warp_sum(t);
  __syncthreads();
  return t;
}
SS_DEV float block_max(float v, float* red) {
  const unsigned lane = threadIdx.x % 32u, warp = threadIdx.x / 32u, warps = blockDim.x / 32u;
  v = warp_max(v);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < warps ? red[lane] : -INFINITY;
  t = warp_max(t);
  __syncthreads();
  return t;
}

// The block's sum in double, in every thread; `red` is shared memory of
// blockDim.x doubles (a power of two), free again on return.
SS_DEV double block_sum_double(double v, double* red) {
  red[threadIdx.x] = v;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) red[threadIdx.x] += red[threadIdx.x + half];
    __syncthreads();
  }
  const double out = red[0];
  __syncthreads();
  return out;
}

}  // namespace ss::SS_CUDA_NS
