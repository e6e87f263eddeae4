// Host memory as the cpu backend's capacity: a cpu device (an MPI rank) has
// its share of what its host has available, as a GPU has its memory, so a
// setup that cannot fit is refused before it starts and an allocation past
// it is an `oom` error, never the kernel's OOM killer.
#pragma once

#include <cstdint>

#include "model/config.h"
#include "runtime/run.h"

namespace ss {

// Bytes this host has available now: $SHARDSCOPE_HOST_MEMORY when set (e.g.
// "8GiB", for a smaller share or a test), else MemAvailable of /proc/meminfo.
int64_t host_available_bytes();

// The weight bytes rank 0 holds (no rank holds more) for a setup, counted
// from the model's weight list in the run's dtype, without allocating.
int64_t weight_bytes_per_rank(const ModelConfig& cfg, const RunOptions& o);

// Refuses (UsageError, one line naming the bytes and what to change) a cpu
// setup whose weights alone exceed `available` shared by `ranks_here` ranks.
void check_host_memory(const ModelConfig& cfg, const RunOptions& o, int ranks_here,
                       int64_t available);

}  // namespace ss
