#include "model/model.h"

#include <cmath>

#include "core/error.h"

namespace ss {

Model::Model(ModelConfig cfg, Backend& be, Parallel par)
    : m_cfg(std::move(cfg)), m_rope_freqs(m_cfg.rope_inv_freq()), m_be(be), m_par(par) {
  m_layers.resize(size_t(m_cfg.n_layers));
  const int n = m_par.shard_count(), i = m_par.shard_index();
  if (m_cfg.n_heads) m_attn = attention_shard(m_cfg, i, n);
  if (m_cfg.ssm_heads) m_m2 = mamba2_shard(m_cfg, i, n);
  if (m_cfg.family == Family::Mamba) m_m1 = mamba_shard(m_cfg, i, n);
  build_specs();
}

// HF transformers' names: Llama under "model.", Mamba/Mamba2 under
// "backbone."; the hybrid uses Llama names for attention layers and Mamba2
// mixer names for SSM layers, under "model.". Each weight's slice says what
// this rank holds: attention by heads, MLP by intermediate columns, Mamba2 by
// heads (the packed in_proj [z, x, B, C, dt] re-packed per rank), Mamba by
// channels (Megatron's column-parallel then row-parallel pairs).
void Model::build_specs() {
  const ModelConfig& c = m_cfg;
  const bool backbone = c.family == Family::Mamba || c.family == Family::Mamba2;
  const std::string root = backbone ? "backbone." : "model.";
  const float out_scale = 1.0f / std::sqrt(2.0f * float(c.n_layers));  // residual branches sum over layers
  const int64_t d = c.d_model;
  const bool sharded = m_par.shard_count() > 1;
  auto add = [&](std::string name, Shape shape, int layer, Init init, Tensor* slot, float scale = 1.0f,
                 WeightSlice slice = {}) {
    if (!sharded) slice = {};
    m_specs.push_back(WeightSpec{std::move(name), std::move(shape), layer, init, scale, slot, std::move(slice)});
  };
  auto rows = [](std::vector<Range> r) { return WeightSlice{0, std::move(r)}; };
  // Under tsp every rank computes all heads/channels of its tokens, so the
  // small per-channel parameters (conv, dt, A, D, gated norm: under 1% of a
  // model) stay whole; the projection matrices are what is split and streamed.
  const bool folded = m_par.folded();
  auto small = [&](std::vector<Range> r) { return folded ? WeightSlice{} : rows(std::move(r)); };
  auto cols = [](std::vector<Range> r) { return WeightSlice{1, std::move(r)}; };

  add(root + (backbone ? "embeddings.weight" : "embed_tokens.weight"), {c.vocab, d}, -1, Init::Embedding, &m_embed,
      1.0f / std::sqrt(float(d)));
  for (int i = 0; i < c.n_layers; ++i) {
    LayerWeights& L = m_layers[size_t(i)];
    L.kind = c.layer_kind(i);
    const std::string p = root + "layers." + std::to_string(i) + ".";
    if (L.kind == LayerKind::Attention) {
      AttentionWeights& w = L.attn;
      const AttentionShard& a = m_attn;
      const int64_t hd = c.head_dim, hq = int64_t(c.n_heads) * hd, hkv = int64_t(c.n_kv_heads) * hd;
      const Range qr{a.head0 * hd, (a.head0 + a.heads) * hd}, kr{a.kv_head0 * hd, (a.kv_head0 + a.kv_heads) * hd};
      const Range fr{a.ffn0, a.ffn0 + a.ffn};
      // A column-parallel projection's bias is split with its rows (whole
      // under tsp, where each rank computes every head of its tokens); a
      // row-parallel one's is whole and added once, after the reduction.
      add(p + "input_layernorm.weight", {d}, i, Init::NormWeight, &w.in_norm);
      add(p + "self_attn.q_proj.weight", {hq, d}, i, Init::Linear, &w.q, 1.0f, rows({qr}));
      if (c.qkv_bias) add(p + "self_attn.q_proj.bias", {hq}, i, Init::Bias, &w.q_b, 1.0f, small({qr}));
      add(p + "self_attn.k_proj.weight", {hkv, d}, i, Init::Linear, &w.k, 1.0f, rows({kr}));
      if (c.qkv_bias) add(p + "self_attn.k_proj.bias", {hkv}, i, Init::Bias, &w.k_b, 1.0f, small({kr}));
      add(p + "self_attn.v_proj.weight", {hkv, d}, i, Init::Linear, &w.v, 1.0f, rows({kr}));
      if (c.qkv_bias) add(p + "self_attn.v_proj.bias", {hkv}, i, Init::Bias, &w.v_b, 1.0f, small({kr}));
      add(p + "self_attn.o_proj.weight", {d, hq}, i, Init::Linear, &w.o, out_scale, cols({qr}));
      if (c.o_bias) add(p + "self_attn.o_proj.bias", {d}, i, Init::Bias, &w.o_b, out_scale);
      add(p + "post_attention_layernorm.weight", {d}, i, Init::NormWeight, &w.post_norm);
      add(p + "mlp.gate_proj.weight", {c.ffn_dim, d}, i, Init::Linear, &w.gate, 1.0f, rows({fr}));
      if (c.mlp_bias) add(p + "mlp.gate_proj.bias", {c.ffn_dim}, i, Init::Bias, &w.gate_b, 1.0f, small({fr}));
      add(p + "mlp.up_proj.weight", {c.ffn_dim, d}, i, Init::Linear, &w.up, 1.0f, rows({fr}));
      if (c.mlp_bias) add(p + "mlp.up_proj.bias", {c.ffn_dim}, i, Init::Bias, &w.up_b, 1.0f, small({fr}));
      add(p + "mlp.down_proj.weight", {d, c.ffn_dim}, i, Init::Linear, &w.down, out_scale, cols({fr}));
      if (c.mlp_bias) add(p + "mlp.down_proj.bias", {d}, i, Init::Bias, &w.down_b, out_scale);
    } else if (L.kind == LayerKind::Mamba2) {
      Mamba2Weights& w = L.m2;
      const Mamba2Shard& m = m_m2;
      const int64_t P = c.ssm_head_dim, N = c.d_state, Di = c.d_inner, GN = int64_t(c.n_groups) * N;
      const Range hx{m.head0 * P, (m.head0 + m.heads) * P}, hg{m.group0 * N, (m.group0 + m.groups) * N};
      const Range hh{m.head0, m.head0 + m.heads};
      auto shift = [](Range r, int64_t by) { return Range{r.first + by, r.second + by}; };
      // in_proj rows [z | x | B | C | dt] and conv channels [x | B | C], re-packed per rank.
      const std::vector<Range> in_rows = {hx, shift(hx, Di), shift(hg, 2 * Di), shift(hg, 2 * Di + GN),
                                          shift(hh, 2 * Di + 2 * GN)};
      const std::vector<Range> conv_rows = {hx, shift(hg, Di), shift(hg, Di + GN)};
      add(p + "norm.weight", {d}, i, Init::NormWeight, &w.norm);
      add(p + "mixer.in_proj.weight", {c.in_proj_dim(), d}, i, Init::Linear, &w.in_proj, 1.0f, rows(in_rows));
      add(p + "mixer.conv1d.weight", {c.conv_dim(), 1, c.d_conv}, i, Init::ConvWeight, &w.conv_w, 1.0f, small(conv_rows));
      if (c.conv_bias)
        add(p + "mixer.conv1d.bias", {c.conv_dim()}, i, Init::ConvBias, &w.conv_b, 1.0f, small(conv_rows));
      add(p + "mixer.dt_bias", {c.ssm_heads}, i, Init::DtBias, &w.dt_bias, 1.0f, small({hh}));
      add(p + "mixer.A_log", {c.ssm_heads}, i, Init::ALogHeads, &w.A_log, 1.0f, small({hh}));
      add(p + "mixer.D", {c.ssm_heads}, i, Init::DSkip, &w.D, 1.0f, small({hh}));
      add(p + "mixer.norm.weight", {Di}, i, Init::NormWeight, &w.gated_norm, 1.0f, small({hx}));
      add(p + "mixer.out_proj.weight", {d, Di}, i, Init::Linear, &w.out_proj, out_scale, cols({hx}));
    } else {
      MambaWeights& w = L.m1;
      const int64_t Di = c.d_inner;
      const Range ch{m_m1.channel0, m_m1.channel0 + m_m1.channels};
      const Range chz{Di + ch.first, Di + ch.second};
      add(p + "norm.weight", {d}, i, Init::NormWeight, &w.norm);
      add(p + "mixer.in_proj.weight", {2 * Di, d}, i, Init::Linear, &w.in_proj, 1.0f, rows({ch, chz}));
      add(p + "mixer.conv1d.weight", {Di, 1, c.d_conv}, i, Init::ConvWeight, &w.conv_w, 1.0f, small({ch}));
      if (c.conv_bias) add(p + "mixer.conv1d.bias", {Di}, i, Init::ConvBias, &w.conv_b, 1.0f, small({ch}));
      add(p + "mixer.x_proj.weight", {c.dt_rank + 2 * int64_t(c.d_state), Di}, i, Init::Linear, &w.x_proj, 1.0f,
          cols({ch}));
      add(p + "mixer.dt_proj.weight", {Di, c.dt_rank}, i, Init::Linear, &w.dt_proj_w, 1.0f, rows({ch}));
      add(p + "mixer.dt_proj.bias", {Di}, i, Init::DtBias, &w.dt_proj_b, 1.0f, small({ch}));
      add(p + "mixer.A_log", {Di, c.d_state}, i, Init::ALogS4D, &w.A_log, 1.0f, small({ch}));
      add(p + "mixer.D", {Di}, i, Init::DSkip, &w.D, 1.0f, small({ch}));
      add(p + "mixer.out_proj.weight", {d, Di}, i, Init::Linear, &w.out_proj, out_scale, cols({ch}));
    }
  }
  add(root + (backbone ? "norm_f.weight" : "norm.weight"), {d}, -1, Init::NormWeight, &m_final_norm);
  if (!c.tie_embeddings) add("lm_head.weight", {c.vocab, d}, -1, Init::Linear, &m_lm_head);
  if (folded) build_packs();
}

// tsp: attention's packed QKV and O shards are broadcast in turns; the MLP's
// gate/up/down and the Mamba projections circulate on the ring.
void Model::build_packs() {
  m_layer_packs.assign(size_t(m_cfg.n_layers), {});
  auto find = [&](const std::string& suffix, int layer) {
    for (size_t i = 0; i < m_specs.size(); ++i)
      if (m_specs[i].layer == layer && m_specs[i].name.size() >= suffix.size() &&
          m_specs[i].name.compare(m_specs[i].name.size() - suffix.size(), suffix.size(), suffix) == 0)
        return i;
    throw std::logic_error("no weight ending in " + suffix);
  };
  auto pack = [&](int layer, std::string name, bool ring, std::vector<std::string> suffixes) {
    WeightPack p;
    p.layer = layer;
    p.name = std::move(name);
    p.ring = ring;
    for (auto& sfx : suffixes) {
      p.members.push_back(find(sfx, layer));
      p.numel += numel(m_specs[p.members.back()].local_shape());
    }
    m_layer_packs[size_t(layer)].push_back(m_packs.size());
    m_packs.push_back(std::move(p));
  };
  for (int i = 0; i < m_cfg.n_layers; ++i) {
    switch (m_layers[size_t(i)].kind) {
      case LayerKind::Attention:
        pack(i, "attn.qkv", false, {"q_proj.weight", "k_proj.weight", "v_proj.weight"});
        pack(i, "attn.o", false, {"o_proj.weight"});
        pack(i, "mlp", true, {"gate_proj.weight", "up_proj.weight", "down_proj.weight"});
        break;
      case LayerKind::Mamba2:
        pack(i, "mixer.in_proj", true, {"in_proj.weight"});
        pack(i, "mixer.out_proj", true, {"out_proj.weight"});
        break;
      case LayerKind::Mamba:
        pack(i, "mixer.in_proj", true, {"in_proj.weight"});
        pack(i, "mixer.x_proj", true, {"x_proj.weight"});
        pack(i, "mixer.dt_proj", true, {"dt_proj.weight"});
        pack(i, "mixer.out_proj", true, {"out_proj.weight"});
        break;
    }
  }
}


int64_t Model::parameter_count() const {
  int64_t n = 0;
  for (const auto& w : m_specs) n += numel(w.shape);
  return n;
}

int64_t Model::local_parameter_count() const {
  int64_t n = 0;
  for (const auto& w : m_specs) n += numel(w.local_shape());
  return n;
}

void Model::load(TensorSource& src) {
  // Packed weights live in one flat buffer per pack; their slots are views.
  std::vector<bool> packed(m_specs.size(), false);
  for (WeightPack& p : m_packs) {
    p.flat = m_be.alloc({p.numel}, Category::Weights, "layers." + std::to_string(p.layer) + "." + p.name, m_cfg.dtype);
    auto views = pack_views(p, p.flat);
    for (size_t k = 0; k < p.members.size(); ++k) {
      *m_specs[p.members[k]].slot = views[k];
      packed[p.members[k]] = true;
    }
  }
  for (size_t i = 0; i < m_specs.size(); ++i) {
    const WeightSpec& w = m_specs[i];
    if (!packed[i]) *w.slot = m_be.alloc(w.local_shape(), Category::Weights, w.name, m_cfg.dtype);
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
        const int64_t hkv = int64_t(m_par.folded() ? c.n_kv_heads : m_attn.kv_heads) * c.head_dim;
        lc.k = m_be.alloc({max_tokens, hkv}, Category::KvCache, p + "k_cache", m_cfg.kv_dtype);
        lc.v = m_be.alloc({max_tokens, hkv}, Category::KvCache, p + "v_cache", m_cfg.kv_dtype);
        break;
      }
      case LayerKind::Mamba2: {
        const int heads = m_par.folded() ? c.ssm_heads : m_m2.heads, groups = m_par.folded() ? c.n_groups : m_m2.groups;
        const int64_t conv = int64_t(heads) * c.ssm_head_dim + 2 * int64_t(groups) * c.d_state;
        lc.conv_state = m_be.alloc({c.d_conv - 1, conv}, Category::SsmState, p + "conv_state", m_cfg.dtype);
        lc.ssm_state = m_be.alloc({heads, c.ssm_head_dim, c.d_state}, Category::SsmState, p + "ssm_state", DType::F32);
        break;
      }
      case LayerKind::Mamba: {
        const int64_t ch = m_par.folded() ? c.d_inner : m_m1.channels;
        lc.conv_state = m_be.alloc({c.d_conv - 1, ch}, Category::SsmState, p + "conv_state", m_cfg.dtype);
        lc.ssm_state = m_be.alloc({ch, c.d_state}, Category::SsmState, p + "ssm_state", DType::F32);
        break;
      }
    }
    for (Tensor* t : {&lc.conv_state, &lc.ssm_state})
      if (t->defined()) m_be.fill(*t, 0.0f);
  }
  return cache;
}

// x += in · wᵀ for a row-parallel projection: under tensor parallelism each
// rank's product is a partial sum, held in a comm buffer and all-reduced (at
// the site's precision) into x; otherwise it accumulates into x directly.
void Model::project_out(int layer, const Tensor& x, const Tensor& in, const Tensor& w, const char* site,
                        const char* partial_name) {
  if (!tp_active()) {
    m_be.matmul(x, in, w, /*accumulate=*/true);
    return;
  }
  Tensor partial = m_be.alloc({x.rows(), m_cfg.d_model}, Category::CommBuffers, partial_name, m_cfg.dtype);
  m_be.matmul(partial, in, w);
  SiteScope r(m_be.recorder(), layer, std::string(site) + ".all_reduce");
  reduce_into(x, partial, site, layer);
}

void Model::reduce_into(const Tensor& x, const Tensor& partial, const char* site, int layer) {
  if (tp_active()) {
    const QuantSpec spec = m_par.comm_precision.at(site, layer, precision_of(m_cfg.dtype));
    // The exact reduction beside the quantized one: allocated and reduced on
    // every backend (a simulated run holds and sends what a real one does),
    // compared where there are values.
    Tensor exact;
    if (m_par.measure_sites && spec.precision != precision_of(m_cfg.dtype)) {
      exact = m_be.alloc(partial.shape(), Category::CommBuffers, "measure.exact", m_cfg.dtype);
      m_be.copy(exact, partial);
      SiteScope s(m_be.recorder(), layer, std::string(site) + ".exact_reference");
      m_par.tp->all_reduce(exact);
    }
    // A distinct stochastic-rounding counter range per call.
    const WireBytes w = quantized_all_reduce(*m_par.tp, m_be, partial, spec, (m_reduce_calls++) << 32);
    if (exact.defined() && m_be.has_data()) {
      std::vector<float> a(static_cast<size_t>(exact.numel())), b(a.size());
      m_be.download(exact, a.data());
      m_be.download(partial.is_contiguous() ? partial : exact, b.data());
      auto& [err, ref] = m_site_err[{site, layer}];
      for (size_t i = 0; i < a.size(); ++i) {
        err += double(a[i] - b[i]) * double(a[i] - b[i]);
        ref += double(a[i]) * double(a[i]);
      }
    }
    WireBytes& sum = m_wire[site];
    sum.sent += w.sent;
    sum.fp32 += w.fp32;
    sum.bf16 += w.bf16;
    sum.native += w.native;
  }
  m_be.add(x, x, partial);
}

Tensor Model::forward(std::span<const int32_t> tokens, std::span<const int32_t> positions, Cache& cache,
                      bool all_logits, const StepLayout& layout) {
  const int64_t T = int64_t(tokens.size());
  if (T == 0 || positions.size() != tokens.size()) throw std::logic_error("forward: tokens and positions differ");
  // Under sequence-parallel decode only the kv owner keeps the token's K/V.
  const bool keep_kv = layout.sequence_sharded || m_par.sp_size == 1 || layout.kv_owner == m_par.sp_rank;
  if (keep_kv && cache.length() + T > cache.capacity)
    throw UsageError("the run needs " + std::to_string(cache.length() + T) + " tokens of cache but " +
                     std::to_string(cache.capacity) + " were reserved");
  Recorder& rec = m_be.recorder();
  Tensor x = m_be.alloc({T, m_cfg.d_model}, Category::Activations, "residual", m_cfg.residual_dtype());
  {
    SiteScope s(rec, -1, "embed");
    m_be.embedding(x, m_embed, tokens);
  }
  const size_t held = cache.positions.size();
  if (keep_kv) cache.positions.insert(cache.positions.end(), positions.begin(), positions.end());
  try {
    for (int i = 0; i < m_cfg.n_layers; ++i) {
      const bool f = m_par.folded();
      switch (m_layers[size_t(i)].kind) {
        case LayerKind::Attention:
          if (f) attention_block_folded(i, x, positions, cache, layout);
          else attention_block(i, x, positions, cache, layout);
          if (f) mlp_block_folded(i, x);
          else mlp_block(i, x);
          break;
        case LayerKind::Mamba2:
          if (f) mamba2_block_folded(i, x, cache, layout);
          else mamba2_block(i, x, cache, layout);
          break;
        case LayerKind::Mamba:
          if (f) mamba_block_folded(i, x, cache, layout);
          else mamba_block(i, x, cache, layout);
          break;
      }
    }
  } catch (...) {
    cache.positions.resize(held);
    throw;
  }
  SiteScope s(rec, -1, "lm_head");
  const Tensor rows = all_logits ? x : x.slice(0, T - 1, 1);
  Tensor h = m_be.alloc({rows.rows(), m_cfg.d_model}, Category::Activations, "final_norm", m_cfg.dtype);
  m_be.rmsnorm(h, rows, m_final_norm, m_cfg.norm_eps, m_cfg.d_model);
  Tensor logits = m_be.alloc({rows.rows(), m_cfg.vocab}, Category::Activations, "logits", DType::F32);
  m_be.matmul(logits, h, m_lm_head);
  return logits;
}

}  // namespace ss
