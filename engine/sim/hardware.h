// Hardware profiles for the simulator (resources/hardware/*.json): a device's
// peak rates and memory, and the links a collective can cross (inside a node,
// between nodes). Every figure carries its source in the file.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace ss {

struct LinkProfile {
  std::string name;
  double bandwidth = 0;  // bytes/s a rank achieves per direction in a ring
  double latency = 0;    // seconds per message (alpha)
};

struct HardwareProfile {
  std::string name, device_name, file;
  int64_t memory_bytes = 0;
  double fp32_flops = 0;    // vector FP32, FLOP/s
  double matmul_flops = 0;  // GEMM rate for the engine's fp32 GEMMs, FLOP/s
  double memory_bandwidth = 0;  // bytes/s
  double launch = 0;            // seconds per kernel
  // Achieved fractions (optional in the file): fused attention and SSD scans
  // of the matmul rate, elementwise kernels of the memory bandwidth.
  double attention_efficiency = 0.5, scan_efficiency = 0.5, elementwise_efficiency = 0.8;
  double gemv_efficiency = 0.8;  // of the memory bandwidth, for GEMMs with a few rows (decode)
  int max_devices_per_node = 8;
  LinkProfile intra, inter;
  nlohmann::json source;  // the file, for the config event
};

// A profile name in resources/hardware or a path to a JSON file. Throws
// UsageError naming the field and the reason for a malformed profile.
HardwareProfile load_hardware(const std::string& spec);
HardwareProfile parse_hardware(const nlohmann::json& j, const std::string& origin);
std::vector<std::string> hardware_names();

}  // namespace ss
