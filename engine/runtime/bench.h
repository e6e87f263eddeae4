// `shardscope-engine bench` and `info`.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace ss {

struct BenchOptions {
  std::vector<std::string> models = {"small-llama", "small-mamba2"};
  std::vector<int64_t> prompt_lens = {256, 1024};
  int decode = 16;
  int repeat = 2;
  DType dtype = DType::F32;  // the forward's compute dtype (bf16/fp16 also time fp32 prefill)
};

// Prints, per model and prompt length, in the options' dtype: prefill and
// decode tokens/s; the forward's GFLOP/s, its GEMMs' GFLOP/s against bare
// calls of the same GEMM library (and of fp32 sgemm) on the same shapes;
// prefill against fp32 prefill; decode per token against the weight-bandwidth
// limit; memory-bound kernels against a bare copy; the share of attention and
// scans; accounted memory against the resident set. Every baseline is
// measured in the same run.
int run_bench(const BenchOptions& o, std::ostream& out);

int print_info(std::ostream& out);

}  // namespace ss
