// What `shardscope-engine bench --backend cuda` measures (cuda/bench.h runs it).
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace ss {

struct CudaBenchOptions {
  std::string model = "llama2-7b";        // the Transformer: GEMMs, MFU, decode
  std::string ssm_model = "mamba2-2.7b";  // the SSD scan's rate
  std::string mamba_model = "mamba-2.8b";  // the selective scan's bandwidth
  int64_t prompt = 4096;
  int decode = 16;
  DType dtype = DType::BF16;
  double peak_tflops = 0;  // the dtype's dense rate; 0: the hardware profile matching the GPU's name
  bool quick = false;      // tiny models and buffers (the emulated build's smoke test)
};

}  // namespace ss
