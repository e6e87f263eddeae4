// One inference run: load a model, prefill a prompt, decode greedily, and
// write the whole event stream (hello ... done). Shared by `run` and the tests.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"
#include "model/parallel.h"
#include "protocol/events.h"
#include "runtime/sampling.h"

namespace ss {

struct RunOptions {
  std::string model = "tiny-llama";      // preset name or HF model folder
  std::vector<std::string> overrides;    // config.json key=value
  std::string backend = "cpu";
  std::string strategy = "single";       // single, dp, tp, sp, tp_sp, tsp
  int devices = 1;                       // ranks of the model-parallel group (MPI processes)
  std::string mesh;                      // tp_sp: "TxS", e.g. 2x2
  std::string split = "zigzag";          // sequence split: zigzag or contiguous
  std::string attention = "gather";      // sequence-parallel attention: gather (K/V all-gather) or ring
  int batch = 1;                         // sequences (dp splits them over devices)
  DType dtype = DType::F32;              // compute dtype: weights, activations, communicated tensors
  std::optional<DType> kv_dtype;         // the KV cache's (default: the compute dtype)
  std::string comm_precision;            // tensor-parallel all-reduce precision per site (comm/quantize.h)
  bool measure_sites = false;            // record each quantized site's error against an exact reduction
  bool no_cache = false;                 // decode by recomputing the whole prefix each step
  bool warm_start = false;               // an untimed prefill and decode step of the same shapes first
  std::vector<int32_t> force_decode;     // feed these tokens in decode instead of the greedy ones
  int64_t prompt_len = 0;                // synthetic prompt of this length ...
  std::vector<int32_t> tokens;           // ... or these tokens
  std::optional<std::string> prompt;     // the text --tokens was encoded from (runtime/prompt.h)
  int64_t window = 0;                    // > 0: --tokens are consecutive sequences of this many (a batch)
  int decode = 0;                        // decode steps after the prompt
  Sampling sampling;                     // how decode picks tokens (default greedy)
  uint64_t seed = 0;                     // synthetic weights and prompt, and the sampler's draws
  int64_t capacity = 0;                  // bytes per device; 0 = unlimited
  std::string logits_out;                // .npy of [prompt + decoded, vocab]
  bool keep_all_logits = false;          // every row's logits, as --logits-out keeps them, unwritten (a forecast)
  int threads = 0;                       // 0 = all cores
  // Spans and memory samples. Off: summary records only (peaks), and on the
  // sim backend untimed: the ranks' collectives do not wait for each other,
  // so the times mean nothing, while what each rank allocates, in its own
  // order, and so its peak, is the same (scale's micro-batch search).
  bool timeline = true;
  // What a refused shape's message calls the length and the batch (unset:
  // the command's own options; a scaling sweep's points: its terms).
  std::optional<ShapeFlags> shape_names;
};

inline DType cache_dtype(const RunOptions& o) { return o.kv_dtype.value_or(o.dtype); }

struct RunResult {
  int exit_code = 0;
  std::string status;             // ok | oom | failed
  std::string error;              // one line when not ok
  std::string error_code;         // usage, format, oom, internal
  int rank = 0;                   // the rank that reports
  std::vector<int32_t> generated; // the decoded tokens
  double ttft_s = 0, prefill_s = 0, decode_s = 0;
  int64_t peak_bytes = 0;
};

// Refuses (UsageError) a --tokens id outside [0, vocab).
void check_token_ids(const std::vector<int32_t>& tokens, int64_t vocab);
// The prompt a run uses: the given tokens, or prompt_len tokens drawn from the seed.
std::vector<int32_t> make_prompt(const RunOptions& o, int64_t vocab);

// Validates the options that need no model (throws UsageError with one line
// saying what to change). Shapes are checked by validate_parallel once the
// model is known; `launch` runs both before starting any rank.
void validate(const RunOptions& o, const std::string& backend = "cpu");
// Parses --mesh for the strategy: (T, S) with T*S = devices.
std::pair<int, int> mesh_of(const RunOptions& o);
// Whether the strategy all-reduces over a tensor-parallel group (what
// --comm-precision quantizes): tp, or tp_sp with T > 1.
bool has_tp_all_reduces(const RunOptions& o);

// A run's options resolved and checked once, before anything starts: what
// check, launch, simulate and every rank work from (training's TrainPlan
// adds its own). Building it refuses, with one line, what cannot run.
struct RunPlan {
  Strategy strategy = Strategy::Single;
  int devices = 1, tp = 1, sp = 1;  // the mesh (tsp: tp = sp = devices)
  bool zigzag = true;
  ModelConfig cfg;                  // the model, with the run's dtypes
  std::filesystem::path dir;        // its checkpoint folder; empty: synthetic weights
  int64_t tokens = 0;               // of the prompt (inference) or a sequence (training)
};
// Inference's plan: the options' checks, the model, the mesh and the shapes.
RunPlan plan_inference(const RunOptions& o, const std::string& backend);

RunResult run_inference(const RunOptions& o, proto::Writer& out);

// The same run on the sim backend: one thread per rank on virtual devices of
// `hw`, `nodes` nodes; writes the same event stream with "backend":"sim".
struct HardwareProfile;
// `replicas` data-parallel copies of the group are reported (throughput, the
// traffic they add) without being simulated one by one.
RunResult simulate(const RunOptions& o, const HardwareProfile& hw, int nodes, int replicas, proto::Writer& out);
// Refuses a --nodes that is not a positive divisor of --devices.
void check_nodes(int nodes, int devices);

// Peak and current resident set of this process, in bytes (from /proc/self/status).
int64_t peak_rss_bytes();
int64_t current_rss_bytes();

std::string engine_version();
std::string host_name();

// The command line the user gave (after the program name, less --events and
// its file), which every config records as `command`: the explorer refills
// its form from a stream's. Set once at start; what this process starts
// (launch's and train's ranks, verify's runs) inherits it through
// SHARDSCOPE_COMMAND (taken only from an ancestor process,
// SHARDSCOPE_COMMAND_PID) and records the user's command, not its own.
void set_invocation(int argc, char** argv);
const nlohmann::json& invocation();

}  // namespace ss
