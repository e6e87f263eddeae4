// The number formats, in one place for the kernels and the collectives: the
// element types tensors are stored in (the compute dtype of a run: fp32,
// bf16, fp16), the block-quantized formats communication may use, and the
// memory categories every byte is accounted under.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace ss {

enum class DType : uint8_t { F32, BF16, F16, I32 };

constexpr int64_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
  }
  return 0;
}
std::string_view dtype_name(DType t);  // f32, bf16, f16, i32 (safetensors' spelling minus the F)
// The run-facing name: fp32, bf16, fp16.
std::string_view compute_dtype_name(DType t);
// Parses a compute dtype ("fp32", "bf16", "fp16"; "f32"/"float32", "bfloat16",
// "f16"/"float16"/"half" too); throws UsageError naming `option` and the choices.
DType parse_compute_dtype(const std::string& text, const std::string& option = "--dtype");
constexpr bool is_float(DType t) { return t != DType::I32; }

// Memory categories (DESIGN.md, "Event stream"): the order is the protocol's.
// Grads and OptimizerState (fp32 master weights and Adam moments) are training's.
enum class Category : uint8_t { Weights, Activations, KvCache, SsmState, CommBuffers, Workspace, Grads, OptimizerState };
inline constexpr int kCategoryCount = 8;
inline constexpr std::array<std::string_view, kCategoryCount> kCategoryNames = {
    "weights", "activations", "kv_cache", "ssm_state", "comm_buffers", "workspace", "grads", "optimizer_state"};
constexpr std::string_view category_name(Category c) { return kCategoryNames[int(c)]; }

// bf16 / fp16 <-> fp32 conversions used by checkpoint I/O.
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) return uint16_t((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Row conversions between fp32 and a storage dtype (f32, bf16, f16), AVX2 /
// F16C where built for them; narrowing rounds to nearest even. `widen` adds
// into dst when accumulate (plain add, never fused).
void narrow(const float* src, int64_t n, DType to, void* dst);
void widen(const void* src, DType from, int64_t n, float* dst, bool accumulate = false);

// Formats a tensor may travel in (comm/quantize.h has the codecs): plain
// casts (fp32, bf16, fp16), or blocks of B values with one fp32 scale (absmax
// / qmax) and the values in int8, int4 (two per byte) or fp8-e4m3.
enum class Precision { FP32, BF16, FP16, INT8, INT4, FP8 };
enum class Rounding { Nearest, Stochastic };

struct QuantSpec {
  static constexpr int kPerTensor = 1 << 30;  // "tensor": one scale for each whole buffer
  Precision precision = Precision::FP32;
  int block = 128;  // values per scale (block formats)
  Rounding rounding = Rounding::Nearest;
  uint64_t seed = 0;

  bool is_block() const { return precision == Precision::INT8 || precision == Precision::INT4 || precision == Precision::FP8; }
  bool is_plain() const { return precision == Precision::FP32; }
  std::string str() const;  // e.g. int8:128, bf16, int4:64:sr, int8:tensor
};

// The plain cast of a storage dtype (bf16 -> Precision::BF16, ...).
Precision precision_of(DType t);
// Bytes of n values quantized with `s`: values plus one fp32 scale per block.
int64_t quantized_bytes(int64_t n, const QuantSpec& s);
// Bytes per value of `p` without scales (int4: 0.5).
double value_bytes(Precision p);

}  // namespace ss
