// Closed-form training memory per rank and category, from the shapes alone
// (no allocator): what the tests compare the measured peaks with, and what
// the Summary sets beside Korthikanti et al. (2022)'s activation formula.
#pragma once

#include <cstdint>

#include "train/train_model.h"

namespace ss {

struct TrainMemory {
  int64_t weights = 0, grads = 0, optimizer_state = 0;
  int64_t activations = 0;  // the peak of what train_model.cpp keeps (its header lists it)
  int64_t korthikanti = 0;  // Korthikanti et al. (2022), Table 2, scaled to the dtype's bytes
};

// For micro-batches of `sequences` sequences of which this rank holds
// `local_tokens` each, in `chunks` chunks (sequence parallelism: 2 zigzag or 1 contiguous).
TrainMemory expected_train_memory(const Model& model, Recompute rc, int sequences, int64_t local_tokens, int chunks);

}  // namespace ss
