// Quantize / dequantize for the quantized collectives, byte for byte the
// formats of comm/quantize.cpp: plain casts (fp32, bf16, fp16), or blocks of
// B values with one fp32 scale (absmax / qmax, at least FLT_MIN) stored
// first and the values after them as int8, int4 (two a byte, even elements
// in the low nibble) or fp8-e4m3; rounding to nearest even, or stochastic
// with splitmix64 of (seed, counter + element).
#include <algorithm>
#include <cfloat>

#include "cuda/common.cuh"
#include "cuda/runtime.h"

namespace ss::SS_CUDA_NS {
namespace {

constexpr int kThreads = 256;

SS_HD float qmax_of(Precision p) {
  return p == Precision::INT8 ? 127.0f : p == Precision::INT4 ? 7.0f : p == Precision::FP8 ? 448.0f : 1.0f;
}

SS_HD float uniform01(uint64_t seed, uint64_t counter) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + counter + 0x632be59bd9b4e019ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return float(x >> 40) * 5.9604644775390625e-08f;  // 2^-24
}

SS_HD float clampf(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }

// e4m3 (OCP: bias 7, 3 mantissa bits, max 448, no infinities) of |v| <= 448
// rounded to nearest even, by bit arithmetic as e4m3_nearest.
SS_HD uint8_t e4m3_nearest(float v) {
  uint32_t u = float_to_bits(v);
  const uint8_t sign = uint8_t((u >> 24) & 0x80);
  u &= 0x7fffffffu;
  if (u < 0x3c800000u) {  // below 2^-6: the subnormal grid m * 2^-9
    const int m = int(rintf(bits_to_float(u) * 512.0f));
    return uint8_t(sign | (m >= 8 ? 0x08 : m));
  }
  u += 0x7ffffu + ((u >> 20) & 1u);
  const int exp = int(u >> 23) - 127 + 7;
  const uint32_t mant = (u >> 20) & 7u;
  if (exp > 15 || (exp == 15 && mant == 7)) return uint8_t(sign | 0x7e);
  return uint8_t(sign | (exp << 3) | mant);
}

// f32_to_e4m3 with a stochastic threshold u (0.5: nearest).
SS_HD uint8_t e4m3_rounded(float v, float u) {
  const uint8_t sign = signbit(v) ? 0x80 : 0;
  if (isnan(v)) return 0x7f;
  float a = fminf(fabsf(v), 448.0f);
  if (a == 0.0f) return sign;
  int e;
  frexpf(a, &e);
  const int exp = imax(e - 1, -6);
  const float step = ldexpf(1.0f, exp - 3);
  float q = a / step;
  q = u == 0.5f ? rintf(q) : floorf(q) + ((q - floorf(q)) > u ? 1.0f : 0.0f);
  const float r = fminf(q * step, 448.0f);
  if (r == 0.0f) return sign;
  int re;
  frexpf(r, &re);
  int rexp = imax(re - 1, -6);
  int mant = int(lroundf(r / ldexpf(1.0f, rexp - 3)));
  if (mant >= 16) {
    ++rexp;
    mant /= 2;
  }
  if (mant < 8) return uint8_t(sign | (mant & 7));
  return uint8_t(sign | ((rexp + 7) << 3) | (mant & 7));
}

SS_HD float e4m3_to_float(uint8_t b) {
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  const int e = (b >> 3) & 0xf, m = b & 7;
  if (e == 0xf && m == 7) return NAN;
  if (e == 0) return sign * ldexpf(float(m), -9);
  return sign * ldexpf(float(8 + m), e - 7 - 3);
}

SS_HD float scale_of(float amax, float qm) { return amax > 0.0f ? fmaxf(amax / qm, FLT_MIN) : 1.0f; }

// Plain casts: a thread per value.
__global__ void cast_kernel(Mat in, int64_t n, Precision p, uint8_t* out) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = load(in.p, i, in.dt);
    if (p == Precision::FP32) reinterpret_cast<float*>(out)[i] = x;
    else if (p == Precision::BF16) reinterpret_cast<uint16_t*>(out)[i] = float_to_bf16(x);
    else reinterpret_cast<uint16_t*>(out)[i] = float_to_f16(x);
  }
}

// Blocks of up to 1024 values: a warp per block, its absmax by shuffles.
__global__ void scales_small_kernel(Mat in, int64_t n, int64_t block, float qm, float* scales) {
  const int64_t nblocks = (n + block - 1) / block;
  const int lane = int(threadIdx.x % 32);
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t b = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; b < nblocks; b += warps) {
    const int64_t i0 = b * block, i1 = min64(n, i0 + block);
    float amax = 0.0f;
    for (int64_t i = i0 + lane; i < i1; i += 32) amax = fmaxf(amax, fabsf(load(in.p, i, in.dt)));  // NaN ignored
    amax = warp_max(amax);
    if (lane == 0) scales[b] = scale_of(amax, qm);
  }
}

// Larger blocks: segments of 4096 values reduce in a CUDA block, then one
// atomicMax of the absmax's bits (non-negative floats order as their bits).
constexpr int64_t kSegment = 4096;
__global__ void absmax_large_kernel(Mat in, int64_t n, int64_t block, unsigned* amax_bits) {
  __shared__ float red[32];
  const int64_t segs = (min64(block, n) + kSegment - 1) / kSegment, nblocks = (n + block - 1) / block;
  for (int64_t item = blockIdx.x; item < nblocks * segs; item += gridDim.x) {
    const int64_t b = item / segs, s0 = b * block + (item % segs) * kSegment;
    const int64_t s1 = min64(min64(n, (b + 1) * block), s0 + kSegment);
    float amax = 0.0f;
    for (int64_t i = s0 + threadIdx.x; i < s1; i += blockDim.x) amax = fmaxf(amax, fabsf(load(in.p, i, in.dt)));
    amax = block_max(amax, red);
    if (threadIdx.x == 0) atomicMax(&amax_bits[b], float_to_bits(amax));
  }
}
__global__ void scales_from_bits_kernel(const unsigned* amax_bits, int64_t nblocks, float qm, float* scales) {
  for (int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < nblocks; b += int64_t(gridDim.x) * blockDim.x)
    scales[b] = scale_of(bits_to_float(amax_bits[b]), qm);
}

// One value at its block's scale, rounded as the format says.
SS_DEV float int_value(float x, float inv, float qm, bool stochastic, uint64_t seed, uint64_t counter) {
  const float v = x * inv;
  if (!stochastic) return clampf(rintf(v), -qm, qm);
  const float f = floorf(v);
  return clampf((v - f) > uniform01(seed, counter) ? f + 1.0f : f, -qm, qm);
}

// int8 and fp8: a thread per value; int4: a thread per byte (two values,
// possibly of two blocks).
__global__ void values_kernel(Mat in, int64_t n, QuantArgs q, uint64_t counter0, const float* scales,
                              uint8_t* values) {
  const float qm = qmax_of(q.precision);
  const bool int4 = q.precision == Precision::INT4;
  const int64_t items = int4 ? (n + 1) / 2 : n;
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < items; j += int64_t(gridDim.x) * blockDim.x) {
    if (int4) {
      uint8_t byte = 0;
      for (int64_t i = 2 * j; i < min64(n, 2 * j + 2); ++i) {
        const float inv = 1.0f / scales[i / q.block];
        const float v = int_value(load(in.p, i, in.dt), inv, qm, q.stochastic, q.seed, counter0 + uint64_t(i));
        byte |= uint8_t((int(v) & 0xf) << ((i & 1) << 2));
      }
      values[j] = byte;
      continue;
    }
    const float inv = 1.0f / scales[j / q.block];
    const float x = load(in.p, j, in.dt);
    if (q.precision == Precision::INT8) {
      values[j] = uint8_t(int8_t(int_value(x, inv, qm, q.stochastic, q.seed, counter0 + uint64_t(j))));
    } else if (!q.stochastic) {
      values[j] = e4m3_nearest(x * inv);
    } else {
      values[j] = e4m3_rounded(x * inv, uniform01(q.seed, counter0 + uint64_t(j)));
    }
  }
}

__global__ void dequantize_kernel(const uint8_t* in, int64_t n, QuantArgs q, Mat out, bool accumulate) {
  const int64_t nblocks = q.precision == Precision::FP32 || q.precision == Precision::BF16 ||
                                  q.precision == Precision::FP16
                              ? 0
                              : (n + q.block - 1) / q.block;
  const float* scales = reinterpret_cast<const float*>(in);
  const uint8_t* values = in + 4 * nblocks;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v;
    switch (q.precision) {
      case Precision::FP32: v = reinterpret_cast<const float*>(in)[i]; break;
      case Precision::BF16: v = bf16_to_float(reinterpret_cast<const uint16_t*>(in)[i]); break;
      case Precision::FP16: v = f16_to_float(reinterpret_cast<const uint16_t*>(in)[i]); break;
      case Precision::INT8: v = float(int8_t(values[i])) * scales[i / q.block]; break;
      case Precision::INT4: {
        const int8_t nib = int8_t(int8_t(uint8_t(values[i >> 1] << (4 - ((i & 1) << 2)))) >> 4);
        v = float(nib) * scales[i / q.block];
        break;
      }
      default: v = e4m3_to_float(values[i]) * scales[i / q.block];
    }
    store(out.p, i, out.dt, accumulate ? load(out.p, i, out.dt) + v : v);
  }
}

bool is_block(Precision p) { return p == Precision::INT8 || p == Precision::INT4 || p == Precision::FP8; }

}  // namespace

void quantize(const Mat& in, int64_t n, const QuantArgs& q, uint64_t counter, uint8_t* out, Stream s) {
  expect(q.block > 0, "quantize", "block size must be positive");
  if (n == 0) return;
  if (!is_block(q.precision)) {
    SS_LAUNCH(cast_kernel, blocks_for(n, kThreads), kThreads, 0, s)(in, n, q.precision, out);
    check_launch("quantize (cast)");
    return;
  }
  const int64_t nblocks = (n + q.block - 1) / q.block;
  float* scales = reinterpret_cast<float*>(out);
  uint8_t* values = out + 4 * nblocks;
  const float qm = qmax_of(q.precision);
  if (q.block <= 1024) {
    SS_LAUNCH(scales_small_kernel, blocks_for(nblocks, kThreads / 32), kThreads, 0, s)(in, n, q.block, qm, scales);
    check_launch("quantize (scales)");
  } else {
    // The amax bits are gathered in the scales' own bytes, then turned into scales in place.
    unsigned* bits = reinterpret_cast<unsigned*>(scales);
    memset_device(bits, 0, 4 * nblocks, s);
    const int64_t items = nblocks * ((std::min(q.block, n) + kSegment - 1) / kSegment);
    SS_LAUNCH(absmax_large_kernel, blocks_for(items, 1), kThreads, 0, s)(in, n, q.block, bits);
    check_launch("quantize (absmax)");
    SS_LAUNCH(scales_from_bits_kernel, blocks_for(nblocks, kThreads), kThreads, 0, s)(bits, nblocks, qm, scales);
    check_launch("quantize (scales)");
  }
  const int64_t items = q.precision == Precision::INT4 ? (n + 1) / 2 : n;
  SS_LAUNCH(values_kernel, blocks_for(items, kThreads), kThreads, 0, s)(in, n, q, counter, scales, values);
  check_launch("quantize (values)");
}

void dequantize(const uint8_t* in, int64_t n, const QuantArgs& q, const Mat& out, bool accumulate, Stream s) {
  if (n == 0) return;
  SS_LAUNCH(dequantize_kernel, blocks_for(n, kThreads), kThreads, 0, s)(in, n, q, out, accumulate);
  check_launch("dequantize");
}

}  // namespace ss::SS_CUDA_NS
