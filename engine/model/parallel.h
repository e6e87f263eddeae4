// How one rank takes part in a model-parallel group: the strategy, the mesh,
// the communicators, and the data that describes sharding — which slice of
// each weight a rank holds and which tokens it owns. All multi-device setup
// lives here; a world of size one (`single`) needs no communicator at all.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/quantize.h"
#include "model/config.h"

namespace ss {

using Range = std::pair<int64_t, int64_t>;  // [begin, end)

enum class Strategy { Single, DP, TP, SP, TPSP, TSP };
Strategy parse_strategy(const std::string& name);  // throws UsageError listing the choices
std::string strategy_name(Strategy s);

struct Parallel {
  Strategy strategy = Strategy::Single;
  int world_rank = 0, world_size = 1;
  // Tensor-parallel axis (T ranks share each weight) and sequence-parallel
  // axis (S ranks share the tokens). tp: T = D; sp: S = D; tp_sp: T x S;
  // tsp folds both onto the same D ranks (T = S = D, one group).
  int tp_rank = 0, tp_size = 1;
  int sp_rank = 0, sp_size = 1;
  bool zigzag = true;           // sp token split: chunks {r, 2S-1-r}, else contiguous
  bool ring_attention = false;  // sp attention by K/V ring exchange instead of all-gather
  Communicator* world = nullptr;
  Communicator* tp = nullptr;   // ranks with the same sp_rank
  Communicator* sp = nullptr;   // ranks with the same tp_rank (tsp: the whole group)
  CommPrecision comm_precision;  // tensor-parallel all-reduce precision per site
  bool measure_sites = false;    // also reduce exactly and record each site's error

  bool folded() const { return strategy == Strategy::TSP; }
  // Weight shard count and index: the T axis, or all D ranks under tsp.
  int shard_count() const { return tp_size; }
  int shard_index() const { return tp_rank; }
};

// Token ranges of sp rank `r` for a prompt of `len` tokens over `s` ranks:
// zigzag gives chunks r and 2s-1-r of 2s equal chunks (balancing causal work);
// contiguous gives chunk r of s.
std::vector<Range> token_ranges(int64_t len, int s, int r, bool zigzag);
// All chunks in sequence order with their owner: (range, sp rank).
std::vector<std::pair<Range, int>> chunk_owners(int64_t len, int s, bool zigzag);

// The part of a weight a rank holds: ranges along `axis` (empty = the whole
// tensor, mirrored). Packed weights (Mamba2 in_proj) hold several ranges.
struct WeightSlice {
  int axis = -1;
  std::vector<Range> ranges;
  bool mirrored() const { return ranges.empty(); }
  int64_t extent() const;
};

// Local dimensions of a layer's shard on this rank.
struct AttentionShard {
  int heads = 0, kv_heads = 0;
  int64_t head0 = 0, kv_head0 = 0, ffn = 0, ffn0 = 0;
};
struct Mamba2Shard {
  int heads = 0, groups = 0;
  int64_t head0 = 0, group0 = 0;
  bool norm_spans_ranks = false;  // a gated-norm group is split over ranks (groups < T)
};
struct MambaShard {
  int64_t channels = 0, channel0 = 0;
};

AttentionShard attention_shard(const ModelConfig& c, int index, int count);
Mamba2Shard mamba2_shard(const ModelConfig& c, int index, int count);
MambaShard mamba_shard(const ModelConfig& c, int index, int count);

// Refuses shapes a strategy cannot split, before anything starts. Each
// message names the number to change. `prompt_len` 0 skips token checks.
// The names messages give the length and the batch: inference's options by
// default, training's (--seq-len, --micro-batch) when it validates, a scaling
// sweep's own terms ("the length", "micro-batch") for its points.
struct ShapeFlags {
  const char* length = "--prompt-len";
  const char* batch = "--batch";
  bool training = false;  // the device counts offered also meet training_split_problem's rule
};
// What training adds to a split over `shards` weight shards (Mamba2's
// n_groups a multiple of them); empty where there is nothing.
std::string training_split_problem(const ModelConfig& c, int shards);
void validate_parallel(const ModelConfig& c, Strategy s, int devices, int tp, int sp, int64_t prompt_len,
                       bool zigzag, int batch, const ShapeFlags& flags = {});

}  // namespace ss
