// Llama's training forward and backward (see train_model.h). Per layer, the
// forward keeps (category activations, R = this rank's rows, b = bytes a
// value, hq/hkv = this rank's query/kv width, F its MLP width):
//   x_in, x_mid             2 R d        the residual before attention and before the MLP
//   h1, h2                  2 R d        the two RMSNorm outputs (inputs of the projections)
//   q, k, v                 R (hq + 2 hkv)   (q and k after RoPE)
//   o                       R hq         attention's output (input of o_proj)
//   lse                     R heads · 4  fp32, for the backward's recomputed scores
//   g, u, a                 3 R F        gate, up and silu(g)·u
// Selective recomputation drops h1, h2 and a (recomputed from x_in, x_mid,
// g and u: elementwise work, no GEMM); full recomputation keeps only x_in
// and reruns the layer's forward in its backward. train/memory.cpp turns this
// list into the closed form the tests compare the allocator's peak with.
#include "train/train_model.h"

#include <cmath>
#include <tuple>

#include "core/error.h"

namespace ss {

Recompute parse_recompute(const std::string& s) {
  if (s == "none") return Recompute::None;
  if (s == "selective") return Recompute::Selective;
  if (s == "full") return Recompute::Full;
  throw UsageError("--recompute must be none, selective or full (got " + s + ")");
}
const char* recompute_name(Recompute r) {
  return r == Recompute::None ? "none" : r == Recompute::Selective ? "selective" : "full";
}

void TrainModel::check_supported(const ModelConfig& cfg, int tp) {
  if (const std::string why = training_split_problem(cfg, tp); !why.empty())
    throw UsageError(why + "; use a shard count that divides " + std::to_string(cfg.n_groups) + ", or --set n_groups=" +
                     std::to_string(tp));
}

TrainModel::TrainModel(Model& model, Recompute recompute)
    : m_model(model), m_be(model.backend()), m_cfg(model.config()), m_par(model.parallel()), m_rc(recompute) {
  check_supported(m_cfg, m_par.tp_size);
  // Under tsp every rank computes all heads of its own tokens (the shards stream past).
  if (m_cfg.n_heads)
    m_shard = m_par.folded() ? attention_shard(m_cfg, 0, 1) : attention_shard(m_cfg, m_par.shard_index(), m_par.shard_count());
  const int index = m_par.folded() ? 0 : m_par.shard_index(), count = m_par.folded() ? 1 : m_par.shard_count();
  if (m_cfg.ssm_heads) m_m2 = mamba2_shard(m_cfg, index, count);
  if (m_cfg.family == Family::Mamba) m_m1 = mamba_shard(m_cfg, index, count);
}

Tensor TrainModel::act(const Shape& s, const char* label, DType dt) const {
  return m_be.alloc(s, Category::Activations, label, dt);
}
Tensor TrainModel::work(const Shape& s, const char* label, DType dt) const {
  return m_be.alloc(s, Category::Workspace, label, dt);
}

static size_t find_spec(const std::vector<WeightSpec>& specs, const std::string& suffix, int layer) {
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].layer == layer && specs[i].name.size() >= suffix.size() &&
        specs[i].name.compare(specs[i].name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return i;
  throw std::logic_error("no weight ending in " + suffix + " in layer " + std::to_string(layer));
}
Tensor TrainModel::weight_of(const std::string& suffix, int layer) const {
  return *m_model.weights()[find_spec(m_model.weights(), suffix, layer)].slot;
}
Tensor TrainModel::grad_of(const std::string& suffix, int layer) const {
  return m_grads[find_spec(m_model.weights(), suffix, layer)];
}

void TrainModel::allocate_grads() {
  const auto& specs = m_model.weights();
  m_grads.assign(specs.size(), Tensor{});
  // tsp: a pack's gradient is one flat buffer, as its weights are (the ring passes it whole).
  for (const WeightPack& p : m_model.packs()) {
    Tensor flat = m_be.alloc({p.numel}, Category::Grads, "grad.layers." + std::to_string(p.layer) + "." + p.name,
                             DType::F32);
    m_pack_grads[&p] = flat;
    const std::vector<Tensor> views = m_model.pack_views(p, flat);
    for (size_t k = 0; k < p.members.size(); ++k) m_grads[p.members[k]] = views[k];
  }
  for (size_t i = 0; i < specs.size(); ++i)
    if (!m_grads[i].defined())
      m_grads[i] = m_be.alloc(specs[i].local_shape(), Category::Grads, "grad." + specs[i].name, DType::F32);
  zero_grads();
  m_layers.assign(size_t(m_cfg.n_layers), {});
  for (int i = 0; i < m_cfg.n_layers; ++i) {
    Layer& L = m_layers[size_t(i)];
    L.kind = m_cfg.layer_kind(i);
    if (L.kind == LayerKind::Mamba) {
      const std::string own_norm = "layers." + std::to_string(i) + ".norm.weight";
      const std::pair<Tensor*, Tensor*> m1[] = {
          {&L.norm, &L.g_norm},       {&L.in_proj, &L.g_in_proj},     {&L.conv_w, &L.g_conv_w},
          {&L.x_proj, &L.g_x_proj},   {&L.dt_proj_w, &L.g_dt_proj_w}, {&L.dt_proj_b, &L.g_dt_proj_b},
          {&L.A_log, &L.g_A_log},     {&L.D, &L.g_D},                 {&L.out_proj, &L.g_out_proj}};
      const char* names[] = {own_norm.c_str(),         "mixer.in_proj.weight", "mixer.conv1d.weight",
                             "mixer.x_proj.weight",    "mixer.dt_proj.weight", "mixer.dt_proj.bias",
                             "mixer.A_log",            "mixer.D",              "mixer.out_proj.weight"};
      for (size_t k = 0; k < 9; ++k) {
        *m1[k].first = weight_of(names[k], i);
        *m1[k].second = grad_of(names[k], i);
      }
      if (m_cfg.conv_bias) {
        L.conv_b = weight_of("mixer.conv1d.bias", i);
        L.g_conv_b = grad_of("mixer.conv1d.bias", i);
      }
      continue;
    }
    if (L.kind == LayerKind::Mamba2) {
      const std::pair<Tensor*, Tensor*> m2[] = {
          {&L.norm, &L.g_norm},           {&L.in_proj, &L.g_in_proj}, {&L.conv_w, &L.g_conv_w},
          {&L.dt_bias, &L.g_dt_bias},     {&L.A_log, &L.g_A_log},     {&L.D, &L.g_D},
          {&L.gated_norm, &L.g_gated_norm}, {&L.out_proj, &L.g_out_proj}};
      const std::string own_norm = "layers." + std::to_string(i) + ".norm.weight";
      const char* names[] = {own_norm.c_str(), "mixer.in_proj.weight", "mixer.conv1d.weight", "mixer.dt_bias",
                             "mixer.A_log", "mixer.D", "mixer.norm.weight", "mixer.out_proj.weight"};
      for (size_t k = 0; k < 8; ++k) {
        *m2[k].first = weight_of(names[k], i);
        *m2[k].second = grad_of(names[k], i);
      }
      if (m_cfg.conv_bias) {
        L.conv_b = weight_of("mixer.conv1d.bias", i);
        L.g_conv_b = grad_of("mixer.conv1d.bias", i);
      }
      continue;
    }
    const std::pair<Tensor*, Tensor*> slots[] = {
        {&L.in_norm, &L.g_in_norm}, {&L.q, &L.gq}, {&L.k, &L.gk}, {&L.v, &L.gv}, {&L.o, &L.go},
        {&L.post_norm, &L.g_post_norm}, {&L.gate, &L.g_gate}, {&L.up, &L.g_up}, {&L.down, &L.g_down}};
    const char* names[] = {"input_layernorm.weight", "q_proj.weight", "k_proj.weight", "v_proj.weight",
                           "o_proj.weight", "post_attention_layernorm.weight", "gate_proj.weight", "up_proj.weight",
                           "down_proj.weight"};
    for (size_t k = 0; k < 9; ++k) {
      *slots[k].first = weight_of(names[k], i);
      *slots[k].second = grad_of(names[k], i);
    }
    const std::tuple<bool, const char*, Tensor*, Tensor*> biases[] = {
        {m_cfg.qkv_bias, "q_proj.bias", &L.q_b, &L.gq_b},       {m_cfg.qkv_bias, "k_proj.bias", &L.k_b, &L.gk_b},
        {m_cfg.qkv_bias, "v_proj.bias", &L.v_b, &L.gv_b},       {m_cfg.o_bias, "o_proj.bias", &L.o_b, &L.go_b},
        {m_cfg.mlp_bias, "gate_proj.bias", &L.gate_b, &L.g_gate_b}, {m_cfg.mlp_bias, "up_proj.bias", &L.up_b, &L.g_up_b},
        {m_cfg.mlp_bias, "down_proj.bias", &L.down_b, &L.g_down_b}};
    for (const auto& [has, name, w, g] : biases)
      if (has) {
        *w = weight_of(name, i);
        *g = grad_of(name, i);
      }
  }
  const bool backbone = m_cfg.family == Family::Mamba || m_cfg.family == Family::Mamba2;
  const char* embed = backbone ? "embeddings.weight" : "embed_tokens.weight";
  const char* final_norm = backbone ? "norm_f.weight" : "norm.weight";
  m_embed = weight_of(embed, -1);
  m_gembed = grad_of(embed, -1);
  m_final_norm = weight_of(final_norm, -1);
  m_gfinal_norm = grad_of(final_norm, -1);
  m_head = m_cfg.tie_embeddings ? m_embed : weight_of("lm_head.weight", -1);
  m_ghead = m_cfg.tie_embeddings ? m_gembed : grad_of("lm_head.weight", -1);
}

void TrainModel::zero_grads() {
  for (const Tensor& g : m_grads) m_be.fill(g, 0.0f);
}

void TrainModel::tp_sum(const Tensor& t, int layer, const char* site) {
  if (m_par.tp_size <= 1 || m_par.folded()) return;  // tsp: each rank's tokens are complete on it
  SiteScope s(m_be.recorder(), layer, site);
  m_par.tp->all_reduce(t);
}

// This rank's heads over one sequence's rows: its own keys, or (sequence
// parallel) every rank's, in rank order (the batch keeps them).
AttentionArgs TrainModel::attention_args(const TrainBatch& b) const {
  AttentionArgs a;
  a.n_heads = m_shard.heads;
  a.n_kv_heads = m_shard.kv_heads;
  a.head_dim = m_cfg.head_dim;
  a.scale = 1.0f / std::sqrt(float(m_cfg.head_dim));
  a.q_pos = b.positions;
  if (m_par.sp_size > 1 && b.gathered_positions.empty())
    for (int r = 0; r < m_par.sp_size; ++r) b.layout.append_positions(r, b.gathered_positions);
  a.k_pos = m_par.sp_size > 1 ? std::span<const int32_t>(b.gathered_positions) : std::span<const int32_t>(b.positions);
  return a;
}

std::vector<int32_t> TrainModel::row_positions(const TrainBatch& b) {
  std::vector<int32_t> out;
  for (int q = 0; q < b.sequences; ++q) out.insert(out.end(), b.positions.begin(), b.positions.end());
  return out;
}

// Before a layer's backward: what recomputation dropped, back (full: the whole forward again).
void TrainModel::recompute(int i, const TrainBatch& b, Saved& s) {
  if (m_rc == Recompute::None) return;
  const ModelConfig& c = m_cfg;
  const Layer& L = m_layers[size_t(i)];
  const int64_t R = s.x_in.rows(), d = c.d_model;
  const DType dt = c.dtype;
  SiteScope sc(m_be.recorder(), i, "recompute");
  if (m_rc == Recompute::Full) {
    Tensor out = act({R, d}, "residual.recomputed", c.residual_dtype());
    layer_forward(i, s.x_in, out, b, s, true);
    return;
  }
  switch (L.kind) {
    case LayerKind::Attention:
      s.h1 = act({R, d}, "attn.norm", dt);
      m_be.rmsnorm(s.h1, s.x_in, L.in_norm, c.norm_eps, d);
      s.h2 = act({R, d}, "mlp.norm", dt);
      m_be.rmsnorm(s.h2, s.x_mid, L.post_norm, c.norm_eps, d);
      s.a = act(s.g.shape(), "mlp.act", dt);
      m_be.silu_mul(s.a, s.g, s.u);
      break;
    case LayerKind::Mamba2: {
      const int64_t Di = s.ys.cols();
      s.h1 = act({R, d}, "mixer.norm", dt);
      m_be.rmsnorm(s.h1, s.x_in, L.norm, c.norm_eps, d);
      s.yn = act({R, Di}, "mixer.gated_norm", dt);
      m_be.gated_rmsnorm(s.yn, s.ys, s.zxbcdt.slice(1, 0, Di), L.gated_norm, c.norm_eps, Di / m_m2.groups);
      break;
    }
    case LayerKind::Mamba:
      s.h1 = act({R, d}, "mixer.norm", dt);
      m_be.rmsnorm(s.h1, s.x_in, L.norm, c.norm_eps, d);
      if (c.bcdt_rms) {
        const int64_t r = c.dt_rank, N = c.d_state;
        s.dbc_n = act(s.dbc.shape(), "mixer.bcdt_norm", dt);
        for (auto [c0, n] : {std::pair{int64_t(0), r}, std::pair{r, N}, std::pair{r + N, N}})
          m_be.rmsnorm(s.dbc_n.slice(1, c0, n), s.dbc.slice(1, c0, n), Tensor{}, c.mixer_rms_eps, n);
      }
      break;
  }
}

// Causal attention of each sequence's rows: over its own rows, or (sequence
// parallel) over the K/V of every rank of the group, all-gathered.
void TrainModel::attention(const Tensor& o, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                           const TrainBatch& b, int layer) {
  const int64_t Tl = int64_t(b.positions.size()), hkv = k.cols();
  const int S = m_par.sp_size;
  const AttentionArgs a = attention_args(b);
  Recorder& rec = m_be.recorder();
  for (int s = 0; s < b.sequences; ++s) {
    const Tensor qs = q.slice(0, s * Tl, Tl), ks = k.slice(0, s * Tl, Tl), vs = v.slice(0, s * Tl, Tl);
    const Tensor os = o.slice(0, s * Tl, Tl), ls = lse.slice(0, s * Tl, Tl);
    if (S == 1) {
      SiteScope sc(rec, layer, "attn.core");
      m_be.attention(os, qs, ks, vs, a, ls);
      continue;
    }
    Tensor k_all = m_be.alloc({S * Tl, hkv}, Category::CommBuffers, "attn.k_gathered", m_cfg.dtype);
    Tensor v_all = m_be.alloc({S * Tl, hkv}, Category::CommBuffers, "attn.v_gathered", m_cfg.dtype);
    {
      SiteScope sc(rec, layer, "attn.kv_all_gather");
      m_par.sp->all_gather(k_all, ks);
      m_par.sp->all_gather(v_all, vs);
    }
    SiteScope sc(rec, layer, "attn.core");
    m_be.attention(os, qs, k_all, v_all, a, ls);
  }
}

// Its backward: under sequence parallelism the K/V are gathered again, the
// gradient of every gathered row is computed from this rank's queries, and a
// reduce-scatter returns to each rank the sum over all queries for its rows.
void TrainModel::attention_grad(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                                const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                                const TrainBatch& b, int layer) {
  const int64_t Tl = int64_t(b.positions.size()), hkv = k.cols();
  const int S = m_par.sp_size;
  const AttentionArgs a = attention_args(b);
  Recorder& rec = m_be.recorder();
  for (int s = 0; s < b.sequences; ++s) {
    auto rows = [&](const Tensor& t) { return t.slice(0, s * Tl, Tl); };
    if (S == 1) {
      SiteScope sc(rec, layer, "attn.core_backward");
      m_be.attention_backward(rows(dq), rows(dk), rows(dv), rows(dout), rows(q), rows(k), rows(v), rows(o), rows(lse),
                              a);
      continue;
    }
    Tensor k_all = m_be.alloc({S * Tl, hkv}, Category::CommBuffers, "attn.k_gathered", m_cfg.dtype);
    Tensor v_all = m_be.alloc({S * Tl, hkv}, Category::CommBuffers, "attn.v_gathered", m_cfg.dtype);
    {
      SiteScope sc(rec, layer, "attn.kv_all_gather");
      m_par.sp->all_gather(k_all, rows(k));
      m_par.sp->all_gather(v_all, rows(v));
    }
    Tensor dk_all = m_be.alloc({S * Tl, hkv}, Category::CommBuffers, "attn.dk_gathered", m_cfg.dtype);
    Tensor dv_all = m_be.alloc({S * Tl, hkv}, Category::CommBuffers, "attn.dv_gathered", m_cfg.dtype);
    {
      SiteScope sc(rec, layer, "attn.core_backward");
      m_be.attention_backward(rows(dq), dk_all, dv_all, rows(dout), rows(q), k_all, v_all, rows(o), rows(lse), a);
    }
    SiteScope sc(rec, layer, "attn.dkv_reduce_scatter");
    m_par.sp->reduce_scatter(rows(dk), dk_all);
    m_par.sp->reduce_scatter(rows(dv), dv_all);
  }
}

// x_out = x_mid + mlp(norm(x_mid)), x_mid = x_in + attn(norm(x_in)). Under
// tensor parallelism o_proj and down_proj are row-parallel: their partial
// outputs are all-reduced over the tp group before the residual add.
void TrainModel::layer_forward(int i, const Tensor& x_in, const Tensor& x_out, const TrainBatch& b, Saved& s,
                               bool keep) {
  if (m_par.folded() && m_layers[size_t(i)].kind == LayerKind::Attention) return folded_forward(i, x_in, x_out, b, s, keep);
  switch (m_layers[size_t(i)].kind) {
    case LayerKind::Attention: attention_forward(i, x_in, x_out, b, s, keep); break;
    case LayerKind::Mamba2: mamba2_forward(i, x_in, x_out, b, s, keep); break;
    case LayerKind::Mamba: mamba_forward(i, x_in, x_out, b, s, keep); break;
  }
}

void TrainModel::layer_backward(int i, const Tensor& dx, const TrainBatch& b, Saved& s) {
  if (m_par.folded() && m_layers[size_t(i)].kind == LayerKind::Attention) return folded_backward(i, dx, b, s);
  switch (m_layers[size_t(i)].kind) {
    case LayerKind::Attention: attention_backward(i, dx, b, s); break;
    case LayerKind::Mamba2: mamba2_backward(i, dx, b, s); break;
    case LayerKind::Mamba: mamba_backward(i, dx, b, s); break;
  }
}

void TrainModel::project_out(int layer, const Tensor& out, const Tensor& in, const Tensor& w, const char* site) {
  SiteScope sc(m_be.recorder(), layer, site);
  if (m_par.tp_size <= 1) {
    m_be.matmul(out, in, w, true);
    return;
  }
  Tensor partial = m_be.alloc({out.rows(), out.cols()}, Category::CommBuffers, "partial", m_cfg.dtype);
  m_be.matmul(partial, in, w);
  m_par.tp->all_reduce(partial);
  m_be.add(out, out, partial);
}

void TrainModel::attention_forward(int i, const Tensor& x_in, const Tensor& x_out, const TrainBatch& b, Saved& s,
                                   bool keep) {
  const ModelConfig& c = m_cfg;
  const Layer& L = m_layers[size_t(i)];
  Recorder& rec = m_be.recorder();
  const int64_t R = x_in.rows(), d = c.d_model, hd = c.head_dim;
  const int64_t hq = m_shard.heads * hd, hkv = m_shard.kv_heads * hd, F = m_shard.ffn;
  const DType dt = c.dtype;
  const std::vector<int32_t> pos_rows = row_positions(b);
  s.x_in = x_in;
  s.h1 = act({R, d}, "attn.norm", dt);
  {
    SiteScope sc(rec, i, "attn.norm");
    m_be.rmsnorm(s.h1, x_in, L.in_norm, c.norm_eps, d);
  }
  s.q = act({R, hq}, "attn.q", dt);
  s.k = act({R, hkv}, "attn.k", dt);
  s.v = act({R, hkv}, "attn.v", dt);
  {
    SiteScope sc(rec, i, "attn.qkv");
    m_be.matmul(s.q, s.h1, L.q);
    m_be.matmul(s.k, s.h1, L.k);
    m_be.matmul(s.v, s.h1, L.v);
    add_bias(s.q, L.q_b);
    add_bias(s.k, L.k_b);
    add_bias(s.v, L.v_b);
  }
  {
    SiteScope sc(rec, i, "attn.rope");
    m_be.rope(s.q, m_shard.heads, int(hd), pos_rows, m_model.rope_freqs());
    m_be.rope(s.k, m_shard.kv_heads, int(hd), pos_rows, m_model.rope_freqs());
  }
  s.o = act({R, hq}, "attn.out", dt);
  s.lse = act({R, m_shard.heads}, "attn.lse", DType::F32);
  attention(s.o, s.lse, s.q, s.k, s.v, b, i);
  s.x_mid = act({R, d}, "residual.mid", c.residual_dtype());
  m_be.copy(s.x_mid, x_in);
  project_out(i, s.x_mid, s.o, L.o, "attn.o_proj");
  add_bias(s.x_mid, L.o_b);

  s.h2 = act({R, d}, "mlp.norm", dt);
  {
    SiteScope sc(rec, i, "mlp.norm");
    m_be.rmsnorm(s.h2, s.x_mid, L.post_norm, c.norm_eps, d);
  }
  s.g = act({R, F}, "mlp.gate", dt);
  s.u = act({R, F}, "mlp.up", dt);
  {
    SiteScope sc(rec, i, "mlp.gate_up");
    m_be.matmul(s.g, s.h2, L.gate);
    m_be.matmul(s.u, s.h2, L.up);
    add_bias(s.g, L.gate_b);
    add_bias(s.u, L.up_b);
  }
  s.a = act({R, F}, "mlp.act", dt);
  {
    SiteScope sc(rec, i, "mlp.act");
    m_be.silu_mul(s.a, s.g, s.u);
  }
  m_be.copy(x_out, s.x_mid);
  project_out(i, x_out, s.a, L.down, "mlp.down");
  add_bias(x_out, L.down_b);
  if (!keep) {
    const Tensor x = s.x_in;
    s = Saved{};
    s.x_in = x;
  } else if (m_rc == Recompute::Selective) {
    s.h1 = s.h2 = s.a = Tensor{};
  }
}

// On entry dx holds dL/dx_out; on return dL/dx_in. Weight gradients are added.
void TrainModel::attention_backward(int i, const Tensor& dx, const TrainBatch& b, Saved& s) {
  const ModelConfig& c = m_cfg;
  const Layer& L = m_layers[size_t(i)];
  Recorder& rec = m_be.recorder();
  const int64_t R = dx.rows(), d = c.d_model, hd = c.head_dim;
  const int64_t hq = m_shard.heads * hd, hkv = m_shard.kv_heads * hd, F = m_shard.ffn;
  const DType dt = c.dtype;
  const std::vector<int32_t> pos_rows = row_positions(b);
  recompute(i, b, s);
  // MLP: x_out = x_mid + down(silu(gate h2) * up h2).
  {
    Tensor dh2 = work({R, d}, "grad.mlp.norm", dt);
    {
      Tensor da = work({R, F}, "grad.mlp.act", dt);
      {
        SiteScope sc(rec, i, "mlp.down.backward");
        m_be.matmul_dx(da, dx, L.down, false);
        m_be.matmul_dw(L.g_down, dx, s.a, true);
        bias_backward(L.g_down_b, dx);
      }
      s.a = Tensor{};
      Tensor dg = work({R, F}, "grad.mlp.gate", dt), du = work({R, F}, "grad.mlp.up", dt);
      {
        SiteScope sc(rec, i, "mlp.act.backward");
        m_be.silu_mul_backward(dg, du, da, s.g, s.u);
      }
      da = Tensor{};
      s.g = s.u = Tensor{};
      SiteScope sc(rec, i, "mlp.gate_up.backward");
      bias_backward(L.g_gate_b, dg);
      bias_backward(L.g_up_b, du);
      m_be.matmul_dx(dh2, dg, L.gate, false);
      m_be.matmul_dx(dh2, du, L.up, true);
      m_be.matmul_dw(L.g_gate, dg, s.h2, true);
      m_be.matmul_dw(L.g_up, du, s.h2, true);
    }
    s.h2 = Tensor{};
    tp_sum(dh2, i, "mlp.grad_all_reduce");  // the conjugate of the column-parallel input's identity
    SiteScope sc(rec, i, "mlp.norm.backward");
    m_be.rmsnorm_backward(dx, L.g_post_norm, dh2, s.x_mid, L.post_norm, c.norm_eps, d);
  }
  s.x_mid = Tensor{};
  // Attention: x_mid = x_in + o_proj(attention(rope(q h1), rope(k h1), v h1)).
  Tensor dh1 = work({R, d}, "grad.attn.norm", dt);
  {
    Tensor dout = work({R, hq}, "grad.attn.out", dt);
    {
      SiteScope sc(rec, i, "attn.o_proj.backward");
      m_be.matmul_dx(dout, dx, L.o, false);
      m_be.matmul_dw(L.go, dx, s.o, true);
      bias_backward(L.go_b, dx);
    }
    Tensor dq = work({R, hq}, "grad.attn.q", dt), dk = work({R, hkv}, "grad.attn.k", dt),
           dv = work({R, hkv}, "grad.attn.v", dt);
    attention_grad(dq, dk, dv, dout, s.q, s.k, s.v, s.o, s.lse, b, i);
    dout = Tensor{};
    s.q = s.k = s.v = s.o = s.lse = Tensor{};
    {
      SiteScope sc(rec, i, "attn.rope.backward");
      m_be.rope_backward(dq, m_shard.heads, int(hd), pos_rows, m_model.rope_freqs());
      m_be.rope_backward(dk, m_shard.kv_heads, int(hd), pos_rows, m_model.rope_freqs());
    }
    SiteScope sc(rec, i, "attn.qkv.backward");
    bias_backward(L.gq_b, dq);
    bias_backward(L.gk_b, dk);
    bias_backward(L.gv_b, dv);
    m_be.matmul_dx(dh1, dq, L.q, false);
    m_be.matmul_dx(dh1, dk, L.k, true);
    m_be.matmul_dx(dh1, dv, L.v, true);
    m_be.matmul_dw(L.gq, dq, s.h1, true);
    m_be.matmul_dw(L.gk, dk, s.h1, true);
    m_be.matmul_dw(L.gv, dv, s.h1, true);
  }
  s.h1 = Tensor{};
  tp_sum(dh1, i, "attn.grad_all_reduce");
  SiteScope sc(rec, i, "attn.norm.backward");
  m_be.rmsnorm_backward(dx, L.g_in_norm, dh1, s.x_in, L.in_norm, c.norm_eps, d);
}


double TrainModel::forward_backward(const TrainBatch& b, float scale, const std::function<void(int)>& layer_done) {
  const ModelConfig& c = m_cfg;
  Recorder& rec = m_be.recorder();
  const int64_t R = int64_t(b.tokens.size()), d = c.d_model, V = c.vocab;
  if (R != int64_t(b.positions.size()) * b.sequences || b.targets.size() != b.tokens.size())
    throw std::logic_error("forward_backward: tokens, targets and positions disagree");
  m_nonfinite_layer = -2;
  rec.set_phase("forward");
  if (m_on_phase) m_on_phase("forward", rec.now());
  std::vector<Saved> saved(size_t(c.n_layers));
  Tensor x = act({R, d}, "residual", c.residual_dtype());
  {
    SiteScope sc(rec, -1, "embed");
    m_be.embedding(x, m_embed, b.tokens);
  }
  for (int i = 0; i < c.n_layers; ++i) {
    Tensor y = act({R, d}, "residual", c.residual_dtype());
    layer_forward(i, x, y, b, saved[size_t(i)], m_rc != Recompute::Full);
    x = y;
  }
  // The LM head and the loss, a block of rows at a time: only one
  // [rows, vocab] fp32 block of logits exists (about 16 MiB).
  Tensor hf = act({R, d}, "final_norm", c.dtype);
  {
    SiteScope sc(rec, -1, "final_norm");
    m_be.rmsnorm(hf, x, m_final_norm, c.norm_eps, d);
  }
  Tensor dhf = work({R, d}, "grad.final_norm", c.dtype);
  const int64_t block = std::max<int64_t>(1, std::min<int64_t>(R, (int64_t(16) << 20) / (4 * V)));
  double loss_sum = 0;
  {
    SiteScope sc(rec, -1, "lm_head.loss");
    Tensor logits = work({block, V}, "logits", DType::F32);
    Tensor loss = work({block}, "loss", DType::F32);
    Tensor dl16 = c.dtype == DType::F32 ? Tensor{} : work({block, V}, "grad.logits", c.dtype);
    std::vector<float> host(size_t(block), 0.0f);
    for (int64_t r0 = 0; r0 < R; r0 += block) {
      const int64_t n = std::min(block, R - r0);
      const Tensor lg = logits.slice(0, 0, n), h = hf.slice(0, r0, n);
      m_be.matmul(lg, h, m_head);
      m_be.cross_entropy(lg, loss.slice(0, 0, n), std::span<const int32_t>(b.targets).subspan(size_t(r0), size_t(n)),
                         scale);
      m_be.download(loss.slice(0, 0, n), host.data());
      for (int64_t k = 0; k < n; ++k) loss_sum += host[size_t(k)];
      // The logits' gradient in the compute dtype for the two GEMMs (as GPU frameworks keep it).
      Tensor dl = lg;
      if (dl16.defined()) {
        dl = dl16.slice(0, 0, n);
        m_be.copy(dl, lg);
      }
      m_be.matmul_dx(dhf.slice(0, r0, n), dl, m_head, false);
      m_be.matmul_dw(m_ghead, dl, h, true);
    }
  }
  // Ranks holding other tokens decide together, so that none enters
  // backward's collectives while another stops.
  const auto agreed_sum = [&](const Tensor& t) {
    if (m_agree) m_agree->all_reduce(t);
    std::vector<float> v(static_cast<size_t>(t.numel()), 0.0f);
    m_be.download(t, v.data());
    return v;
  };
  Tensor flag = work({1}, "nonfinite_loss", DType::F32);
  const float bad = std::isfinite(loss_sum) ? 0.0f : 1.0f;
  m_be.upload(flag, &bad, DType::F32);
  if (agreed_sum(flag)[0] > 0) {
    // Which layer's output first went non-finite, on any rank (-1: the
    // embeddings; n_layers: only the final norm or the head).
    Tensor counts = work({c.n_layers + 1}, "nonfinite_counts", DType::F32);
    m_be.fill(counts, 0.0f);
    for (int i = 0; i < c.n_layers; ++i) m_be.count_nonfinite(counts.slice(0, i, 1), saved[size_t(i)].x_in);
    m_be.count_nonfinite(counts.slice(0, c.n_layers, 1), x);
    const std::vector<float> n = agreed_sum(counts);
    m_nonfinite_layer = c.n_layers;
    for (int i = 0; i <= c.n_layers; ++i)
      if (n[size_t(i)] > 0) {
        m_nonfinite_layer = i - 1;  // input of layer i = output of layer i-1
        break;
      }
    return loss_sum;
  }
  rec.set_phase("backward");
  if (m_on_phase) m_on_phase("backward", rec.now());
  Tensor dx = work({R, d}, "grad.residual", c.residual_dtype());
  m_be.fill(dx, 0.0f);
  {
    SiteScope sc(rec, -1, "final_norm.backward");
    m_be.rmsnorm_backward(dx, m_gfinal_norm, dhf, x, m_final_norm, c.norm_eps, d);
  }
  hf = dhf = x = Tensor{};
  for (int i = c.n_layers - 1; i >= 0; --i) {
    layer_backward(i, dx, b, saved[size_t(i)]);
    saved[size_t(i)] = Saved{};
    if (layer_done) layer_done(i);
  }
  finish_ring();
  {
    SiteScope sc(rec, -1, "embed.backward");
    m_be.embedding_backward(m_gembed, dx, b.tokens);
  }
  if (layer_done) layer_done(-1);
  return loss_sum;
}

}  // namespace ss
