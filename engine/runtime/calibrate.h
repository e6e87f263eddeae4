// `shardscope-engine calibrate`: measures this machine (GEMM rate by shape,
// vector rate, memory bandwidth, per-kernel overhead, MPI latency and
// bandwidth) and writes a hardware profile the simulator reads, so simulated
// runs can be checked against cpu runs on the same machine.
#pragma once

#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

namespace ss {

// Measures and returns the profile (and prints what it measured to `log`).
nlohmann::json calibrate_machine(std::ostream& log, int ranks);
int run_calibrate(const std::string& out_file, int ranks, std::ostream& log);

}  // namespace ss
