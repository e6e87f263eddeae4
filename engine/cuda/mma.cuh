// Warp-level tensor-core instructions on registers (sm_80 and later), the
// layout FlashAttention-2 keeps its scores in: ldmatrix loads 8 x 8 tiles of
// 16-bit values from shared memory into the lanes' fragment registers,
// mma.sync m16n8k16 multiplies them with fp32 accumulation, and cp.async
// copies global memory to shared memory without passing through registers.
// Fragment layouts are the PTX ISA's ("Matrix Fragments for mma.m16n8k16");
// with g = lane / 4 and t = lane % 4:
//   A 16 x 16, a[4]: a[0] row g, columns 2t, 2t+1 (low half first); a[1] row
//     g+8; a[2] row g, columns 2t+8, 2t+9; a[3] row g+8, columns 2t+8, 2t+9
//   B 16 x 8, b0 b1: column g, rows 2t, 2t+1 (b1: 2t+8, 2t+9)
//   C/D 16 x 8 fp32, d[4]: row g, columns 2t, 2t+1 (d[0], d[1]); row g+8 (d[2], d[3])
// So the C fragments of two neighbouring 8-column tiles, rounded in pairs,
// are the A fragment of their 16 columns (how P = softmax(S) feeds P V
// without leaving registers). The emulator's twins are in emu/mma.h.
#pragma once

#include "cuda/common.cuh"

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#else
#include "cuda/emu/mma.h"
#endif

#include <type_traits>

namespace ss::SS_CUDA_NS {

#ifdef __CUDACC__

SS_DEV unsigned smem_u32(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

// Four 8 x 8 tiles of 16-bit values: lanes 8i..8i+7 give the 16-byte aligned
// row addresses of tile i, whose row g, columns 2t and 2t+1, land in r[i]
// (transposed: rows 2t, 2t+1 of column g). The memory clobber orders it
// after the plain stores that fill a tile where cp.async cannot.
SS_DEV void ldmatrix_x4(uint32_t (&r)[4], const void* row, bool trans) {
  if (trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(row))
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(row))
                 : "memory");
}

// d += a b (T: __nv_bfloat16 or half operands, fp32 accumulators).
template <class T>
SS_DEV void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, half>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16 bytes from global to shared memory, in flight until cp_async_wait;
// fill false writes 16 zero bytes instead (a source size of 0).
SS_DEV void cp_async16(void* dst, const void* src, bool fill) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(fill ? 16 : 0)
               : "memory");
}
SS_DEV void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
SS_DEV void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Two fp32 values rounded to nearest even into one register (lo in the low half).
template <class T>
SS_DEV uint32_t pack_pair(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, half>) {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&r, &v, 4);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&r, &v, 4);
  }
  return r;
}

#else

using ::ss::emu::cp_async16;
using ::ss::emu::ldmatrix_x4;
using ::ss::emu::mma_16816;
inline void cp_async_commit() { ::ss::emu::async_commit(); }
template <int N>
void cp_async_wait() {
  ::ss::emu::async_wait(N);
}
template <class T>
uint32_t pack_pair(float lo, float hi) {
  if constexpr (std::is_same_v<T, half>) return uint32_t(float_to_f16(lo)) | uint32_t(float_to_f16(hi)) << 16;
  else return uint32_t(float_to_bf16(lo)) | uint32_t(float_to_bf16(hi)) << 16;
}

#endif

}  // namespace ss::SS_CUDA_NS
