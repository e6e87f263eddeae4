// Transformer (Llama), Mamba, Falcon-Mamba, Mamba2 and the hybrid, written
// once against the Backend and the Communicator. A forward pass takes this
// rank's tokens at their positions, appends to the caches (KV cache,
// conv_state + ssm_state) and returns logits. Under a Parallel other than
// single, weights are this rank's shards and the blocks call the collectives
// their strategy needs (model/parallel.h; the design is in engine/README.md).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "comm/quantized_all_reduce.h"
#include "core/backend.h"
#include "model/config.h"
#include "model/parallel.h"
#include "model/weights.h"

namespace ss {

struct AttentionWeights {
  Tensor in_norm, q, k, v, o, post_norm, gate, up, down;
  Tensor q_b, k_b, v_b, o_b, gate_b, up_b, down_b;  // biases, where the config has them
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
  Tensor k, v;                   // [capacity, local kv_heads*head_dim] (attention layers)
  Tensor conv_state, ssm_state;  // Mamba layers: [d_conv-1, conv_dim], [heads, head_dim, d_state] or [d_inner, d_state]
};
struct Cache {
  std::vector<LayerCache> layers;
  std::vector<int32_t> positions;  // positions of the tokens whose K/V this rank holds, in order
  int64_t capacity = 0;
  int64_t length() const { return int64_t(positions.size()); }
};

// How the tokens of one forward are spread over the sequence-parallel group.
struct StepLayout {
  // Prefill under sp/tp_sp/tsp: each sp rank holds its own chunks of the
  // prompt; `chunks` lists every chunk in sequence order with its owner.
  bool sequence_sharded = false;
  std::vector<std::pair<Range, int>> chunks;
  // Decode under sp: every sp rank computes the token (redundantly), the
  // rank `kv_owner` stores its K/V, attention merges every rank's partial.
  int kv_owner = 0;

  // The positions of sp rank r's tokens, in its local order (its chunks in
  // sequence order). Appended to `out`, sized once: a 128K-token step asks
  // for 131,072 of them per layer.
  void append_positions(int r, std::vector<int32_t>& out) const;
  std::vector<int32_t> positions(int r) const {
    std::vector<int32_t> out;
    append_positions(r, out);
    return out;
  }
};

// Weights that travel together under tsp: one flat buffer per rank holding
// its shard of each member, broadcast in turns or passed around the ring.
struct WeightPack {
  int layer = -1;
  std::string name;             // attn.qkv, attn.o, mlp, mixer.in_proj, ...
  bool ring = false;            // ring (point-to-point) or broadcast turns
  std::vector<size_t> members;  // indices into the weight list
  int64_t numel = 0;            // of one shard
  Tensor flat;                  // this rank's shard
};

// One of this rank's sequence chunks: its index in sequence order, its first
// local row and its length.
struct LocalChunk {
  int seq = 0;
  int64_t row = 0, len = 0;
};

class Model {
 public:
  Model(ModelConfig cfg, Backend& be, Parallel par = {});

  const ModelConfig& config() const { return m_cfg; }
  std::span<const double> rope_freqs() const { return m_rope_freqs; }  // ModelConfig::rope_inv_freq
  const Parallel& parallel() const { return m_par; }
  const std::vector<WeightSpec>& weights() const { return m_specs; }
  const std::vector<WeightPack>& packs() const { return m_packs; }
  int64_t parameter_count() const;  // of the whole model
  int64_t local_parameter_count() const;  // held by this rank
  Backend& backend() { return m_be; }
  // Bytes the tensor-parallel all-reduces put on the wire so far, per site,
  // next to what fp32 and bf16 would have sent.
  const std::map<std::string, WireBytes>& wire() const { return m_wire; }
  // With Parallel::measure_sites: squared error and squared norm of each
  // (site, layer)'s quantized all-reduce output against the exact one.
  const std::map<std::pair<std::string, int>, std::pair<double, double>>& site_errors() const { return m_site_err; }

  // Allocates this rank's weights (category weights) and fills them from `src`.
  void load(TensorSource& src);
  // Caches for up to `max_tokens` tokens on this rank, zero-initialised.
  Cache make_cache(int64_t max_tokens);

  // Runs `tokens` at `positions` (this rank's part when layout.sequence_sharded).
  // Returns logits [T, vocab] when all_logits, else [1, vocab] for the last token.
  Tensor forward(std::span<const int32_t> tokens, std::span<const int32_t> positions, Cache& cache, bool all_logits,
                 const StepLayout& layout = {});

  // tsp: streams a pack, calling compute(shard index, member tensors of that
  // shard) for every shard with the next transfer in flight during compute
  // (training's forward uses it too); a pack's member views of a flat buffer.
  void stream_pack(const WeightPack& p, const std::function<void(int, const std::vector<Tensor>&)>& compute);
  std::vector<Tensor> pack_views(const WeightPack& p, const Tensor& flat) const;

 private:
  void build_specs();
  void build_packs();
  void attention_block(int layer, const Tensor& x, std::span<const int32_t> positions, Cache& cache,
                       const StepLayout& layout);
  void mlp_block(int layer, const Tensor& x);
  Tensor pre_norm(int layer, const Tensor& x, const Tensor& weight, const char* site);
  void bcdt_norm(int layer, const Tensor& dt_low, const Tensor& B, const Tensor& C);
  void mamba2_block(int layer, const Tensor& x, Cache& cache, const StepLayout& layout);
  void mamba_block(int layer, const Tensor& x, Cache& cache, const StepLayout& layout);
  // tsp (folded): the same blocks with every projection streamed shard by shard.
  void attention_block_folded(int layer, const Tensor& x, std::span<const int32_t> positions, Cache& cache,
                              const StepLayout& layout);
  void mlp_block_folded(int layer, const Tensor& x);
  void mamba2_block_folded(int layer, const Tensor& x, Cache& cache, const StepLayout& layout);
  void mamba_block_folded(int layer, const Tensor& x, Cache& cache, const StepLayout& layout);
  // Attention of q over this call's K/V (already in the cache where kept):
  // gathered over the sequence group in prefill, LSE-merged across it in decode.
  void attend(int layer, const Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v,
              std::span<const int32_t> positions, Cache& cache, const StepLayout& layout, int heads, int kv_heads);
  // Mamba2 mixing after in_proj: conv, SSD scan (with state passing when
  // sequence sharded), gated norm. Returns y [T, heads*head_dim].
  Tensor mamba2_mix(int layer, const Tensor& zxbcdt, Cache& cache, const StepLayout& layout, int heads, int groups,
                    const Mamba2Weights& w);
  // Mamba conv + selective scan (with state passing when sequence sharded).
  void mamba_conv(int layer, const Tensor& xc, const Tensor& xz, Cache& cache, const StepLayout& layout,
                  const MambaWeights& w);
  void mamba_scan(int layer, const Tensor& y, const Tensor& xc, const Tensor& dt, const Tensor& z, const Tensor& B,
                  const Tensor& C, Cache& cache, const StepLayout& layout, const MambaWeights& w);
  using ChunkScan = std::function<void(const LocalChunk&, const Tensor& state, const Tensor& decay)>;
  using ChunkCorrect = std::function<void(const LocalChunk&, const Tensor& incoming)>;
  using StateAdvance = std::function<void(const Tensor& incoming, const Tensor& state, const Tensor& decay)>;
  void pass_states(int layer, const StepLayout& layout, int64_t state_numel, int64_t decay_numel,
                   const Tensor& final_state, const ChunkScan& scan, const ChunkCorrect& correct,
                   const StateAdvance& advance);

  bool tp_active() const { return !m_par.folded() && m_par.tp_size > 1; }
  // y += b per row where the projection has a bias (b defined).
  void add_bias(const Tensor& y, const Tensor& b) {
    if (b.defined()) m_be.add_bias(y, b);
  }
  // Sums a row-parallel partial output over the tensor-parallel group into x,
  // at the precision the plan gives `site` (attn, mlp, mixer) of `layer`.
  void reduce_into(const Tensor& x, const Tensor& partial, const char* site, int layer);
  void project_out(int layer, const Tensor& x, const Tensor& in, const Tensor& w, const char* site,
                   const char* partial_name);
  // Conv over this rank's chunks with the halo of each chunk's predecessor;
  // `state` ends as the sequence's last d_conv-1 inputs (for decode).
  void sharded_conv(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& state,
                    const StepLayout& layout);

  ModelConfig m_cfg;
  std::vector<double> m_rope_freqs;
  Backend& m_be;
  Parallel m_par;
  Tensor m_embed, m_final_norm, m_lm_head;
  std::vector<LayerWeights> m_layers;
  std::vector<WeightSpec> m_specs;
  std::vector<WeightPack> m_packs;
  std::map<std::string, WireBytes> m_wire;
  std::map<std::pair<std::string, int>, std::pair<double, double>> m_site_err;
  uint64_t m_reduce_calls = 0;
  std::vector<std::vector<size_t>> m_layer_packs;  // pack indices per layer
  AttentionShard m_attn;
  Mamba2Shard m_m2;
  MambaShard m_m1;
};

}  // namespace ss
