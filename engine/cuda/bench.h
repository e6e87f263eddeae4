// `shardscope-engine bench --backend cuda`: the cuda backend against the
// bare libraries and the device's own limits, every baseline measured in the
// same run.
#pragma once

#include <ostream>

#include "cuda/bench_options.h"

namespace ss::SS_CUDA_NS {

// Prints: the forward's GEMMs against bare cuBLAS on the same shapes;
// memory-bound kernels (norms, elementwise, decode attention, the SSD scan)
// against a device-to-device copy; the prefill's MFU; decode per token
// against the weight-bandwidth limit; where several GPUs are visible, NCCL's
// bus bandwidth (nccl-tests' definitions) by ranks it starts. Returns 0.
int run_bench(const CudaBenchOptions& o, std::ostream& out);

}  // namespace ss::SS_CUDA_NS
