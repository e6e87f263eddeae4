// `shardscope-engine bench --backend cuda`: the cuda backend against the
// bare libraries and the device's own limits, every baseline measured in the
// same run.
#pragma once

#include <ostream>

#include <nlohmann/json.hpp>

#include "cuda/bench_options.h"

namespace ss::SS_CUDA_NS {

// Prints: the forward's GEMMs against bare cuBLAS on the same shapes;
// memory-bound kernels (norms, elementwise, decode attention, the scans)
// against a device-to-device copy; the prefill's MFU; decode per token
// against the weight-bandwidth limit; where several GPUs are visible, NCCL's
// bus bandwidth (nccl-tests' definitions) by ranks it starts. Returns 0.
int run_bench(const CudaBenchOptions& o, std::ostream& out);

// `calibrate --backend cuda`: a hardware profile of this GPU for the
// simulator, measured through the backend (cuBLAS rates per dtype, the copy
// bandwidth, per-kernel overhead, attention's, the scan's, elementwise and
// one-row GEMMs' efficiencies; NCCL's all-reduce where there are several
// GPUs, else the link of the datasheet profile naming this GPU, said so).
nlohmann::json calibrate(bool quick, std::ostream& log);

}  // namespace ss::SS_CUDA_NS
