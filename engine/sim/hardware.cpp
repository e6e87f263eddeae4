#include "sim/hardware.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "model/config.h"

namespace ss {
namespace {

using json = nlohmann::json;

double positive(const json& j, const std::string& path, const char* key, const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end()) throw UsageError(origin + ": field '" + path + key + "' is missing");
  if (!it->is_number()) throw UsageError(origin + ": field '" + path + key + "' must be a number");
  const double v = it->get<double>();
  if (!(v > 0) || !std::isfinite(v)) throw UsageError(origin + ": field '" + path + key + "' must be positive");
  return v;
}

const json& object(const json& j, const std::string& key, const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_object()) throw UsageError(origin + ": field '" + key + "' must be an object");
  return *it;
}

LinkProfile link(const json& j, const std::string& path, const std::string& origin) {
  LinkProfile l;
  l.name = j.value("name", path);
  l.bandwidth = positive(j, path, "bandwidth_gbps", origin) * 1e9;
  l.latency = positive(j, path, "latency_us", origin) * 1e-6;
  if (!j.contains("source")) throw UsageError(origin + ": field '" + path + "source' is missing: say where the figures come from");
  return l;
}

}  // namespace

HardwareProfile parse_hardware(const json& j, const std::string& origin) {
  if (!j.is_object()) throw UsageError(origin + ": a hardware profile must be a JSON object");
  HardwareProfile h;
  h.file = origin;
  h.source = j;
  h.name = j.value("name", origin);
  const json& d = object(j, "device", origin);
  h.device_name = d.value("name", h.name);
  h.memory_bytes = int64_t(positive(d, "device.", "memory_bytes", origin));
  h.fp32_flops = positive(d, "device.", "fp32_tflops", origin) * 1e12;
  h.matmul_flops = positive(d, "device.", "matmul_tflops", origin) * 1e12;
  h.memory_bandwidth = positive(d, "device.", "memory_bandwidth_gbps", origin) * 1e9;
  h.launch = positive(d, "device.", "kernel_launch_us", origin) * 1e-6;
  if (!d.contains("sources")) throw UsageError(origin + ": field 'device.sources' is missing: say where the figures come from");
  auto fraction = [&](const char* key, double def) {
    if (!d.contains(key)) return def;
    const double v = positive(d, "device.", key, origin);
    if (v > 1) throw UsageError(origin + ": field 'device." + std::string(key) + "' is a fraction and must be at most 1");
    return v;
  };
  h.attention_efficiency = fraction("attention_efficiency", h.attention_efficiency);
  h.scan_efficiency = fraction("scan_efficiency", h.scan_efficiency);
  h.elementwise_efficiency = fraction("elementwise_efficiency", h.elementwise_efficiency);
  h.gemv_efficiency = fraction("gemv_efficiency", h.gemv_efficiency);
  const json& n = object(j, "node", origin);
  h.max_devices_per_node = int(positive(n, "node.", "max_devices", origin));
  h.intra = link(object(n, "link", origin), "node.link.", origin);
  h.inter = link(object(j, "network", origin), "network.", origin);
  return h;
}

std::vector<std::string> hardware_names() {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator(resources_dir() / "hardware", ec))
    if (e.path().extension() == ".json") out.push_back(e.path().stem().string());
  std::sort(out.begin(), out.end());
  return out;
}

HardwareProfile load_hardware(const std::string& spec) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = spec;
  if (!fs::exists(p, ec)) p = resources_dir() / "hardware" / (spec + ".json");
  if (!fs::exists(p, ec)) {
    std::string names;
    for (auto& n : hardware_names()) names += (names.empty() ? "" : ", ") + n;
    throw UsageError("--hardware '" + spec + "' is neither a profile nor a file; profiles: " + names);
  }
  std::ifstream in(p);
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded()) throw UsageError(p.string() + ": not valid JSON");
  return parse_hardware(j, p.string());
}

}  // namespace ss
