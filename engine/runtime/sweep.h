// `shardscope-engine sweep`: the accuracy/wire trade-off of quantized
// all-reduces. Runs the same configuration unquantized and at every point of
// a grid (precision x block size x site), each as a real multi-rank run, and
// writes one stream of `accuracy` records (per point: wire bytes, logits KL,
// top-1 agreement over all positions and over the positions the reference
// decides at bf16 resolution, first greedy divergence, perplexity, each
// site's error; for the reference: positions, tied positions, mean entropy)
// with a printed summary: the trade-off table, the Pareto front, and the
// per-site sensitivity ranking.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "runtime/run.h"

namespace ss {

struct SweepOptions {
  RunOptions run;                  // model, strategy, devices, workload
  std::vector<std::string> run_args;  // the same, as command-line arguments for each rank run
  std::vector<std::string> precisions = {"bf16", "fp16", "fp8", "int8", "int4"};
  std::vector<std::string> blocks = {"32", "128", "1024"};  // values per scale, or "tensor"
  std::vector<std::string> sites = {"all", "attn", "mlp", "mixer"};
  bool per_layer = false;          // also quantize one layer at a time (sensitivity by layer)
  std::string rounding = "rn";     // rn or sr
  std::string eval_tokens;         // file of token ids: perplexity over them
  std::string eval_text;           // text (or "heldout"), encoded by the model's tokenizer, scored in windows
  int eval_windows = 16;           // ... this many
  int64_t eval_window = 256;       // ... of this many tokens
  std::string events;              // stream destination ("" = stdout)
};

// Without a prompt, a model folder with a tokenizer is scored on --eval-text heldout.
int run_sweep(const SweepOptions& o, std::ostream& table);

}  // namespace ss
