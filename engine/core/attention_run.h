// A run of an attention call's queries at consecutive increasing positions,
// with the keys visible to its last query and its visible (query, key) pairs.
// The cpu kernel tiles each run apart (zigzag's two chunks are two causal
// blocks, each with a diagonal of its own), so the simulator costs a call run
// by run from the times calibrate measured for contiguous causal blocks
// (Backend::attention_runs, sim/cost_model.h).
#pragma once

#include <cstdint>

namespace ss {

struct AttentionRun {
  int64_t queries = 0, keys = 0;
  double pairs = 0;
};

}  // namespace ss
