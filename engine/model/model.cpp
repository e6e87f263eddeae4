#include "model/model.h"

#include <cmath>

#include "core/error.h"

namespace ss {

Model::Model(ModelConfig cfg, Backend& be) : m_cfg(std::move(cfg)), m_be(be) {
  m_layers.resize(size_t(m_cfg.n_layers));
  build_specs();
}

// HF transformers' names: Llama under "model.", Mamba/Mamba2 under
// "backbone."; the hybrid uses Llama names for attention layers and Mamba2
// mixer names for SSM layers, under "model.".
void Model::build_specs() {
  const ModelConfig& c = m_cfg;
  const bool backbone = c.family == Family::Mamba || c.family == Family::Mamba2;
  const std::string root = backbone ? "backbone." : "model.";
  const float out_scale = 1.0f / std::sqrt(2.0f * float(c.n_layers));  // residual branches sum over layers
  const int64_t d = c.d_model;
  auto add = [&](std::string name, Shape shape, int layer, Init init, Tensor* slot, float scale = 1.0f) {
    m_specs.push_back(WeightSpec{std::move(name), std::move(shape), layer, init, scale, slot});
  };

  add(root + (backbone ? "embeddings.weight" : "embed_tokens.weight"), {c.vocab, d}, -1, Init::Embedding, &m_embed,
      1.0f / std::sqrt(float(d)));
  for (int i = 0; i < c.n_layers; ++i) {
    LayerWeights& L = m_layers[size_t(i)];
    L.kind = c.layer_kind(i);
    const std::string p = root + "layers." + std::to_string(i) + ".";
    if (L.kind == LayerKind::Attention) {
      AttentionWeights& w = L.attn;
      const int64_t hq = int64_t(c.n_heads) * c.head_dim, hkv = int64_t(c.n_kv_heads) * c.head_dim;
      add(p + "input_layernorm.weight", {d}, i, Init::NormWeight, &w.in_norm);
      add(p + "self_attn.q_proj.weight", {hq, d}, i, Init::Linear, &w.q);
      add(p + "self_attn.k_proj.weight", {hkv, d}, i, Init::Linear, &w.k);
      add(p + "self_attn.v_proj.weight", {hkv, d}, i, Init::Linear, &w.v);
      add(p + "self_attn.o_proj.weight", {d, hq}, i, Init::Linear, &w.o, out_scale);
      add(p + "post_attention_layernorm.weight", {d}, i, Init::NormWeight, &w.post_norm);
      add(p + "mlp.gate_proj.weight", {c.ffn_dim, d}, i, Init::Linear, &w.gate);
      add(p + "mlp.up_proj.weight", {c.ffn_dim, d}, i, Init::Linear, &w.up);
      add(p + "mlp.down_proj.weight", {d, c.ffn_dim}, i, Init::Linear, &w.down, out_scale);
    } else if (L.kind == LayerKind::Mamba2) {
      Mamba2Weights& w = L.m2;
      add(p + "norm.weight", {d}, i, Init::NormWeight, &w.norm);
      add(p + "mixer.in_proj.weight", {c.in_proj_dim(), d}, i, Init::Linear, &w.in_proj);
      add(p + "mixer.conv1d.weight", {c.conv_dim(), 1, c.d_conv}, i, Init::ConvWeight, &w.conv_w);
      if (c.conv_bias) add(p + "mixer.conv1d.bias", {c.conv_dim()}, i, Init::ConvBias, &w.conv_b);
      add(p + "mixer.dt_bias", {c.ssm_heads}, i, Init::DtBias, &w.dt_bias);
      add(p + "mixer.A_log", {c.ssm_heads}, i, Init::ALogHeads, &w.A_log);
      add(p + "mixer.D", {c.ssm_heads}, i, Init::DSkip, &w.D);
      add(p + "mixer.norm.weight", {c.d_inner}, i, Init::NormWeight, &w.gated_norm);
      add(p + "mixer.out_proj.weight", {d, c.d_inner}, i, Init::Linear, &w.out_proj, out_scale);
    } else {
      MambaWeights& w = L.m1;
      add(p + "norm.weight", {d}, i, Init::NormWeight, &w.norm);
      add(p + "mixer.in_proj.weight", {2 * c.d_inner, d}, i, Init::Linear, &w.in_proj);
      add(p + "mixer.conv1d.weight", {c.d_inner, 1, c.d_conv}, i, Init::ConvWeight, &w.conv_w);
      if (c.conv_bias) add(p + "mixer.conv1d.bias", {c.d_inner}, i, Init::ConvBias, &w.conv_b);
      add(p + "mixer.x_proj.weight", {c.dt_rank + 2 * int64_t(c.d_state), c.d_inner}, i, Init::Linear, &w.x_proj);
      add(p + "mixer.dt_proj.weight", {c.d_inner, c.dt_rank}, i, Init::Linear, &w.dt_proj_w);
      add(p + "mixer.dt_proj.bias", {c.d_inner}, i, Init::DtBias, &w.dt_proj_b);
      add(p + "mixer.A_log", {c.d_inner, c.d_state}, i, Init::ALogS4D, &w.A_log);
      add(p + "mixer.D", {c.d_inner}, i, Init::DSkip, &w.D);
      add(p + "mixer.out_proj.weight", {d, c.d_inner}, i, Init::Linear, &w.out_proj, out_scale);
    }
  }
  add(root + (backbone ? "norm_f.weight" : "norm.weight"), {d}, -1, Init::NormWeight, &m_final_norm);
  if (!c.tie_embeddings) add("lm_head.weight", {c.vocab, d}, -1, Init::Linear, &m_lm_head);
}

int64_t Model::parameter_count() const {
  int64_t n = 0;
  for (const auto& w : m_specs) n += numel(w.shape);
  return n;
}

void Model::load(TensorSource& src) {
  for (const WeightSpec& w : m_specs) {
    *w.slot = m_be.alloc(w.shape, Category::Weights, w.name);
    src.fill(m_be, w, *w.slot);
  }
  if (m_cfg.tie_embeddings) m_lm_head = m_embed;
}

Cache Model::make_cache(int64_t max_tokens) {
  const ModelConfig& c = m_cfg;
  Cache cache;
  cache.capacity = max_tokens;
  cache.layers.resize(size_t(c.n_layers));
  for (int i = 0; i < c.n_layers; ++i) {
    LayerCache& lc = cache.layers[size_t(i)];
    const std::string p = "layers." + std::to_string(i) + ".";
    switch (m_layers[size_t(i)].kind) {
      case LayerKind::Attention: {
        const int64_t hkv = int64_t(c.n_kv_heads) * c.head_dim;
        lc.k = m_be.alloc({max_tokens, hkv}, Category::KvCache, p + "k_cache");
        lc.v = m_be.alloc({max_tokens, hkv}, Category::KvCache, p + "v_cache");
        break;
      }
      case LayerKind::Mamba2:
        lc.conv_state = m_be.alloc({c.d_conv - 1, c.conv_dim()}, Category::SsmState, p + "conv_state");
        lc.ssm_state = m_be.alloc({c.ssm_heads, c.ssm_head_dim, c.d_state}, Category::SsmState, p + "ssm_state");
        break;
      case LayerKind::Mamba:
        lc.conv_state = m_be.alloc({c.d_conv - 1, c.d_inner}, Category::SsmState, p + "conv_state");
        lc.ssm_state = m_be.alloc({c.d_inner, c.d_state}, Category::SsmState, p + "ssm_state");
        break;
    }
    for (Tensor* t : {&lc.conv_state, &lc.ssm_state})
      if (t->defined()) m_be.fill(*t, 0.0f);
  }
  return cache;
}

Tensor Model::forward(std::span<const int32_t> tokens, std::span<const int32_t> positions, Cache& cache,
                      bool all_logits) {
  const int64_t T = int64_t(tokens.size());
  if (T == 0 || positions.size() != tokens.size()) throw std::logic_error("forward: tokens and positions differ");
  if (cache.length() + T > cache.capacity)
    throw UsageError("the run needs " + std::to_string(cache.length() + T) + " tokens of cache but " +
                     std::to_string(cache.capacity) + " were reserved");
  Recorder& rec = m_be.recorder();
  Tensor x = m_be.alloc({T, m_cfg.d_model}, Category::Activations, "residual");
  {
    SiteScope s(rec, -1, "embed");
    m_be.embedding(x, m_embed, tokens);
  }
  const size_t held = cache.positions.size();
  cache.positions.insert(cache.positions.end(), positions.begin(), positions.end());
  try {
    for (int i = 0; i < m_cfg.n_layers; ++i) {
      switch (m_layers[size_t(i)].kind) {
        case LayerKind::Attention:
          attention_block(i, x, positions, cache);
          mlp_block(i, x);
          break;
        case LayerKind::Mamba2: mamba2_block(i, x, cache); break;
        case LayerKind::Mamba: mamba_block(i, x, cache); break;
      }
    }
  } catch (...) {
    cache.positions.resize(held);
    throw;
  }
  SiteScope s(rec, -1, "lm_head");
  const Tensor rows = all_logits ? x : x.slice(0, T - 1, 1);
  Tensor h = m_be.alloc({rows.rows(), m_cfg.d_model}, Category::Activations, "final_norm");
  m_be.rmsnorm(h, rows, m_final_norm, m_cfg.norm_eps, m_cfg.d_model);
  Tensor logits = m_be.alloc({rows.rows(), m_cfg.vocab}, Category::Activations, "logits");
  m_be.matmul(logits, h, m_lm_head);
  return logits;
}

}  // namespace ss
