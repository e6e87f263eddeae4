// `verify`: whether a run under its strategy computes what one device
// computes, on this machine, for the options given; `train --verify`: whether
// it trains as one device does. The run as given (its
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
#include "runtime/train.h"

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

// `train --verify`: the training run as given and one cpu device fed the same
// sequences in one micro-batch, each dumping step 1's gradient. Step 1's loss
// and gradient norm are held to verify_bound of the dtype. Each gradient
// tensor: in fp32, to the fp32 bound; in bf16 (where a gradient summing terms
// that cancel is far from the exact one on any device), one cpu device's
// fp32 gradient runs too, and the run may be at most 4 times as far from it
// as one bf16 device is (plus the fp32 bound). Later steps' losses are
// reported, not bounded. Returns as run_verify; the stream's config carries
// `verify.train`, its accuracy records `grad_rel_l2` per tensor.
int run_train_verify(const TrainOptions& o, proto::Writer* stream, std::ostream& out);

}  // namespace ss
