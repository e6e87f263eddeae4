// The warp-level tensor-core instructions cuda/mma.cuh wraps, for the
// emulator: ldmatrix (x4, plain and transposed), mma.sync m16n8k16 with fp32
// accumulation, and cp.async, whose copies land only at the wait that
// completes them (emu.cpp). Each lane holds exactly the registers the PTX ISA
// gives it (the fragment layouts of "Matrix Fragments for mma.m16n8k16" and
// "Warp-level matrix load instruction: ldmatrix"), so a kernel that puts a
// value in the wrong lane or register computes a wrong result here as it
// would on a GPU. The warp calls each operation together (a warp barrier);
// ldmatrix's row addresses must be 16-byte aligned.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "core/dtype.h"
#include "cuda/emu/emu.h"

// The 16-bit operand types, as their bits.
struct __nv_bfloat16 {
  uint16_t bits;
};
struct __half {
  uint16_t bits;
};
using half = __half;

namespace ss::emu {

// r[i] of lane l: matrix i (row addresses from lanes 8i..8i+7), row l / 4,
// columns 2 (l % 4) and 2 (l % 4) + 1 (low half first). Transposed: rows
// 2 (l % 4) and 2 (l % 4) + 1 of column l / 4.
inline void ldmatrix_x4(uint32_t (&r)[4], const void* row, bool trans) {
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0)
    throw std::runtime_error("emulated ldmatrix: a row address not 16-byte aligned");
  // Each lane's row is read as the lane issues the instruction, before the
  // others arrive: a row another thread has not yet written (a missing
  // barrier or cp.async wait) reads as what was there.
  uint16_t mine[8], rows[32][8];
  std::memcpy(mine, row, 16);
  warp_gather(mine, sizeof(mine), rows);
  const unsigned l = lane_id(), g = l / 4, t = l % 4;
  for (int i = 0; i < 4; ++i) {
    const uint16_t lo = trans ? rows[8 * i + 2 * t][g] : rows[8 * i + g][2 * t];
    const uint16_t hi = trans ? rows[8 * i + 2 * t + 1][g] : rows[8 * i + g][2 * t + 1];
    r[i] = uint32_t(lo) | uint32_t(hi) << 16;
  }
}

template <class T>
float half_bits(uint32_t word, int which) {
  const auto bits = uint16_t(which ? word >> 16 : word & 0xffffu);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return bf16_to_f32(bits);
  else return f16_to_f32(bits);
}

// d = a b + c for a 16 x 16 (row-major fragments a[4]), b 16 x 8 (b0, b1),
// c and d 16 x 8 fp32: lane l holds a at rows g, g + 8 and columns 2t, 2t + 1
// (+8 for a[2], a[3]); b at rows 2t, 2t + 1 (+8 for b1) of column g; c and d
// at rows g (d[0], d[1]) and g + 8 (d[2], d[3]) of columns 2t, 2t + 1.
template <class T>
void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  struct Operands {
    uint32_t a[4], b[2];
  } mine{{a[0], a[1], a[2], a[3]}, {b0, b1}}, all[32];
  warp_gather(&mine, sizeof(mine), all);
  float A[16][16], B[16][8];
  for (unsigned l = 0; l < 32; ++l) {
    const unsigned g = l / 4, t = l % 4;
    for (int e = 0; e < 2; ++e) {
      A[g][2 * t + e] = half_bits<T>(all[l].a[0], e);
      A[g + 8][2 * t + e] = half_bits<T>(all[l].a[1], e);
      A[g][2 * t + 8 + e] = half_bits<T>(all[l].a[2], e);
      A[g + 8][2 * t + 8 + e] = half_bits<T>(all[l].a[3], e);
      B[2 * t + e][g] = half_bits<T>(all[l].b[0], e);
      B[2 * t + 8 + e][g] = half_bits<T>(all[l].b[1], e);
    }
  }
  const unsigned l = lane_id(), g = l / 4, t = l % 4;
  for (int i = 0; i < 4; ++i) {
    const unsigned row = g + (i >= 2 ? 8 : 0), col = 2 * t + i % 2;
    float acc = d[i];
    for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];
    d[i] = acc;
  }
}

// cp.async of 16 bytes: in flight until a wait completes its group (emu.cpp);
// fill: false writes zeros, as a source size of 0 does.
inline void cp_async16(void* dst, const void* src, bool fill) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0)
    throw std::runtime_error("emulated cp.async: an address not 16-byte aligned");
  async_copy16(dst, src, fill);
}

}  // namespace ss::emu
