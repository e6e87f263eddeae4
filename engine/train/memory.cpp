#include "train/memory.h"

#include <algorithm>
#include <vector>

namespace ss {

TrainMemory expected_train_memory(const Model& model, Recompute rc, int sequences, int64_t local_tokens,
                                  int b_chunks) {
  const int64_t R = sequences * local_tokens;
  const ModelConfig& c = model.config();
  const Parallel& par = model.parallel();
  TrainMemory m;
  const int64_t b = dtype_size(c.dtype), rb = dtype_size(c.residual_dtype());
  const int64_t params = model.local_parameter_count();
  m.weights = params * b;
  m.grads = params * 4;  // fp32 whatever the compute dtype
  m.optimizer_state = params * (8 + (c.dtype == DType::F32 ? 0 : 4));  // two fp32 moments (+ fp32 master)

  // What each layer keeps (`kept`, by recomputation mode) and holds at its
  // forward's peak (`full`), besides its output; train_model.cpp and
  // mamba2_train.cpp list the tensors.
  const int64_t d = c.d_model, L = c.n_layers;
  // Each rank computes its tokens with every head and channel under tsp; its own shard otherwise.
  const int index = par.folded() ? 0 : par.shard_index(), count = par.folded() ? 1 : par.shard_count();
  std::vector<int64_t> full(static_cast<size_t>(L)), kept(static_cast<size_t>(L));
  for (int i = 0; i < c.n_layers; ++i) {
    if (c.layer_kind(i) == LayerKind::Attention) {
      const AttentionShard sh = attention_shard(c, index, count);
      const int64_t hq = int64_t(sh.heads) * c.head_dim, hkv = int64_t(sh.kv_heads) * c.head_dim, F = sh.ffn;
      const int64_t norms = 2 * R * d * b, act = R * F * b;  // h1, h2; silu(g) u
      full[size_t(i)] = norms + R * (hq + 2 * hkv) * b + R * hq * b + R * sh.heads * 4 + R * d * rb + 2 * R * F * b + act;
      kept[size_t(i)] = rc == Recompute::Selective ? full[size_t(i)] - norms - act : full[size_t(i)];
    } else if (c.layer_kind(i) == LayerKind::Mamba) {
      const int64_t Di = mamba_shard(c, index, count).channels, x = c.dt_rank + 2 * c.d_state;
      const int64_t h = R * d * b, normed = c.bcdt_rms ? R * x * b : 0;
      full[size_t(i)] = h + 2 * R * Di * b + 3 * R * Di * b + R * x * b + normed;
      kept[size_t(i)] = rc == Recompute::Selective ? full[size_t(i)] - h - normed : full[size_t(i)];
    } else {
      const Mamba2Shard m2 = mamba2_shard(c, index, count);
      const int64_t Di = int64_t(m2.heads) * c.ssm_head_dim, GN = int64_t(m2.groups) * c.d_state;
      const int64_t h = R * d * b, yn = R * Di * b;
      full[size_t(i)] = h + R * (2 * Di + 2 * GN + m2.heads) * b + R * (Di + 2 * GN) * b + R * Di * b + yn;
      kept[size_t(i)] = rc == Recompute::Selective ? full[size_t(i)] - h - yn : full[size_t(i)];
    }
    // Sequence parallel SSM layers also keep, per sequence and local chunk,
    // the conv halo (d_conv-1 rows), the state entering the chunk and its decay (fp32).
    if (c.layer_kind(i) != LayerKind::Attention && par.sp_size > 1) {
      const int64_t chunks = int64_t(b_chunks), K1 = c.d_conv - 1;
      int64_t conv = 0, state = 0, decay = 0;
      if (c.layer_kind(i) == LayerKind::Mamba2) {
        const Mamba2Shard m2 = mamba2_shard(c, index, count);
        conv = int64_t(m2.heads) * c.ssm_head_dim + 2 * int64_t(m2.groups) * c.d_state;
        state = int64_t(m2.heads) * c.ssm_head_dim * c.d_state;
        decay = m2.heads;
      } else {
        conv = mamba_shard(c, index, count).channels;
        state = conv * c.d_state;
        decay = conv;
      }
      const int64_t extra = sequences * chunks * (K1 * conv * b + (state + decay) * 4);
      full[size_t(i)] += extra;
      kept[size_t(i)] += extra;
    }
    if (rc == Recompute::Full) kept[size_t(i)] = 0;
  }
  // The forward holds the embedding output, every layer's output so far and
  // the kept tensors of the layers before; the peak is reached inside some
  // layer's forward, or at the end with the final norm's output. (Backward,
  // recomputing a layer, holds no more than its forward did.)
  const int64_t y = R * d * rb, head = R * d * b;
  int64_t before = 0;
  for (int i = 0; i < c.n_layers; ++i) {
    m.activations = std::max(m.activations, y + (i + 1) * y + before + full[size_t(i)]);
    before += kept[size_t(i)];
  }
  m.activations = std::max(m.activations, y + L * y + before + head);
  // Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
  // Transformer Models"), Table 2, GPT layer with tensor parallelism t, in
  // 2-byte activations: s b h (10 + 24/t + 5 a s / (h t)) without
  // recomputation, s b h (10 + 24/t) with selective recomputation, 2 s b h
  // with full. s b = this rank's rows, s for the a s term = the sequence's
  // keys; attention layers only.
  const double t = double(std::max(1, par.tp_size)), h = double(d), a = double(std::max(1, c.n_heads));
  const double keys = double(local_tokens) * par.sp_size;
  const double per = double(R) * h;
  double layer = 0;
  switch (rc) {
    case Recompute::None: layer = per * (10 + 24 / t + 5 * a * keys / (h * t)); break;
    case Recompute::Selective: layer = per * (10 + 24 / t); break;
    case Recompute::Full: layer = 2 * per; break;
  }
  int attention_layers = 0;  // the form is a transformer layer's: SSM layers are not counted
  for (int i = 0; i < c.n_layers; ++i) attention_layers += c.layer_kind(i) == LayerKind::Attention;
  m.korthikanti = int64_t(layer * attention_layers * double(b) / 2.0);
  return m;
}

}  // namespace ss
