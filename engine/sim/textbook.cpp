#include "sim/textbook.h"

#include <algorithm>

namespace ss {
namespace {

// Parameters of one layer and of the ends (embedding, final norm, LM head).
int64_t layer_parameters(const ModelConfig& c, LayerKind kind) {
  const int64_t h = c.d_model;
  if (kind == LayerKind::Attention) {
    const int64_t hq = int64_t(c.n_heads) * c.head_dim, hkv = int64_t(c.n_kv_heads) * c.head_dim;
    const int64_t biases = (c.qkv_bias ? hq + 2 * hkv : 0) + (c.o_bias ? h : 0) + (c.mlp_bias ? 2 * c.ffn_dim + h : 0);
    return h * hq + 2 * h * hkv + hq * h + 3 * h * c.ffn_dim + 2 * h + biases;
  }
  const int64_t Di = c.d_inner, conv = c.conv_dim();
  int64_t p = h * c.in_proj_dim() + conv * c.d_conv + (c.conv_bias ? conv : 0) + Di * h + h;
  if (kind == LayerKind::Mamba)  // x_proj, dt_proj (+ bias), A_log, D
    p += Di * (c.dt_rank + 2 * int64_t(c.d_state)) + int64_t(c.dt_rank) * Di + Di + Di * c.d_state + Di;
  else  // dt_bias, A_log, D per head; the gated norm's weight
    p += 3 * int64_t(c.ssm_heads) + Di;
  return p;
}

// Bytes a layer keeps per token for its backward: `whole` is what tensor
// parallelism leaves unsharded (the block's norm inputs), `split` what it divides.
struct PerToken {
  double whole = 0, split = 0;
};
PerToken kept_per_token(const ModelConfig& c, LayerKind kind, const std::string& recompute) {
  const double b = double(dtype_size(c.dtype)), h = double(c.d_model);
  if (recompute == "full") return {h * double(dtype_size(c.residual_dtype())), 0};  // the layer's input only
  if (kind == LayerKind::Attention) {
    const double hq = double(c.n_heads) * c.head_dim, hkv = double(c.n_kv_heads) * c.head_dim;
    const double F = double(c.ffn_dim);
    // q, k, v, the attention output, fp32 lse per head; gate, up and their product.
    double split = b * (hq + 2 * hkv + hq + 3 * F) + 4.0 * c.n_heads;
    if (recompute == "selective") split -= b * F;  // silu(gate) * up is recomputed
    return {recompute == "selective" ? 0.0 : 2 * b * h, split};
  }
  // in_proj's output, the conv's output, the scan's output and the gated norm's.
  const double Di = double(c.d_inner);
  double split = b * (double(c.in_proj_dim()) + double(c.conv_dim()) + 2 * Di);
  if (recompute == "selective") split -= b * Di;  // the gated norm's output
  return {recompute == "selective" ? 0.0 : b * h, split};
}

// Bytes per token an inference forward holds at once inside a layer: the
// residual and its normed copy, then the larger of the two halves' tensors
// (attention: q, k, v and the output; MLP: gate and up), or a mixer's
// in_proj output and conv output.
PerToken working_per_token(const ModelConfig& c, LayerKind kind) {
  const double b = double(dtype_size(c.dtype)), h = double(c.d_model);
  if (kind == LayerKind::Attention) {
    const double hq = double(c.n_heads) * c.head_dim, hkv = double(c.n_kv_heads) * c.head_dim;
    return {2 * h * b, std::max(b * (2 * hq + 2 * hkv) + 4.0 * c.n_heads, 2 * b * double(c.ffn_dim))};
  }
  return {2 * h * b, b * double(c.in_proj_dim() + c.conv_dim())};
}

}  // namespace

nlohmann::json Textbook::to_json() const {
  return {{"parameters", parameters},
          {"bytes",
           {{"weights", weights},
            {"grads", grads},
            {"optimizer_state", optimizer_state},
            {"activations", activations},
            {"kv_cache", kv_cache},
            {"ssm_state", ssm_state}}},
          {"total_bytes", total()},
          {"comm_bytes", {{"activation", comm_activation}, {"weight", comm_weight}}}};
}

Textbook textbook(const ModelConfig& c, const TextbookCase& k) {
  Textbook t;
  const bool folded = k.strategy == Strategy::TSP;
  const int D = std::max(1, k.devices);
  // Weight shards (tp, tp_sp's T, tsp's D) and sequence shards (sp, tp_sp's S, tsp's D).
  const int W = folded ? D : k.strategy == Strategy::TP || k.strategy == Strategy::TPSP ? k.tp : 1;
  const int S = folded ? D : k.strategy == Strategy::SP || k.strategy == Strategy::TPSP ? k.sp : 1;
  const int Tw = folded ? 1 : W;  // activation channels divided by (tsp computes every channel)
  const double b = double(dtype_size(c.dtype)), kvb = double(dtype_size(c.kv_dtype)), h = double(c.d_model);
  // Training keeps the whole micro-batch; inference runs its sequences one
  // after another, holding one sequence's working set and caches at a time.
  const double sequences = k.train ? k.micro_batch : 1;
  const double tokens = double(k.seq_len) * sequences, local = tokens / S;
  auto ring = [](int n) { return n > 1 ? double(n - 1) / n : 0.0; };

  int64_t layers_params = 0;
  double kept = 0, largest_layer = 0, layer_comm_w = 0, layer_comm_a = 0, kv = 0, state = 0;
  for (int i = 0; i < c.n_layers; ++i) {
    const LayerKind kind = c.layer_kind(i);
    const int64_t p = layer_parameters(c, kind);
    layers_params += p;
    const PerToken keep = kept_per_token(c, kind, k.train ? k.recompute : "none");
    const PerToken all = k.train ? kept_per_token(c, kind, "none") : working_per_token(c, kind);
    kept += local * (keep.whole + keep.split / Tw);
    largest_layer = std::max(largest_layer, local * (all.whole + all.split / Tw));
    // Forward communication of the layer, per device.
    if (folded) layer_comm_w += double(p) * b * ring(D);  // every weight shard passes every rank
    if (kind == LayerKind::Attention) {
      const double hkv = double(c.n_kv_heads) * c.head_dim;
      if (W > 1 && !folded) layer_comm_a += 2 * 2 * ring(W) * local * h * b;  // o_proj and down all-reduces
      if (S > 1) layer_comm_a += ring(S) * tokens * 2 * hkv / Tw * b;        // K/V all-gather
      kv += 2 * local * hkv / Tw * kvb;
    } else {
      if (W > 1 && !folded) layer_comm_a += 2 * ring(W) * local * h * b;  // out_proj's all-reduce
      // The recurrent state, d_inner x d_state in fp32 (both Mamba generations), and the conv's tail.
      state += (double(c.d_inner) * c.d_state * 4 + double(c.d_conv - 1) * double(c.conv_dim()) * b) * sequences / Tw;
    }
  }
  const int64_t ends = c.vocab * c.d_model * (c.tie_embeddings ? 1 : 2) + c.d_model;
  t.parameters = layers_params + ends;
  const double P = double(t.parameters) / W;
  t.weights = int64_t(P * b);
  if (k.train) {
    t.grads = int64_t(P * 4);
    t.optimizer_state = int64_t(P * (c.dtype == DType::F32 ? 8 : 12));
    // Kept for every layer; full recomputation adds one layer's whole set while it is recomputed.
    t.activations = int64_t(kept + (k.recompute == "full" ? largest_layer : 0));
    // Backward: the activations' conjugate collectives move as much again;
    // tsp's weight shards pass again and their gradients travel back (3x);
    // replicated weights' gradients are summed over the sequence (or data) group.
    t.comm_activation = 2 * layer_comm_a;
    t.comm_weight = 3 * layer_comm_w;
    const int grad_group = k.strategy == Strategy::DP ? D : folded ? 1 : S;
    t.comm_weight += 2 * ring(grad_group) * P * 4;
  } else {
    t.activations = int64_t(largest_layer);  // one layer's working set at a time
    t.kv_cache = int64_t(kv);
    t.ssm_state = int64_t(state);
    t.comm_activation = layer_comm_a;
    t.comm_weight = layer_comm_w;
  }
  return t;
}

}  // namespace ss
