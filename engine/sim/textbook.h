// Closed-form memory and communication of a strategy, per device: the
// analysis one does on paper, set beside what the simulator's exact
// accounting reports (`scale`, the explorer's scaling page), so a reader sees
// where the two part and why.
//
// The traffic terms follow the schedules the TSP paper describes (weight
// shards broadcast for attention and circulated on a ring for the MLP, K/V
// gathered along the sequence), derived here rather than taken from the
// paper's own formulas. Per-parameter terms are exact for the layer list; activation terms count,
// per token and layer, the tensors a block keeps for its backward
// (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
// Transformer Models", without dropout masks and with a fused attention that
// keeps the log-sum-exp instead of the s x s scores), sharded the way each
// strategy shards them:
//   single, dp   every token, every channel
//   tp (T = D)   every token; channels / T, the two norm inputs whole
//   sp (S = D)   tokens / S, every channel
//   tp_sp (TxS)  tokens / S; channels / T, the norm inputs whole
//   tsp (D)      tokens / D, every channel (weights circulate; each rank
//                computes its own tokens through all of them)
// Inference keeps nothing for a backward: its activation term is one layer's
// working set (the residual, its normed copy, and the larger half of the
// block), plus the KV cache and the SSM state cache, of one sequence (a
// micro-batch's sequences run one after another).
// Weights, gradients (fp32) and AdamW state (two fp32 moments, plus an fp32
// master copy when the dtype is not fp32) are divided by the weight shard
// count (tp: D, tp_sp: T, tsp: D; others keep the whole model).
//
// What the formula leaves out, and the engine counts: norms and biases kept
// whole on every rank, the embedding and LM head (their logits are fp32),
// communication buffers (gathered K/V, ring slots), workspace, the residual
// stream in fp32 for SSM families, recomputation's transient peak (one
// layer's full set on top of what is kept), and the transients of whichever
// moment is the peak. Communication is per device per step, ring algorithms
// ((n-1)/n of the data through each device, twice for an all-reduce).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/parallel.h"

namespace ss {

struct TextbookCase {
  Strategy strategy = Strategy::Single;
  int devices = 1, tp = 1, sp = 1;  // tsp: tp = sp = devices
  int64_t seq_len = 0;
  int micro_batch = 1;
  bool train = true;
  std::string recompute = "none";   // none | selective | full (training)
};

struct Textbook {
  int64_t parameters = 0;  // of the layer list (embeddings and LM head included)
  int64_t weights = 0, grads = 0, optimizer_state = 0, activations = 0, kv_cache = 0, ssm_state = 0;
  double comm_activation = 0, comm_weight = 0;  // bytes per device per step
  int64_t total() const { return weights + grads + optimizer_state + activations + kv_cache + ssm_state; }
  nlohmann::json to_json() const;
};

Textbook textbook(const ModelConfig& cfg, const TextbookCase& c);

}  // namespace ss
