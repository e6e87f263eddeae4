// `shardscope-engine bench --train`: one device's training step against bare
// sgemm of the same shapes, then tokens/s, the hidden share of gradient
// communication and peak memory per category for each strategy on D ranks.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace ss {

struct TrainBenchOptions {
  std::string model = "small-llama";
  int64_t seq_len = 1024;
  int micro_batch = 1;
  int steps = 3;
  int devices = 4;
  std::vector<std::string> strategies = {"dp", "tp", "sp", "tp_sp", "tsp"};
  int64_t long_seq = 4096;           // the memory comparison's sequence (simulated)
  std::string hardware = "h100-sxm";
};
int run_train_bench(const TrainBenchOptions& o, std::ostream& out);

}  // namespace ss
