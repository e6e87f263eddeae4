// shardscope-engine: the worker the explorer launches, and a tool on its own.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <utility>

#include "cli/text_commands.h"
#include "cli/token_ids.h"
#include "core/error.h"
#include "cuda/bench.h"
#include "cuda/cuda_backend.h"
#include "cuda/staged_communicator.h"
#ifdef SHARDSCOPE_EMU_NCCL
#include "cuda/nccl_communicator.h"
#endif
#include "io/checkpoint.h"
#include "model/config.h"
#include "runtime/bench.h"
#include "runtime/bench_parallel.h"
#include "runtime/bench_train.h"
#include "runtime/calibrate.h"
#include "runtime/heartbeat.h"
#include "runtime/forecast.h"
#include "runtime/host_memory.h"
#include "runtime/launch.h"
#include "runtime/prompt.h"
#include "runtime/rank.h"
#include "runtime/run.h"
#include "runtime/scale.h"
#include "runtime/summary.h"
#include "runtime/sweep.h"
#include "runtime/verify.h"
#include "runtime/train.h"
#include "model/parallel.h"
#include "sim/hardware.h"
#include <fstream>
#include <optional>

namespace {

std::vector<int32_t> parse_tokens(const std::string& s) { return ss::parse_token_ids(s, "--tokens"); }

// What add_model_options left as text, once the command is known: --tokens'
// ids, --prompt encoded to them, --capacity's bytes.
void complete_run_options(ss::RunOptions& o, const std::string& tokens, const std::string& capacity) {
  if (!tokens.empty()) o.tokens = parse_tokens(tokens);
  ss::encode_prompt(o);
  if (!capacity.empty()) o.capacity = ss::parse_bytes(capacity);
}

// Where --events sends a stream: stdout for "" or "-", else the file, created.
std::FILE* open_events(const std::string& path) {
  if (path.empty() || path == "-") return stdout;
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw ss::UsageError("--events " + path + ": cannot create the file");
  return f;
}

// --dtype and --kv-dtype: checked by CLI11 (a bad name is one line, exit 2), then parsed once.
const CLI::Validator& dtype_check() {
  static const CLI::Validator v(
      [](std::string& s) {
        try {
          ss::parse_compute_dtype(s, "");  // CLI11 names the option
          return std::string();
        } catch (const std::exception& e) {
          return std::string(e.what());
        }
      },
      "fp32|bf16|fp16");
  return v;
}

void add_dtype_options(CLI::App* cmd, ss::DType& dtype, std::optional<ss::DType>* kv_dtype) {
  cmd->add_option_function<std::string>(
         "--dtype", [&dtype](const std::string& s) { dtype = ss::parse_compute_dtype(s); },
         "compute dtype of weights, activations and communication: fp32, bf16 or fp16 (default fp32); "
         "GEMMs accumulate, softmax/norm statistics and SSM states stay in fp32")
      ->check(dtype_check());
  if (kv_dtype)
    cmd->add_option_function<std::string>(
           "--kv-dtype", [kv_dtype](const std::string& s) { *kv_dtype = ss::parse_compute_dtype(s, "--kv-dtype"); },
           "dtype of the KV cache (default: --dtype)")
        ->check(dtype_check());
}

void add_model_options(CLI::App* cmd, ss::RunOptions& o, std::string& tokens, std::string& capacity) {
  cmd->add_option("--model", o.model, "preset name (see `presets`) or a Hugging Face model folder")->capture_default_str();
  cmd->add_option("--set", o.overrides, "override a config.json field, e.g. --set hidden_size=512 (repeatable)");
  cmd->add_option("--backend", o.backend, "cpu (one MPI rank per device) or cuda (a process per rank on its GPU, NCCL between GPUs)")
      ->capture_default_str();
  cmd->add_option("--strategy", o.strategy, "single, dp, tp, sp, tp_sp or tsp")->capture_default_str();
  cmd->add_option("--devices", o.devices, "devices (MPI ranks) of the run")->capture_default_str();
  cmd->add_option("--mesh", o.mesh, "tp_sp mesh TxS, e.g. 2x2");
  cmd->add_option("--split", o.split, "sequence split for sp/tp_sp/tsp: zigzag or contiguous")->capture_default_str();
  add_dtype_options(cmd, o.dtype, &o.kv_dtype);
  cmd->add_option("--comm-precision", o.comm_precision,
                  "tensor-parallel all-reduce precision: SPEC or site[@a-b]=SPEC,... (sites attn, mlp, mixer; SPEC "
                  "fp32, bf16, fp16, int8[:B][:sr], int4[:B][:sr], fp8[:B][:sr])");
  cmd->add_flag("--measure-sites", o.measure_sites, "record each quantized site's error against an exact reduction");
  cmd->add_flag("--no-cache", o.no_cache, "decode by recomputing the prefix every step (to measure the cache)");
  cmd->add_flag("--warm-start", o.warm_start,
                "first an untimed prefill and decode step of the same shapes, as a server warms up before its first "
                "request: the timed run then finds its buffers allocated and their pages faulted in");
  cmd->add_option("--force-decode", o.force_decode, "feed these token ids in decode instead of the greedy ones")
      ->delimiter(',');
  cmd->add_option("--attention", o.attention, "sequence-parallel attention: gather (K/V all-gather) or ring")
      ->capture_default_str();
  cmd->add_option("--batch", o.batch, "sequences (dp gives each device its own)")->capture_default_str();
  cmd->add_option("--prompt-len", o.prompt_len, "synthetic prompt length (tokens drawn from --seed)");
  cmd->add_option("--tokens", tokens, "explicit prompt token ids, comma separated");
  cmd->add_option("--prompt", o.prompt, "the prompt as text, encoded by the model folder's tokenizer.json");
  cmd->add_option("--window", o.window, "score the prompt as consecutive sequences of N tokens (teacher-forced; "
                                        "with --logits-out), run one after another");
  cmd->add_option("--decode", o.decode, "decode steps after the prompt")->capture_default_str();
  cmd->add_option("--temperature", o.sampling.temperature,
                  "sample decoded tokens from softmax(logits / T) (0: greedy)")->capture_default_str();
  cmd->add_option("--top-k", o.sampling.top_k, "sample among the K most likely tokens only (0: all)")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "seed of synthetic weights and prompt, and of sampling")->capture_default_str();
  cmd->add_option("--capacity", capacity, "memory per device, e.g. 2GiB (over it: an oom error event)");
  cmd->add_option("--logits-out", o.logits_out, "write float32 .npy [prompt+decoded, vocab]: row i = logits after token i");
  cmd->add_option("--threads", o.threads, "threads for kernels and OpenBLAS (0 = all cores)")->capture_default_str();
}

// What every rank of `launch` or `train` gets: the command's options, less
// those the launcher keeps (--events, --hostfile, --timeout, --rank-timeout, --check-only).
std::vector<std::string> rank_arguments(int argc, char** argv, const std::string& command) {
  std::vector<std::string> out;
  int at = 1;
  while (at < argc && std::string(argv[at]) != command) ++at;
  for (int i = at + 1; i < argc; ++i) {
    const std::string a = argv[i];
    bool own = false, own_eq = false;
    for (const char* kept : {"--events", "--hostfile", "--timeout", "--rank-timeout"}) {
      own = own || a == kept;
      own_eq = own_eq || a.rfind(std::string(kept) + "=", 0) == 0;
    }
    if (own) ++i;
    else if (!own_eq && a != "--check-only") out.push_back(a);
  }
  return out;
}

// `train` and `train-rank` (what each rank of a multi-device `train` runs).
void add_train_options(CLI::App* cmd, ss::TrainOptions& o, std::string& tokens, std::string& capacity) {
  ss::RunOptions& r = o.run;
  cmd->add_option("--model", r.model, "preset name (see `presets`) or a Hugging Face model folder")->capture_default_str();
  cmd->add_option("--set", r.overrides, "override a config.json field, e.g. --set num_hidden_layers=4 (repeatable)");
  cmd->add_option("--backend", r.backend, "cpu, cuda, or sim (with --hardware)")->capture_default_str();
  cmd->add_option("--hardware", o.hardware, "sim backend: profile name in resources/hardware, or a JSON file");
  cmd->add_option("--nodes", o.nodes, "sim backend: nodes the devices are spread over")->capture_default_str();
  cmd->add_option("--strategy", r.strategy, "single, dp, tp, sp, tp_sp or tsp")->capture_default_str();
  cmd->add_option("--devices", r.devices, "devices (ranks) of the run")->capture_default_str();
  cmd->add_option("--mesh", r.mesh, "tp_sp mesh TxS, e.g. 2x2");
  cmd->add_option("--split", r.split, "sequence split for sp/tp_sp/tsp: zigzag or contiguous")->capture_default_str();
  add_dtype_options(cmd, r.dtype, nullptr);
  cmd->add_option("--seed", r.seed, "seed of synthetic weights and the synthetic corpus")->capture_default_str();
  cmd->add_option("--capacity", capacity, "memory per device, e.g. 2GiB (over it: an oom error event)");
  cmd->add_option("--threads", r.threads, "threads for kernels and OpenBLAS (0 = all cores)")->capture_default_str();
  cmd->add_option("--seq-len", o.seq_len, "input tokens per sequence");
  cmd->add_option("--micro-batch", o.micro_batch, "sequences per micro-batch per data-parallel replica")
      ->capture_default_str();
  cmd->add_option("--grad-accum", o.grad_accum, "micro-batches per step")->capture_default_str();
  cmd->add_option("--global-batch", o.global_batch,
                  "sequences per step (instead of --grad-accum): a multiple of --micro-batch x replicas");
  cmd->add_option("--steps", o.steps, "optimizer steps")->capture_default_str();
  cmd->add_option("--lr", o.lr, "peak learning rate (AdamW)")->capture_default_str();
  cmd->add_option("--warmup", o.warmup, "steps of linear warmup, then cosine decay")->capture_default_str();
  cmd->add_option("--schedule-steps", o.schedule_steps,
                  "length of the schedule in steps (default: this run's last step; set it to resume mid-schedule)");
  cmd->add_option("--min-lr-ratio", o.min_lr_ratio, "the cosine decay's end, as a fraction of --lr")
      ->capture_default_str();
  cmd->add_option("--weight-decay", o.weight_decay, "decoupled weight decay of matrices (not norms)")
      ->capture_default_str();
  cmd->add_option("--clip", o.clip, "clip the gradient to this global L2 norm (0 = no clipping)")
      ->capture_default_str();
  cmd->add_option("--beta1", o.beta1, "AdamW beta1")->capture_default_str();
  cmd->add_option("--beta2", o.beta2, "AdamW beta2")->capture_default_str();
  cmd->add_option("--adam-eps", o.adam_eps, "AdamW epsilon")->capture_default_str();
  cmd->add_option("--recompute", o.recompute, "activation recomputation: none, selective or full")
      ->capture_default_str();
  cmd->add_option("--data", o.data, "synthetic, or a FILE of text, encoded by --tokenizer or else the model folder's tokenizer.json; "
                  "without either (or with --tokenizer none) its bytes are the tokens")
      ->capture_default_str();
  cmd->add_option("--tokenizer", o.tokenizer, "tokenizer.json (a folder with one, or a shipped model) that encodes the text of --data (copied into "
                  "--save); default: the model folder's own, where it has one; none: the file's bytes");
  cmd->add_option("--tokens", tokens, "one explicit sequence, comma separated: inputs all but the last id, targets "
                                      "all but the first");
  cmd->add_option("--save", o.save, "write a checkpoint folder (HF layout + optimizer state) after the last step");
  cmd->add_option("--resume", o.resume, "continue from a folder --save wrote (its model, weights and optimizer state)");
  cmd->add_option("--dump-grads", o.dump_grads, "write step 1's whole gradient as DIR/gradients.safetensors");
}

// verify and train --verify: the verdict as text, and as an event stream
// where --events asks for one (- for stdout: the text then goes to stderr).
template <class Verify>
int with_verdict_stream(const std::string& events, Verify verify) {
  std::FILE* f = events.empty() ? nullptr : open_events(events);
  std::optional<ss::proto::Writer> w;
  if (f) w.emplace(f);
  const int code = verify(w ? &*w : nullptr, f == stdout ? std::cerr : std::cout);
  if (f && f != stdout) std::fclose(f);
  return code;
}

int run_command(ss::RunOptions& o, const std::string& tokens, const std::string& capacity,
                const std::string& events) {
  complete_run_options(o, tokens, capacity);
  std::FILE* f = open_events(events);
  ss::proto::Writer w(f);
  ss::RunResult r = ss::run_inference(o, w);
  if (f != stdout) std::fclose(f);
  return r.exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  // --backend cuda-emu: the cuda kernels under the host emulator, for the tests.
  // A rank's emulated device, where its NCCL world made one, until the run's
  // backend takes it (the world and the backend share its streams and spans).
  static std::shared_ptr<ss::cuda_emu::DeviceContext> emulated_device;
  ss::register_emulated_cuda(
      {[](ss::Allocator& a, ss::Recorder& r) -> std::unique_ptr<ss::Backend> {
         if (auto ctx = std::exchange(emulated_device, nullptr))
           return std::make_unique<ss::cuda_emu::CudaBackend>(a, r, std::move(ctx));
         return std::make_unique<ss::cuda_emu::CudaBackend>(a, r);
       },
       [](std::unique_ptr<ss::Communicator> host, ss::Recorder& rec) -> std::unique_ptr<ss::Communicator> {
         emulated_device = std::make_shared<ss::cuda_emu::DeviceContext>(0, rec);
         return std::make_unique<ss::cuda_emu::StagedCommunicator>(std::move(host), emulated_device->compute,
                                                                   emulated_device);
       },
#ifdef SHARDSCOPE_EMU_NCCL
       [](std::unique_ptr<ss::MpiCommunicator> host, ss::Recorder& rec,
          double timeout_s) -> std::unique_ptr<ss::Communicator> {
         emulated_device = std::make_shared<ss::cuda_emu::DeviceContext>(0, rec);
         return std::make_unique<ss::cuda_emu::NcclCommunicator>(std::move(host), emulated_device, rec, timeout_s);
       },
#else
       nullptr,
#endif
       [](const ss::CudaBenchOptions& o, std::ostream& out) { return ss::cuda_emu::run_bench(o, out); },
       [](bool quick, std::ostream& log) { return ss::cuda_emu::calibrate(quick, log); }});
  ss::set_invocation(argc, argv);  // every config's `command`
  // Hand-written kernels and OpenBLAS take turns on the cores: idle OpenMP
  // threads must sleep rather than spin.
  setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  // ... after a short spin (libgomp counts ~20k iterations, tens of
  // microseconds): decode's back-to-back small kernels then find the threads
  // awake instead of paying a futex wake-up each (measured: ~20% of a decode
  // step), while a long OpenBLAS call still finds them asleep.
  setenv("GOMP_SPINCOUNT", "20000", 0);

  CLI::App app{"shardscope-engine: runs, trains, simulates and measures model-parallel models (events as JSON Lines)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", ss::engine_version());

  ss::RunOptions run_opts;
  std::string tokens, capacity, events;
  auto* run = app.add_subcommand("run", "run a model on one device: prefill, then decode (greedy, or sampled with --temperature)");
  add_model_options(run, run_opts, tokens, capacity);
  run->add_option("--events", events, "write the event stream to FILE instead of stdout");
  std::string heartbeat;  // a rank of launch or train: where its liveness goes (runtime/heartbeat.h)
  run->add_option("--heartbeat", heartbeat)->group("");

  ss::RunOptions launch_opts;
  std::string launch_tokens, launch_capacity;
  ss::LaunchOptions launch_cfg;
  auto* launch = app.add_subcommand("launch", "run on several devices: starts one MPI rank per device with mpirun");
  add_model_options(launch, launch_opts, launch_tokens, launch_capacity);
  launch->add_option("--events", launch_cfg.events, "write the event stream to FILE instead of stdout");
  launch->add_option("--hostfile", launch_cfg.hostfile, "OpenMPI hostfile for runs over several hosts");
  launch->add_option("--timeout", launch_cfg.timeout_s, "stop the run after this many seconds (0 = never)");
  launch->add_option("--rank-timeout", launch_cfg.rank_timeout_s,
                     "end the run when a rank has not answered for this many seconds (stopped, frozen; 0 = never)")
      ->capture_default_str();

  ss::TrainOptions train_opts;
  std::string train_tokens, train_capacity;
  ss::LaunchOptions train_cfg;
  auto* train = app.add_subcommand("train", "train a model under a strategy: forward, loss, backward, gradient "
                                            "communication, AdamW (one MPI rank per cpu device)");
  add_train_options(train, train_opts, train_tokens, train_capacity);
  train->add_option("--events", train_cfg.events, "write the event stream to FILE instead of stdout");
  train->add_option("--hostfile", train_cfg.hostfile, "OpenMPI hostfile for runs over several hosts");
  train->add_option("--timeout", train_cfg.timeout_s, "stop the run after this many seconds (0 = never)");
  train->add_option("--rank-timeout", train_cfg.rank_timeout_s,
                    "end the run when a rank has not answered for this many seconds (stopped, frozen; 0 = never)")
      ->capture_default_str();
  train->add_flag("--check-only", train_opts.check_only, "validate the setup and simulate its memory (as `check` does for inference): "
                  "print ok and the fullest device's peak, and start nothing");
  bool train_verify = false;
  train->add_flag("--verify", train_verify,
                  "run the setup and the same training on one cpu device and compare step 1's loss, gradient norm and "
                  "gradient tensor by tensor: ok within the dtype's bound (exit 0), or where they differ (exit 1); "
                  "--events then asks for the verdict as a stream");
  train->add_option("--forecast-seconds", train_opts.forecast_seconds,
                    "with --check-only: give up simulating the memory after this many seconds, saying so (0: never)")
      ->check(CLI::Range(0.0, 86400.0));
  // Not listed: the runs of scale's micro-batch search (peaks only, ranks not
  // meeting at collectives), for tst_scale to set against timed runs.
  train->add_flag_callback("--untimed", [&] { train_opts.run.timeline = false; })->group("");
  std::string rank_events;
  auto* train_rank = app.add_subcommand("train-rank", "one rank of a multi-device `train` (started by train)");
  add_train_options(train_rank, train_opts, train_tokens, train_capacity);
  train_rank->add_option("--events", rank_events, "write the event stream to FILE instead of stdout");
  train_rank->add_option("--heartbeat", heartbeat)->group("");
  train_rank->group("");  // not listed: train starts it

  ss::RunOptions sim_opts;
  sim_opts.backend = "sim";
  std::string sim_tokens, sim_capacity, sim_events, sim_hardware = "h100-sxm";
  int sim_nodes = 1;
  auto* simulate = app.add_subcommand("simulate", "run the same engine on simulated devices of a hardware profile");
  add_model_options(simulate, sim_opts, sim_tokens, sim_capacity);
  // Simulated devices compute no values and take no host threads.
  for (const char* own : {"--logits-out", "--threads"}) simulate->remove_option(simulate->get_option(own));
  simulate->get_option("--backend")->description("sim: simulate always runs on simulated devices (--hardware)");
  simulate->add_option("--hardware", sim_hardware, "profile name in resources/hardware, or a JSON file")
      ->capture_default_str();
  simulate->add_option("--nodes", sim_nodes, "nodes the devices are spread over")->capture_default_str();
  int sim_replicas = 1;
  simulate->add_option("--replicas", sim_replicas,
                       "data-parallel copies of the simulated group (reported, not simulated one by one)")
      ->capture_default_str();
  simulate->add_option("--events", sim_events, "write the event stream to FILE instead of stdout");

  ss::SweepOptions sweep_opts;
  sweep_opts.run.strategy = "tp";
  sweep_opts.run.devices = 2;
  sweep_opts.run.model = "brown-llama";  // a trained model: real text, peaked distributions
  std::string sweep_tokens, sweep_capacity;
  auto* sweep = app.add_subcommand("sweep", "quantized all-reduce trade-off: wire bytes against accuracy over a grid");
  add_model_options(sweep, sweep_opts.run, sweep_tokens, sweep_capacity);
  sweep->add_option("--precisions", sweep_opts.precisions, "formats to try (block sizes: --blocks)")->delimiter(',')->capture_default_str();
  sweep->add_option("--blocks", sweep_opts.blocks, "block sizes for int8/int4/fp8 ('tensor': one scale a buffer)")
      ->delimiter(',')
      ->capture_default_str();
  sweep->add_option("--sites", sweep_opts.sites, "all, attn, mlp, mixer (one site at a time gives sensitivity)")
      ->delimiter(',')
      ->capture_default_str();
  sweep->add_flag("--per-layer", sweep_opts.per_layer,
                  "also quantize one layer's all-reduces at a time (sensitivity by layer)");
  sweep->add_option("--rounding", sweep_opts.rounding, "rn (nearest) or sr (stochastic)")->capture_default_str();
  sweep->add_option("--eval-tokens", sweep_opts.eval_tokens, "file of token ids: perplexity over them");
  sweep->add_option("--eval-text", sweep_opts.eval_text,
                    "score real text, teacher-forced: a FILE the model's tokenizer encodes, or 'heldout' (the "
                    "Brown Corpus's held-out samples)");
  sweep->add_option("--eval-windows", sweep_opts.eval_windows, "windows of the text to score")->capture_default_str();
  sweep->add_option("--eval-window", sweep_opts.eval_window, "tokens per window")->capture_default_str();
  sweep->add_option("--events", sweep_opts.events, "write the sweep's stream to FILE (the table goes to stdout)");

  ss::ScaleOptions scale_opts;
  std::string scale_events;
  bool scale_no_search = false;
  auto* scale = app.add_subcommand("scale", "where each strategy runs out of memory: simulated peak, time and traffic "
                                            "per strategy over sequence lengths (one scale_point per point)");
  scale->add_option("--model", scale_opts.model, "preset name or a Hugging Face model folder")->capture_default_str();
  scale->add_option("--set", scale_opts.overrides, "override a config.json field (repeatable)");
  scale->add_option("--hardware", scale_opts.hardware, "profile name in resources/hardware, or a JSON file")
      ->capture_default_str();
  scale->add_option("--devices", scale_opts.devices, "devices of the model-parallel group")->capture_default_str();
  scale->add_option("--nodes", scale_opts.nodes, "nodes the devices are spread over")->capture_default_str();
  scale->add_option("--mode", scale_opts.mode,
                    "train (two steps: a point's peak over both, its time and traffic a step's) or infer (prefill + "
                    "decode)")
      ->capture_default_str();
  scale->add_option_function<std::string>(
           "--dtype", [&](const std::string& s) { scale_opts.dtype = ss::parse_compute_dtype(s); },
           "compute dtype: fp32, bf16 or fp16 (default bf16)")
      ->check(dtype_check());
  scale->add_option("--recompute", scale_opts.recompute, "training: none, selective or full")->capture_default_str();
  scale->add_option("--seq-lens", scale_opts.seq_lens, "sequence lengths (default 4096,8192,...,1048576)")
      ->delimiter(',');
  scale->add_option("--micro-batches", scale_opts.micro_batches, "micro-batch sizes")->delimiter(',')->capture_default_str();
  scale->add_option("--strategies", scale_opts.strategies, "strategies (default: single,dp,tp,sp,tp_sp,tsp; tp_sp "
                                                           "over every mesh)")
      ->delimiter(',');
  scale->add_option("--decode", scale_opts.decode, "inference: decode steps after the prefill")->capture_default_str();
  scale->add_option("--attention", scale_opts.attention, "inference: sequence-parallel attention, gather or ring")
      ->capture_default_str();
  scale->add_flag("--no-batch-search", scale_no_search, "training: skip the search for the largest micro-batch");
  scale->add_option("--jobs", scale_opts.jobs, "points simulated at once (0 = the cores)")->capture_default_str();
  scale->add_option("--seed", scale_opts.seed, "seed of the synthetic data")->capture_default_str();
  scale->add_option("--events", scale_events, "write the stream to FILE (a table of peaks goes to stdout; without --events, the stream takes "
                  "stdout and the table stderr; - the stream alone)");

  ss::RunOptions check_opts;
  std::string check_tokens, check_capacity, check_hardware;
  int check_nodes = 1;
  double check_seconds = 0;
  auto* check = app.add_subcommand("check", "validate a setup's options and shapes, and simulate its memory, without running "
                                      "it: prints ok and the fullest device's peak, or the one reason it cannot run");
  add_model_options(check, check_opts, check_tokens, check_capacity);
  check->add_option("--hardware", check_hardware, "check it as a simulated run on this hardware profile");
  check->add_option("--nodes", check_nodes, "with --hardware: nodes the simulated devices are spread over")
      ->capture_default_str();
  check->add_option("--forecast-seconds", check_seconds,
                    "give up simulating the memory after this many seconds, saying so (0: never)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));

  ss::RunOptions verify_opts;
  std::string verify_tokens, verify_capacity;
  auto* verify = app.add_subcommand(
      "verify", "run a setup under its strategy and on one cpu device, on the same weights and tokens, and compare "
                "their logits row by row: ok within the dtype's bound (exit 0), or where they differ (exit 1)");
  add_model_options(verify, verify_opts, verify_tokens, verify_capacity);
  std::string verify_events;
  verify->add_option("--events", verify_events,
                     "also write the verdict as an event stream to FILE (- for stdout: the text then goes to stderr)");

  auto* info = app.add_subcommand("info", "backends, devices and library versions found");

  auto* presets = app.add_subcommand("presets", "list the model presets");

  std::string export_dir, export_dtype = "fp32";
  int export_shards = 1;
  ss::RunOptions ex_opts;
  auto* exp = app.add_subcommand(
      "export", "write a Hugging Face model folder: a preset's synthetic weights of --seed, or a model folder's own "
                "weights in --dtype");
  exp->add_option("--model", ex_opts.model, "preset name or model folder")->required();
  exp->add_option("--set", ex_opts.overrides, "override a config.json field (repeatable)");
  exp->add_option("--seed", ex_opts.seed, "seed of the synthetic weights")->capture_default_str();
  exp->add_option("--out", export_dir, "folder to write")->required();
  exp->add_option("--dtype", export_dtype, "fp32, bf16 or fp16")->capture_default_str()->check(dtype_check());
  exp->add_option("--shards", export_shards, "number of safetensors files (> 1 writes an index)")->capture_default_str();

  std::string summary_file;
  auto* summarize = app.add_subcommand("summarize", "print the summary of a recorded event stream (- for stdin)");
  summarize->add_option("file", summary_file, "stream file written with --events")->required();

  ss::TextCommands text_cmds;
  ss::add_text_commands(app, text_cmds);

  ss::BenchOptions bench_opts;
  auto* bench = app.add_subcommand("bench", "benchmarks: forward vs bare sgemm, tokens/s, memory");
  bench->add_option("--prompt-lens", bench_opts.prompt_lens, "prompt lengths")->capture_default_str()->delimiter(',');
  bench->add_option("--models", bench_opts.models, "presets to measure")->capture_default_str()->delimiter(',');
  bench->add_option("--decode", bench_opts.decode, "decode steps per run")->capture_default_str();
  bench->add_option("--repeat", bench_opts.repeat, "runs per configuration (best is kept)")->capture_default_str();
  add_dtype_options(bench, bench_opts.dtype, nullptr);
  std::vector<std::string> bench_strategies;
  ss::StrategyBenchOptions sb;
  ss::CollectiveBenchOptions cb;
  bool bench_collectives = false;
  int bench_devices = 4;
  int64_t bench_prompt = 2048;
  bench->add_option("--strategies", bench_strategies, "compare these strategies on real ranks (e.g. single,tp,sp,tp_sp,tsp)")
      ->delimiter(',');
  bench->add_option("--devices", bench_devices, "devices for --strategies")->capture_default_str();
  bench->add_option("--prompt-len", bench_prompt, "prompt length for --strategies")->capture_default_str();
  bench->add_flag("--collectives", bench_collectives, "the engine's all-reduce/all-gather against bare MPI");
  bool bench_cache = false, bench_comm = false;
  bench->add_flag("--cache", bench_cache, "decode latency with the prefill->decode caches against recomputing the prefix");
  bench->add_flag("--comm", bench_comm, "quantized all-reduce against bare MPI, and quantize/dequantize throughput");
  auto* comm_rank = app.add_subcommand("bench-comm-rank", "(internal) one rank of bench --comm");
  comm_rank->group("");
  bool bench_train = false;
  ss::TrainBenchOptions tb;
  bench->add_flag("--train", bench_train,
                  "training: one device's step against bare sgemm, then each strategy on --devices ranks");
  bench->add_option("--seq-len", tb.seq_len, "--train: tokens per sequence")->capture_default_str();
  bench->add_option("--steps", tb.steps, "--train: steps per run (the first is not counted)")->capture_default_str();
  std::string bench_backend = "cpu";
  ss::CudaBenchOptions gpu_bench;
  bench->add_option("--backend", bench_backend,
                    "cpu, or cuda: the GPU's GEMMs against bare cuBLAS, kernels against a copy, prefill MFU, decode "
                    "against the weight-bandwidth limit, NCCL bus bandwidth")
      ->capture_default_str();
  bench->add_option("--peak-tflops", gpu_bench.peak_tflops, "--backend cuda: the dtype's dense TFLOP/s for MFU "
                                                            "(default: the hardware profile naming this GPU)");
  bench->add_flag("--quick", gpu_bench.quick, "--backend cuda: tiny models and buffers (a smoke test)");
  auto* nccl_rank = app.add_subcommand("bench-nccl-rank", "(internal) one rank of bench --backend cuda's NCCL table");
  nccl_rank->group("");
  bool bench_sim = false;
  ss::SimBenchOptions simb;
  bench->add_flag("--sim", bench_sim, "simulator speed, and simulated vs measured per-op time on this machine");
  bench->add_flag("--sim-accuracy", simb.accuracy_only,
                  "with --sim: only simulated vs measured (per op, and end to end for every strategy on 2 and 4 ranks)");
  std::string sim_check = "tp:2";
  bench->add_option("--sim-check", sim_check,
                    "with --sim: the run of the per-op table, STRATEGY:D[:MESH] (e.g. tsp:4, tp_sp:4:2x2)")
      ->capture_default_str();
  std::vector<int64_t> coll_sizes;
  int coll_iters = 10;
  auto* coll_rank = app.add_subcommand("bench-collectives-rank", "(internal) one rank of bench --collectives");
  coll_rank->group("");
  coll_rank->add_option("--sizes", coll_sizes)->delimiter(',');
  coll_rank->add_option("--iterations", coll_iters);
  bool coll_json = false;
  coll_rank->add_flag("--json", coll_json);
  std::vector<std::string> coll_extra;
  coll_rank->add_option("--extra", coll_extra)->delimiter(',');

  std::string calib_out = "calibrated.json";
  int calib_ranks = 2;
  auto* calibrate = app.add_subcommand("calibrate", "measure this machine and write a hardware profile for simulate");
  calibrate->add_option("--out", calib_out, "profile file to write")->capture_default_str();
  calibrate->add_option("--ranks", calib_ranks, "ranks per run the profile is for (threads = cores / ranks)")
      ->capture_default_str();
  std::vector<std::string> calib_for;
  std::string calib_backend = "cpu";
  bool calib_quick = false;
  calibrate->add_option("--backend", calib_backend, "cpu (this machine's cores) or cuda (its GPU)")->capture_default_str();
  calibrate->add_flag("--quick", calib_quick,
                      "a smoke test, noisier figures: cpu, one pass of each grid and fewer collective sizes; "
                      "cuda, small sizes");
  calibrate->add_option("--for", calib_for,
                        "also measure the GEMM shapes and message sizes of this run, e.g. --for '--model small-llama --strategy tp "
                        "--devices 2 --prompt-len 512 --decode 8' (repeat it for several runs)");

  auto* calib_rank = app.add_subcommand("calibrate-rank", "(internal) one rank of calibrate --ranks N");
  calib_rank->group("");
  std::vector<std::string> calib_rank_shapes;
  calib_rank->add_option("--shapes", calib_rank_shapes, "GEMM shapes M:N:K")->delimiter(',');
  calib_rank->add_flag("--quick", calib_quick);

  // A command's subcommand by name (nullptr: none).
  auto child = [](CLI::App* parent, const char* name) -> CLI::App* {
    for (CLI::App* s : parent->get_subcommands([](CLI::App*) { return true; }))
      if (s->get_name() == name) return s;
    return nullptr;
  };
  // A mistyped command: CLI11 would only say that one is required.
  if (argc > 1 && argv[1][0] != '-' && !child(&app, argv[1])) {
    std::vector<std::string> listed;  // the commands people type (not the ranks' own)
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
      if (sub->get_name().find("-rank") == std::string::npos) listed.push_back(sub->get_name());
    const std::string near = ss::nearest_name(argv[1], listed);
    std::string all;
    for (const auto& n : listed) all += (all.empty() ? "" : ", ") + n;
    std::fprintf(stderr, "shardscope-engine: error: unknown command '%s'; %s\n", argv[1],
                 (near.empty() ? "commands: " + all : "did you mean '" + near + "'?").c_str());
    return ss::kExitUsage;
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version end here with 0. A flag CLI11 cannot parse is bad
    // input like any other: exit 2 (not CLI11's own codes), one stderr line.
    if (e.get_exit_code() == 0) return app.exit(e);
    std::string msg = e.what();
    // A mistyped flag: the nearest one its command has.
    // (The command is the deepest one named: `tokenizer train` is train's.)
    CLI::App* sub = argc > 1 ? child(&app, argv[1]) : nullptr;
    int first = 2;
    for (CLI::App* c; sub && first < argc && (c = child(sub, argv[first])); ++first) sub = c;
    if (sub && dynamic_cast<const CLI::ExtrasError*>(&e)) {
      std::vector<std::string> flags;
      for (const CLI::Option* opt : sub->get_options())
        for (const std::string& n : opt->get_lnames()) flags.push_back("--" + n);
      for (int i = first; i < argc; ++i) {
        const std::string arg = std::string(argv[i]).substr(0, std::string(argv[i]).find('='));
        if (arg.rfind("--", 0) != 0 || std::find(flags.begin(), flags.end(), arg) != flags.end()) continue;
        const std::string near = ss::nearest_name(arg, flags);
        std::string command;
        for (int k = 1; k < first; ++k) command += (k > 1 ? " " : "") + std::string(argv[k]);
        msg = "unknown option " + arg + " for " + command +
              (near.empty() ? std::string() : "; did you mean " + near + "?");
        break;
      }
    }
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    std::fprintf(stderr, "shardscope-engine: error: %s (see --help)\n", msg.c_str());
    return ss::kExitUsage;
  }

  try {
    std::optional<ss::Heartbeat> beating;
    if (!heartbeat.empty()) beating.emplace(heartbeat);
    if (*run) return run_command(run_opts, tokens, capacity, events);
    if (*train || *train_rank) {
      if (!train_tokens.empty()) train_opts.tokens = parse_tokens(train_tokens);
      if (!train_capacity.empty()) train_opts.run.capacity = ss::parse_bytes(train_capacity);
      if (*train_rank) {
        std::FILE* f = open_events(rank_events);
        ss::proto::Writer w(f);
        const int code = ss::run_training(train_opts, w).exit_code;
        if (f != stdout) std::fclose(f);
        return code;
      }
      if (train_verify) {
        // Its runs start with train's own limits, on this host.
        if (!train_cfg.hostfile.empty()) throw ss::UsageError("--verify runs on this host; leave out --hostfile");
        if (train_cfg.timeout_s != 0 || train_cfg.rank_timeout_s != ss::LaunchOptions{}.rank_timeout_s ||
            train_opts.forecast_seconds != 0)
          throw ss::UsageError("--verify starts its runs with train's own limits; leave out --timeout, "
                               "--rank-timeout and --forecast-seconds");
        return with_verdict_stream(train_cfg.events, [&](ss::proto::Writer* w, std::ostream& out) {
          return ss::run_train_verify(train_opts, w, out);
        });
      }
      if (train_opts.forecast_seconds > 0 && !train_opts.check_only)
        throw ss::UsageError("--forecast-seconds bounds --check-only's memory forecast; give --check-only too");
      train_cfg.run_args = rank_arguments(argc, argv, "train");
      return ss::train_command(train_opts, train_cfg);
    }
    if (*check) {
      // The same checks launch and simulate make before anything starts.
      complete_run_options(check_opts, check_tokens, check_capacity);
      std::optional<ss::HardwareProfile> hw;
      if (!check_hardware.empty()) {
        hw = ss::load_hardware(check_hardware);
        check_opts.backend = "sim";
      }
      const ss::RunPlan plan = ss::plan_inference(check_opts, check_opts.backend);
      if (check_opts.backend == "cpu")
        ss::check_host_memory(plan.cfg, check_opts, check_opts.devices, ss::host_available_bytes());
      if (check_nodes != 1 && !hw)
        throw ss::UsageError("--nodes spreads simulated devices over nodes; give --hardware too");
      // Then the run itself, simulated for its memory only.
      return ss::forecast_and_report([&] { return ss::forecast_inference(check_opts, hw ? &*hw : nullptr, check_nodes); },
                                     check_opts, nullptr, check_seconds);
    }
    if (*verify) {
      complete_run_options(verify_opts, verify_tokens, verify_capacity);
      return with_verdict_stream(verify_events, [&](ss::proto::Writer* w, std::ostream& out) {
        return ss::run_verify(verify_opts, w, out);
      });
    }
    if (*sweep) {
      complete_run_options(sweep_opts.run, sweep_tokens, sweep_capacity);
      const bool to_stdout = sweep_opts.events.empty() || sweep_opts.events == "-";
      return ss::run_sweep(sweep_opts, to_stdout ? std::cerr : std::cout);
    }
    if (*scale) {
      scale_opts.search_micro_batch = !scale_no_search;
      std::FILE* f = open_events(scale_events);
      ss::proto::Writer w(f);
      // The table of peaks: on stdout beside a stream written to a file; on
      // stderr where the stream takes stdout by default; none with --events -
      // (a reader of the stream, as the explorer).
      std::ostream* table = f != stdout ? &std::cout : scale_events.empty() ? &std::cerr : nullptr;
      const int code = ss::run_scale(scale_opts, w, std::cerr, table);
      if (f != stdout) std::fclose(f);
      return code;
    }
    if (*simulate) {
      complete_run_options(sim_opts, sim_tokens, sim_capacity);
      if (simulate->count("--backend") && sim_opts.backend != "sim")
        throw ss::UsageError("simulate runs on simulated devices (--hardware); --backend " + sim_opts.backend +
                             " is for run and launch");
      sim_opts.backend = "sim";
      const ss::HardwareProfile hw = ss::load_hardware(sim_hardware);
      std::FILE* f = open_events(sim_events);
      ss::proto::Writer w(f);
      ss::RunResult r = ss::simulate(sim_opts, hw, sim_nodes, sim_replicas, w);
      if (f != stdout) std::fclose(f);
      return r.exit_code;
    }
    if (*launch) {
      complete_run_options(launch_opts, launch_tokens, launch_capacity);
      launch_cfg.run_args = rank_arguments(argc, argv, "launch");
      return ss::launch(launch_opts, launch_cfg);
    }
    if (const auto code = ss::run_text_command(text_cmds, std::cout, std::cerr)) return *code;
    if (*info) return ss::print_info(std::cout);
    if (*presets) {
      for (auto& n : ss::preset_names()) {
        ss::ModelConfig c = ss::resolve_model(n, nullptr);
        std::printf("%-22s %-13s d=%-5lld layers=%-3d vocab=%lld\n", n.c_str(), c.family_name().c_str(),
                    static_cast<long long>(c.d_model), c.n_layers, static_cast<long long>(c.vocab));
      }
      return 0;
    }
    if (*exp) {
      std::filesystem::path dir;
      ss::ModelConfig cfg = ss::resolve_model(ex_opts.model, &dir, ex_opts.overrides);
      const ss::DType dt = ss::parse_compute_dtype(export_dtype);
      if (export_shards < 1) throw ss::UsageError("--shards must be >= 1");
      if (!dir.empty() && std::filesystem::exists(export_dir) && std::filesystem::equivalent(dir, export_dir))
        throw ss::UsageError("--out is the model's own folder; give export another folder to write");
      ss::export_checkpoint(cfg, ex_opts.seed, export_dir, dt, export_shards, dir);
      std::printf("wrote %s (%s, %d file(s))\n", export_dir.c_str(), export_dtype.c_str(), export_shards);
      return 0;
    }
    if (*coll_rank) return ss::collective_bench_rank(coll_sizes, coll_iters, coll_json, coll_extra);
    if (*calib_rank) {
      ss::CalibrateOptions options;
      options.quick = calib_quick;
      for (const auto& sh : calib_rank_shapes) {
        std::array<int64_t, 3> mnk{};
        if (std::sscanf(sh.c_str(), "%ld:%ld:%ld", &mnk[0], &mnk[1], &mnk[2]) != 3)
          throw ss::UsageError("--shapes takes M:N:K, got " + sh);
        options.gemm_shapes.push_back(mnk);
      }
      return ss::calibrate_rank(options);
    }
    if (*calibrate) {
      ss::CalibrateOptions options;
      options.quick = calib_quick;
      if (calib_backend != "cpu") {
        std::cout << "calibrating this machine's GPU ...\n";
        ss::write_profile(ss::calibrate_cuda(calib_backend, calib_quick, std::cout), calib_out, std::cout);
        return 0;
      }
      for (const std::string& run : calib_for) ss::add_run_shapes(options, run);
      return ss::run_calibrate(calib_out, calib_ranks, std::cout, options);
    }
    if (*bench && bench_collectives) return ss::run_collective_bench(cb, std::cout);
    if (*bench && bench_sim) {
      ss::set_sim_check(simb, sim_check);
      return ss::run_sim_bench(simb, std::cout);
    }
    if (*bench && bench_backend != "cpu") {
      if (bench->count("--models")) gpu_bench.model = bench_opts.models.front();
      if (bench->count("--prompt-len")) gpu_bench.prompt = bench_prompt;
      if (bench->count("--decode")) gpu_bench.decode = bench_opts.decode;
      if (bench->count("--dtype")) gpu_bench.dtype = bench_opts.dtype;
      return ss::run_cuda_bench(bench_backend, gpu_bench, std::cout);
    }
    if (*nccl_rank) return ss::run_nccl_bench_rank();
    if (*bench && bench_train) {
      tb.devices = bench_devices;
      if (bench->count("--models")) tb.model = bench_opts.models.front();
      if (!bench_strategies.empty()) tb.strategies = bench_strategies;
      return ss::run_train_bench(tb, std::cout);
    }
    if (*bench && bench_cache) return ss::run_cache_bench(std::cout);
    if (*bench && bench_comm) return ss::run_comm_bench(std::cout);
    if (*comm_rank)
      return ss::comm_bench_rank({4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20}, 5);
    if (*bench && !bench_strategies.empty()) {
      sb.strategies = bench_strategies;
      sb.devices = bench_devices;
      sb.prompt_len = bench_prompt;
      sb.decode = bench_opts.decode;
      if (bench->count("--models")) sb.models = bench_opts.models;
      return ss::run_strategy_bench(sb, std::cout);
    }
    if (*bench) return ss::run_bench(bench_opts, std::cout);
    if (*summarize) {
      if (summary_file == "-") return ss::summarize_stream(std::cin, std::cout, "stdin");
      std::ifstream in(summary_file);
      if (!in) throw ss::UsageError(summary_file + ": cannot open (" + std::strerror(errno) + ")");
      return ss::summarize_stream(in, std::cout, summary_file);
    }
  } catch (const ss::UsageError& e) {
    std::fprintf(stderr, "shardscope-engine: error: %s\n", e.what());
    return ss::kExitUsage;
  } catch (const ss::FormatError& e) {
    std::fprintf(stderr, "shardscope-engine: error: %s\n", e.what());
    return ss::kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardscope-engine: error: %s\n", e.what());
    return ss::kExitFailure;
  }
  return 0;
}
