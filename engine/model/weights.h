// The weights a model needs, described as data: HF tensor name, global shape,
// layer, and how synthetic values are drawn. Loading (synthetic or from a
// checkpoint), placement events and parameter counts all read this one list.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"
#include "model/config.h"

namespace ss {

enum class Init {
  Linear,     // uniform, std = scale / sqrt(fan_in)
  Embedding,  // uniform, std = scale
  NormWeight, // 1 + small noise
  ConvWeight, // uniform, std = 1 / sqrt(kernel)
  ConvBias,   // small uniform
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
};

// Deterministic synthetic value of element `index` of a weight: a counter-based
// hash of (seed, name, index), so any slice of a tensor can be drawn on its own
// and a sharded run draws exactly the values a single-device run draws.
float synthetic_value(const WeightSpec& w, uint64_t seed, int64_t index);

// Where weight values come from.
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // Fills `dst` (allocated with w.shape) with the values of `w`.
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
