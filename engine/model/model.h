// Transformer (Llama), Mamba, Falcon-Mamba, Mamba2 and the hybrid, written
// once against the Backend. A forward pass takes tokens at given positions,
// appends to the caches (KV cache, conv_state + ssm_state) and returns logits.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "core/backend.h"
#include "model/config.h"
#include "model/weights.h"

namespace ss {

struct AttentionWeights {
  Tensor in_norm, q, k, v, o, post_norm, gate, up, down;
};
struct Mamba2Weights {
  Tensor norm, in_proj, conv_w, conv_b, dt_bias, A_log, D, gated_norm, out_proj;
};
struct MambaWeights {
  Tensor norm, in_proj, conv_w, conv_b, x_proj, dt_proj_w, dt_proj_b, A_log, D, out_proj;
};
struct LayerWeights {
  LayerKind kind;
  AttentionWeights attn;
  Mamba2Weights m2;
  MambaWeights m1;
};

// Per-layer inference state carried from prefill into decode.
struct LayerCache {
  Tensor k, v;                   // [capacity, kv_heads*head_dim] (attention layers)
  Tensor conv_state, ssm_state;  // Mamba layers: [d_conv-1, conv_dim], [heads, head_dim, d_state] or [d_inner, d_state]
};
struct Cache {
  std::vector<LayerCache> layers;
  std::vector<int32_t> positions;  // positions of the tokens held, in order
  int64_t capacity = 0;
  int64_t length() const { return int64_t(positions.size()); }
};

class Model {
 public:
  Model(ModelConfig cfg, Backend& be);

  const ModelConfig& config() const { return m_cfg; }
  const std::vector<WeightSpec>& weights() const { return m_specs; }
  int64_t parameter_count() const;
  Backend& backend() { return m_be; }

  // Allocates every weight (category weights) and fills it from `src`.
  void load(TensorSource& src);
  // Caches for up to `max_tokens` tokens, zero-initialised.
  Cache make_cache(int64_t max_tokens);

  // Runs `tokens` at `positions` (one per token, after those in the cache).
  // Returns logits [T, vocab] when all_logits, else [1, vocab] for the last token.
  Tensor forward(std::span<const int32_t> tokens, std::span<const int32_t> positions, Cache& cache,
                 bool all_logits);

 private:
  void build_specs();
  void attention_block(int layer, const Tensor& x, std::span<const int32_t> positions, Cache& cache);
  void mlp_block(int layer, const Tensor& x);
  void mamba2_block(int layer, const Tensor& x, Cache& cache);
  void mamba_block(int layer, const Tensor& x, Cache& cache);

  ModelConfig m_cfg;
  Backend& m_be;
  Tensor m_embed, m_final_norm, m_lm_head;
  std::vector<LayerWeights> m_layers;
  std::vector<WeightSpec> m_specs;
};

}  // namespace ss
