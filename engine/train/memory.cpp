#include "train/memory.h"

#include <algorithm>

namespace ss {

TrainMemory expected_train_memory(const Model& model, Recompute rc, int sequences, int64_t local_tokens) {
  const int64_t R = sequences * local_tokens;
  const ModelConfig& c = model.config();
  const Parallel& par = model.parallel();
  TrainMemory m;
  const int64_t b = dtype_size(c.dtype), rb = dtype_size(c.residual_dtype());
  const int64_t params = model.local_parameter_count();
  m.weights = params * b;
  m.grads = params * b;
  m.optimizer_state = params * (8 + (c.dtype == DType::F32 ? 0 : 4));  // two fp32 moments (+ fp32 master)

  const AttentionShard sh = attention_shard(c, par.shard_index(), par.shard_count());
  const int64_t d = c.d_model, hq = int64_t(sh.heads) * c.head_dim, hkv = int64_t(sh.kv_heads) * c.head_dim;
  const int64_t F = sh.ffn, L = c.n_layers;
  // Per layer, besides its output (the next layer's x_in):
  const int64_t norms = 2 * R * d * b;                      // h1, h2
  const int64_t act = R * F * b;                            // silu(g) u
  const int64_t full = norms + R * (hq + 2 * hkv) * b       // q, k, v
                       + R * hq * b + R * sh.heads * 4      // o, lse
                       + R * d * rb                         // x_mid
                       + 2 * R * F * b + act;               // g, u, a
  const int64_t selective = full - norms - act;
  const int64_t residuals = (1 + L) * R * d * rb;           // the embedding output and every layer's
  const int64_t head = R * d * b;                           // final norm output
  switch (rc) {
    case Recompute::None: m.activations = residuals + L * full + head; break;
    case Recompute::Selective: m.activations = residuals + (L - 1) * selective + full; break;
    case Recompute::Full: m.activations = residuals + full; break;
  }
  // Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
  // Transformer Models"), Table 2, GPT layer with tensor parallelism t, in
  // 2-byte activations: s b h (10 + 24/t + 5 a s / (h t)) without
  // recomputation, s b h (10 + 24/t) with selective recomputation, 2 s b h
  // with full. s b = this rank's rows, s for the a s term = the sequence's keys.
  const double t = double(std::max(1, par.tp_size)), h = double(d), a = double(c.n_heads);
  const double keys = double(local_tokens) * par.sp_size;
  const double per = double(R) * h;
  double layer = 0;
  switch (rc) {
    case Recompute::None: layer = per * (10 + 24 / t + 5 * a * keys / (h * t)); break;
    case Recompute::Selective: layer = per * (10 + 24 / t); break;
    case Recompute::Full: layer = 2 * per; break;
  }
  m.korthikanti = int64_t(layer * double(L) * double(b) / 2.0);
  return m;
}

}  // namespace ss
