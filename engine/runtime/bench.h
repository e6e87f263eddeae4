// `shardscope-engine bench` and `info`.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace ss {

struct BenchOptions {
  std::vector<std::string> models = {"small-llama", "small-mamba2"};
  std::vector<int64_t> prompt_lens = {256, 1024};
  int decode = 16;
  int repeat = 2;
};

// Prints, per model and prompt length: prefill and decode tokens/s, the
// forward's GFLOP/s, its GEMMs' GFLOP/s and a bare cblas_sgemm of the same
// shapes measured in the same run, their ratios, the share of attention and
// scans, and accounted memory against the process's resident set.
int run_bench(const BenchOptions& o, std::ostream& out);

int print_info(std::ostream& out);

}  // namespace ss
