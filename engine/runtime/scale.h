// `shardscope-engine scale`: where each strategy runs out of memory. For a
// model, a hardware profile and a device count it simulates every applicable
// strategy (single, dp, tp, sp, tp_sp over every mesh T x S = D, tsp) at each
// sequence length and micro-batch, in training (two steps: the second can
// hold more than the first; time, traffic and MFU are a step's) or inference
// (prefill + decode), and streams one `scale_point` per point: the peak the
// fullest device needs (simulated without a capacity limit), whether it fits
// the device, step time, throughput, MFU, communication by kind, and the
// closed-form terms of sim/textbook.h beside them. Every point is a whole
// `simulate` / `train --backend sim` run of the same engine code.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "protocol/events.h"

namespace ss {

struct ScaleOptions {
  std::string model = "llama2-7b";
  std::vector<std::string> overrides;
  std::string hardware = "mi300x";
  int devices = 8, nodes = 1;
  std::string mode = "train";            // train (two steps) | infer (prefill + decode)
  DType dtype = DType::BF16;
  std::string recompute = "none";        // training: none | selective | full
  std::vector<int64_t> seq_lens;         // empty: 4K, 8K, ... 1M
  std::vector<int> micro_batches = {1};  // sequences per micro-batch (per replica)
  std::vector<std::string> strategies;   // empty: all of them for the device count
  int decode = 1;                        // inference: decode steps after the prefill
  std::string attention = "gather";      // sequence-parallel attention: gather or ring
  bool search_micro_batch = true;        // training: the largest micro-batch that fits
  int jobs = 0;                          // points simulated at once (0: the cores)
  uint64_t seed = 0;
};

// One line of a sweep: a strategy, and its tp_sp mesh ("TxS") where it has one.
struct ScaleVariant {
  std::string strategy, mesh;
  int devices = 1, nodes = 1;
};
// The variants of a sweep over `devices` on `nodes` nodes: single on one
// device, and each requested strategy (tp_sp once per mesh with T, S > 1).
std::vector<ScaleVariant> scale_variants(const ScaleOptions& o);

// Validates the options (UsageError, one line) and writes the stream:
// hello, config, one scale_point per point as it finishes, metrics, done.
// Progress goes to `progress`; `table`, when given, gets the peaks as a
// table at the end. Returns the exit code.
int run_scale(const ScaleOptions& o, proto::Writer& out, std::ostream& progress, std::ostream* table = nullptr);

// The peaks of a sweep's points as a table: a row per strategy (and mesh),
// a column per length, one table per micro-batch (`scale`, `summarize`).
void print_scale_table(const std::vector<proto::ScalePoint>& points, std::ostream& os);

}  // namespace ss
