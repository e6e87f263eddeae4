// Element types and the memory categories every byte is accounted under.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
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
std::string_view dtype_name(DType t);

// Memory categories (DESIGN.md, "Event stream"): the order is the protocol's.
enum class Category : uint8_t { Weights, Activations, KvCache, SsmState, CommBuffers, Workspace };
inline constexpr int kCategoryCount = 6;
inline constexpr std::array<std::string_view, kCategoryCount> kCategoryNames = {
    "weights", "activations", "kv_cache", "ssm_state", "comm_buffers", "workspace"};
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

}  // namespace ss
