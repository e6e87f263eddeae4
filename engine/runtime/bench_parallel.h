// Multi-device benchmarks: every strategy on real ranks (through `launch`),
// and the engine's collectives against the same MPI calls made bare.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace ss {

struct StrategyBenchOptions {
  std::vector<std::string> models = {"small-llama", "small-mamba2"};
  std::vector<std::string> strategies = {"single", "tp", "sp", "tp_sp", "tsp"};
  int devices = 4;
  int64_t prompt_len = 2048;
  int decode = 8;
};
int run_strategy_bench(const StrategyBenchOptions& o, std::ostream& out);

struct SimBenchOptions {
  std::string hardware = "h100-sxm";
  std::string check_model = "small-llama";  // measured vs simulated on this machine
  // The per-op table's run (--sim-check STRATEGY:D[:MESH]).
  std::string check_strategy = "tp", check_mesh;
  int check_devices = 2;
  int64_t check_prompt = 512;
  bool accuracy_only = false;  // skip the simulator's speed and the scaling sweep
};
// Wall time and events/s of large simulations (D = 8 and 64, a 32-layer
// model), then simulated against measured per-op times on a profile
// calibrated here: median and 90th-percentile error per op kind.
int run_sim_bench(const SimBenchOptions& o, std::ostream& out);
// Sets the per-op table's run from --sim-check's "STRATEGY:D[:MESH]" (e.g.
// "tsp:4", "tp_sp:4:2x2"); throws UsageError saying what to write.
void set_sim_check(SimBenchOptions& o, const std::string& spec);

// TTFT and per-token decode latency with the prefill->decode caches (KV,
// conv_state + ssm_state) against the same decode recomputing the prefix.
int run_cache_bench(std::ostream& out);

// Quantized all-reduce against bare MPI all-reduce per message size and rank
// count: time, algbw, busbw, wire bytes; and quantize+dequantize throughput per core.
int run_comm_bench(std::ostream& out);
int comm_bench_rank(const std::vector<int64_t>& sizes, int iterations);

struct CollectiveBenchOptions {
  std::vector<int> devices = {2, 4};
  std::vector<int64_t> sizes = {4096, 65536, 1 << 20, 16 << 20, 64 << 20};
  int iterations = 10;
};
// Starts mpirun for each device count and prints rank 0's table.
int run_collective_bench(const CollectiveBenchOptions& o, std::ostream& out);
// The rank side of run_collective_bench (hidden subcommand `bench-collectives-rank`).
// `extra` (with `json`): collective_timing_rank's.
int collective_bench_rank(const std::vector<int64_t>& sizes, int iterations, bool json = false,
                          const std::vector<std::string>& extra = {});

}  // namespace ss
