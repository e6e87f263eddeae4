// `shardscope-engine train`: training steps (forward, next-token
// cross-entropy, backward, gradient communication, clipping, AdamW) of a
// model under a strategy, on cpu ranks (MPI) or simulated devices, writing
// the event stream with `train_step` records.
#pragma once

#include <string>
#include <vector>

#include "runtime/launch.h"
#include "runtime/run.h"

namespace ss {

struct TrainOptions {
  // model, overrides, backend, strategy, devices, mesh, split, dtype, seed, capacity, threads
  RunOptions run;
  int64_t seq_len = 0;      // inputs per sequence (0 with --tokens: the sequence's length - 1)
  int micro_batch = 1;      // sequences per micro-batch per data-parallel replica
  int grad_accum = 1;       // micro-batches per step ...
  int global_batch = 0;     // ... or sequences per step (0: micro_batch x replicas x grad_accum)
  int steps = 1;
  double lr = 1e-3, min_lr_ratio = 0.1;  // cosine from lr to lr * ratio after the warmup
  int warmup = 0;           // steps of linear warmup
  int schedule_steps = 0;   // the schedule's length in steps (0: the last step of this run)
  double weight_decay = 0, clip = 1.0, beta1 = 0.9, beta2 = 0.95, adam_eps = 1e-8;
  std::string recompute = "none";   // none | selective | full
  std::string data = "synthetic";   // synthetic | FILE (bytes as tokens, or text with --tokenizer)
  std::string tokenizer;            // tokenizer.json: --data is text it encodes; copied into --save
  std::vector<int32_t> tokens;      // one explicit sequence instead of --data
  std::string save, resume, dump_grads;
  std::string hardware;             // sim backend: the profile
  int nodes = 1;
  bool check_only = false;          // validate and forecast the memory, start nothing (the explorer's check)
  double forecast_seconds = 0;      // with check_only: give up forecasting after this long (0: never)
};

// The options resolved and checked once (one line naming the number to
// change for what cannot run): inference's plan plus training's own.
enum class Recompute;
struct TrainPlan : RunPlan {
  Recompute recompute{};
  int replicas = 1, grad_accum = 1;  // data-parallel replicas; micro-batches per step
  // What encodes --data's text: --tokenizer (a tokenizer.json, or a folder
  // with one), else the model folder's own; empty: the file's bytes are the ids.
  std::filesystem::path tokenizer;
};
TrainPlan plan_training(const TrainOptions& o);

// One rank of a cpu run (the whole run when --devices 1); writes the stream on rank 0.
RunResult run_training(const TrainOptions& o, proto::Writer& out);
// The same on simulated devices of o.hardware.
RunResult simulate_training(const TrainOptions& o, proto::Writer& out);
// `train`: validates, then runs in-process (one device, or sim) or starts
// one MPI rank per device (`train-rank`) and forwards rank 0's stream.
int train_command(const TrainOptions& o, const LaunchOptions& l);

}  // namespace ss
