// The simulator's cost model. Kernels: a roofline over the profile's peak
// rates and memory bandwidth, with an efficiency curve for small GEMM shapes
// and a per-launch latency; where the profile holds measured kernel times (a
// calibrated profile: GEMMs by weight shape and rows, attention by queries and
// keys, elementwise kernels by rows and columns) the measured time at the
// kernel's size instead. Collectives: alpha-beta over the link class they
// cross (the collective's own alpha and beta when the profile measured them),
// for the algorithm that is fastest at that size (ring or tree).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/attention_run.h"
#include "sim/hardware.h"

namespace ss {

// Seconds for one kernel (op names as in Backend spans) whose arithmetic runs
// in `dtype` (the matmul rate of that dtype for GEMM-shaped kernels).
// An attention call with measured attention times is costed run by run when
// `runs` holds its query runs (core/backend.h), as one block of dims[0]
// queries at the end of dims[1] keys otherwise.
double kernel_seconds(const HardwareProfile& hw, const std::string& op, double flops, double bytes,
                      const std::vector<int64_t>& dims, DType dtype = DType::F32,
                      std::span<const AttentionRun> runs = {});

struct CollectiveCost {
  double seconds = 0;
  const char* algorithm = "ring";
};
// `bytes` is the whole buffer (all_gather: the gathered output), as in wire_bytes().
CollectiveCost collective_seconds(const LinkProfile& link, const std::string& op, double bytes, int ranks);

}  // namespace ss
