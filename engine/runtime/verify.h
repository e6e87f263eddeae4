// `verify`: whether a run under its strategy computes what one device
// computes, on this machine, for the options given. The run as given (its
// strategy, devices and backend) and the same run on one cpu device, on the
// same weights and tokens, each keep every row's logits; decode is fed one
// device's greedy tokens in both (teacher forcing), so each decode row is
// compared in the same context. Then row by row, against the dtype's bound.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "protocol/events.h"
#include "runtime/run.h"

namespace ss {

// The bound on a row's relative L2 difference from one device: what the
// strategy tests hold every strategy to through four layers (1e-5 in fp32;
// 8 unit roundoffs of the coarser of the compute and KV dtypes in bf16 or
// fp16), growing with depth as independent roundings do.
double verify_bound(DType dtype, DType kv_dtype, int layers);

// Runs both, prints what they differ by, and returns 0 when every row is
// within the bound, 1 when one is not (or a run failed: its exit code).
// `stream`, where given, gets the same as events: a config with a `verify`
// object, each phase's worst row and largest difference, top-1 agreement,
// and done (an error `differs` first where a row is past the bound).
// Throws UsageError for what verify cannot compare.
int run_verify(const RunOptions& o, proto::Writer* stream, std::ostream& out);

}  // namespace ss
