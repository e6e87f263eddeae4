// The weights a model needs, described as data: HF tensor name, global shape,
// layer, and how synthetic values are drawn. Loading (synthetic or from a
// checkpoint), placement events and parameter counts all read this one list.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"
#include "model/config.h"
#include "model/parallel.h"

namespace ss {

enum class Init {
  Linear,     // uniform, std = scale / sqrt(fan_in)
  Embedding,  // uniform, std = scale
  NormWeight, // 1 + small noise
  ConvWeight, // uniform, std = 1 / sqrt(kernel)
  ConvBias,   // small uniform
  Bias,       // a projection's bias: uniform, std 0.3 * scale
  ALogHeads,  // Mamba2: log(U[1, 16]) per head
  ALogS4D,    // Mamba: log(n + 1) for state n (S4D-real)
  DtBias,     // inverse softplus of dt ~ logU[1e-3, 1e-1]
  DSkip,      // 1 + small noise
};

struct WeightSpec {
  std::string name;  // HF transformers' name, e.g. model.layers.3.self_attn.q_proj.weight
  Shape shape;
  int layer = -1;    // -1: embeddings, final norm, LM head
  Init init = Init::Linear;
  float scale = 1.0f;
  Tensor* slot = nullptr;  // where the loaded tensor goes
  WeightSlice slice;       // what this rank holds (mirrored by default)
  Shape local_shape() const;
};

// Calls fn(local_index, global_index) for every element of the slice, in local order.
template <class F>
void for_each_slice_element(const Shape& global, const WeightSlice& slice, F&& fn) {
  if (slice.mirrored()) {
    const int64_t n = numel(global);
    for (int64_t i = 0; i < n; ++i) fn(i, i);
    return;
  }
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < slice.axis; ++d) outer *= global[size_t(d)];
  for (size_t d = size_t(slice.axis) + 1; d < global.size(); ++d) inner *= global[d];
  const int64_t axis_len = global[size_t(slice.axis)];
  int64_t local = 0;
  for (int64_t o = 0; o < outer; ++o)
    for (const auto& [a, b] : slice.ranges)
      for (int64_t k = a; k < b; ++k)
        for (int64_t i = 0; i < inner; ++i) fn(local++, (o * axis_len + k) * inner + i);
}

// Deterministic synthetic values of a weight's elements: a counter-based hash
// of (seed, name, index), so any slice of a tensor can be drawn on its own and
// a sharded run draws exactly the values a single-device run draws. The
// (seed, name) part is hashed once, when the draw is made.
class SyntheticDraw {
 public:
  SyntheticDraw(const WeightSpec& w, uint64_t seed);
  float operator()(int64_t index) const;  // element `index` of the whole (global) tensor

 private:
  const WeightSpec& m_w;
  uint64_t m_key;
};

// Where weight values come from.
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // Fills `dst` (allocated with w.local_shape()) with this rank's slice of `w`.
  virtual void fill(Backend& be, const WeightSpec& w, const Tensor& dst) = 0;
  virtual std::string describe() const = 0;
};

class SyntheticSource final : public TensorSource {
 public:
  explicit SyntheticSource(uint64_t seed) : m_seed(seed) {}
  void fill(Backend& be, const WeightSpec& w, const Tensor& dst) override;
  std::string describe() const override { return "synthetic (seed " + std::to_string(m_seed) + ")"; }

 private:
  uint64_t m_seed;
};

}  // namespace ss
