#include "sim/hardware.h"

#include <algorithm>
#include <cmath>
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

// An optional text field (a name); `fallback` when absent.
std::string text(const json& j, const std::string& path, const char* key, const std::string& fallback,
                 const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end()) return fallback;
  if (!it->is_string()) throw UsageError(origin + ": field '" + path + key + "' must be a string");
  return it->get<std::string>();
}

const json& object(const json& j, const std::string& key, const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_object()) throw UsageError(origin + ": field '" + key + "' must be an object");
  return *it;
}

// A non-empty array of positive numbers; `increasing`: strictly (a grid axis).
std::vector<double> numbers(const json& j, const std::string& path, const char* key, const std::string& origin,
                            bool increasing) {
  const std::string field = path + key;
  auto it = j.find(key);
  if (it == j.end()) throw UsageError(origin + ": field '" + field + "' is missing");
  if (!it->is_array() || it->empty()) throw UsageError(origin + ": field '" + field + "' must be a non-empty array");
  std::vector<double> out;
  for (auto& v : *it) {
    if (!v.is_number()) throw UsageError(origin + ": field '" + field + "' must hold numbers only");
    const double d = v.get<double>();
    if (!(d > 0) || !std::isfinite(d)) throw UsageError(origin + ": field '" + field + "' must hold positive numbers");
    if (increasing && !out.empty() && !(d > out.back()))
      throw UsageError(origin + ": field '" + field + "' must be strictly increasing");
    out.push_back(d);
  }
  return out;
}

void require_source(const json& j, const std::string& path, const std::string& origin) {
  if (!j.contains("source"))
    throw UsageError(origin + ": field '" + path + "source' is missing: say where the figures come from");
}

// Times in microseconds on the grid x by y: `key` holds one array per x value
// of one number per y value.
TimeGrid grid(const json& j, const std::string& path, const char* xkey, const char* ykey, const std::string& origin) {
  TimeGrid g;
  g.x = numbers(j, path, xkey, origin, true);
  g.y = numbers(j, path, ykey, origin, true);
  const std::string field = path + "us";
  auto it = j.find("us");
  if (it == j.end()) throw UsageError(origin + ": field '" + field + "' is missing");
  const std::string shape = std::to_string(g.x.size()) + " arrays (one per " + xkey + ") of " +
                            std::to_string(g.y.size()) + " positive numbers (one per " + ykey + ")";
  if (!it->is_array() || it->size() != g.x.size()) throw UsageError(origin + ": field '" + field + "' must be " + shape);
  for (auto& row : *it) {
    if (!row.is_array() || row.size() != g.y.size()) throw UsageError(origin + ": field '" + field + "' must be " + shape);
    std::vector<double> r;
    for (auto& v : row) {
      if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
        throw UsageError(origin + ": field '" + field + "' must be " + shape);
      r.push_back(v.get<double>() * 1e-6);
    }
    g.seconds.push_back(std::move(r));
  }
  return g;
}

std::vector<GemmShapeTimes> gemm_times(const json& j, const std::string& path, const std::string& origin) {
  if (!j.is_object()) throw UsageError(origin + ": field '" + path.substr(0, path.size() - 1) + "' must be an object");
  require_source(j, path, origin);
  auto it = j.find("shapes");
  if (it == j.end() || !it->is_array() || it->empty())
    throw UsageError(origin + ": field '" + path + "shapes' must be a non-empty array");
  std::vector<GemmShapeTimes> out;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& s = (*it)[i];
    const std::string p = path + "shapes[" + std::to_string(i) + "].";
    if (!s.is_object()) throw UsageError(origin + ": field '" + p.substr(0, p.size() - 1) + "' must be an object");
    GemmShapeTimes g;
    g.n = positive(s, p, "n", origin);
    g.k = positive(s, p, "k", origin);
    g.m = numbers(s, p, "m", origin, true);
    g.seconds = numbers(s, p, "us", origin, false);
    if (g.seconds.size() != g.m.size())
      throw UsageError(origin + ": field '" + p + "us' must hold one time per entry of '" + p + "m'");
    for (double& v : g.seconds) v *= 1e-6;
    out.push_back(std::move(g));
  }
  return out;
}

std::map<std::string, CollectiveFit> collectives(const json& link_json, const std::string& path, const std::string& origin) {
  std::map<std::string, CollectiveFit> out;
  auto it = link_json.find("collectives");
  if (it == link_json.end()) return out;
  const std::string p = path + "collectives";
  if (!it->is_object()) throw UsageError(origin + ": field '" + p + "' must be an object");
  for (auto& [op, v] : it->items()) {
    if (op == "source" || op == "note") continue;
    const std::string q = p + "." + op + ".";
    if (!v.is_object()) throw UsageError(origin + ": field '" + p + "." + op + "' must be an object");
    CollectiveFit& f = out[op];
    f.latency = positive(v, q, "latency_us", origin) * 1e-6;
    f.bandwidth = positive(v, q, "bandwidth_gbps", origin) * 1e9;
    auto table = [&](const json& t, const std::string& at) {
      CollectiveTimes c;
      const double ranks = positive(t, at, "ranks", origin);
      if (ranks != std::floor(ranks) || ranks > 1 << 20)
        throw UsageError(origin + ": field '" + at + "ranks' must be a whole number of ranks");
      c.ranks = int(ranks);
      c.bytes = numbers(t, at, "bytes", origin, true);
      c.seconds = numbers(t, at, "us", origin, false);
      if (c.seconds.size() != c.bytes.size() || c.bytes.size() < 2)
        throw UsageError(origin + ": field '" + at + "us' must hold one time per entry of '" + at +
                         "bytes', at least two");
      for (double& x : c.seconds) x *= 1e-6;
      f.times.push_back(std::move(c));
    };
    if (v.contains("us") || v.contains("bytes") || v.contains("ranks")) table(v, q);
    if (auto g = v.find("groups"); g != v.end()) {
      if (!g->is_array()) throw UsageError(origin + ": field '" + q + "groups' must be an array");
      for (size_t i = 0; i < g->size(); ++i) {
        const std::string at = q + "groups[" + std::to_string(i) + "].";
        if (!(*g)[i].is_object()) throw UsageError(origin + ": field '" + at.substr(0, at.size() - 1) + "' must be an object");
        table((*g)[i], at);
      }
    }
  }
  return out;
}

LinkProfile link(const json& j, const std::string& path, const std::string& origin) {
  LinkProfile l;
  l.name = text(j, path, "name", path, origin);
  l.bandwidth = positive(j, path, "bandwidth_gbps", origin) * 1e9;
  l.latency = positive(j, path, "latency_us", origin) * 1e-6;
  if (!j.contains("source")) throw UsageError(origin + ": field '" + path + "source' is missing: say where the figures come from");
  l.collectives = collectives(j, path, origin);
  return l;
}

}  // namespace

double CollectiveTimes::at(double message_bytes) const {
  if (message_bytes <= bytes.front()) return seconds.front();
  size_t i = 0;
  while (i + 2 < bytes.size() && message_bytes > bytes[i + 1]) ++i;
  const double b0 = bytes[i], b1 = bytes[i + 1], t0 = seconds[i], t1 = seconds[i + 1];
  if (message_bytes > b1) return t1 + std::max(0.0, (t1 - t0) / (b1 - b0)) * (message_bytes - b1);
  return t0 * std::pow(message_bytes / b0, std::log(t1 / t0) / std::log(b1 / b0));
}

double TimeGrid::at(double xv, double yv) const {
  // One axis: the edge below, the last segment (slope >= 0) beyond, linear between.
  auto locate = [](const std::vector<double>& a, double v, size_t& i, double& f) {
    if (a.size() == 1 || v <= a.front()) {
      i = 0;
      f = 0;
      return;
    }
    i = 0;
    while (i + 2 < a.size() && v > a[i + 1]) ++i;
    f = (v - a[i]) / (a[i + 1] - a[i]);
  };
  auto lerp = [](double a, double b, double f) { return f <= 1 ? a + (b - a) * f : b + std::max(0.0, b - a) * (f - 1); };
  size_t i, j;
  double fx, fy;
  locate(x, xv, i, fx);
  locate(y, yv, j, fy);
  auto along_y = [&](size_t xi) {
    const auto& r = seconds[xi];
    return y.size() == 1 ? r[0] : lerp(r[j], r[j + 1], fy);
  };
  const double t = x.size() == 1 ? along_y(0) : lerp(along_y(i), along_y(i + 1), fx);
  return std::max(t, 0.0);
}

double GemmShapeTimes::at(double rows) const {
  if (m.size() == 1 || rows <= m.front()) return m.size() == 1 ? seconds[0] * std::max(rows, 1.0) / m[0] : seconds[0];
  size_t i = 0;
  while (i + 2 < m.size() && rows > m[i + 1]) ++i;
  const double f = (rows - m[i]) / (m[i + 1] - m[i]);
  const double slope = seconds[i + 1] - seconds[i];
  return f <= 1 ? seconds[i] + slope * f : seconds[i + 1] + std::max(0.0, slope) * (f - 1);
}

double HardwareProfile::matmul_rate(DType t) const {
  if (t == DType::BF16 && bf16_matmul_flops > 0) return bf16_matmul_flops;
  if (t == DType::F16 && fp16_matmul_flops > 0) return fp16_matmul_flops;
  return matmul_flops;
}

HardwareProfile parse_hardware(const json& j, const std::string& origin) {
  if (!j.is_object()) throw UsageError(origin + ": a hardware profile must be a JSON object");
  HardwareProfile h;
  h.file = origin;
  h.source = j;
  h.name = text(j, "", "name", origin, origin);
  const json& d = object(j, "device", origin);
  h.device_name = text(d, "device.", "name", h.name, origin);
  h.memory_bytes = int64_t(positive(d, "device.", "memory_bytes", origin));
  h.fp32_flops = positive(d, "device.", "fp32_tflops", origin) * 1e12;
  h.matmul_flops = positive(d, "device.", "matmul_tflops", origin) * 1e12;
  // Optional dense matrix rates per dtype (each needs its entry in sources).
  auto rate = [&](const char* key) {
    if (!d.contains(key)) return 0.0;
    if (!d.contains("sources") || !d["sources"].is_object() || !d["sources"].contains(key))
      throw UsageError(origin + ": field 'device.sources." + std::string(key) + "' is missing: say where the figure comes from");
    return positive(d, "device.", key, origin) * 1e12;
  };
  h.bf16_matmul_flops = rate("bf16_tflops");
  h.fp16_matmul_flops = rate("fp16_tflops");
  h.fp8_matmul_flops = rate("fp8_tflops");
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
  if (auto it = d.find("contention"); it != d.end()) {
    // Slowdowns while the other stream is busy (calibrate_rank.cpp); 0 when absent.
    if (!it->is_object()) throw UsageError(origin + ": field 'device.contention' must be an object");
    require_source(*it, "device.contention.", origin);
    for (auto [key, field] : {std::pair{"compute", &h.compute_contention}, {"comm", &h.comm_contention},
                              {"hold_us", &h.contention_hold}}) {
      auto f = it->find(key);
      if (f == it->end()) continue;
      if (!f->is_number() || !(f->get<double>() >= 0) || !std::isfinite(f->get<double>()))
        throw UsageError(origin + ": field 'device.contention." + key + "' must be a number >= 0");
      *field = f->get<double>();
    }
    h.contention_hold *= 1e-6;
  }
  // Shares of a core over kernel lengths (calibrate, more ranks than cores).
  auto shares = [&](const char* key, std::vector<double>& seconds, std::vector<double>& share) {
    auto it = d.find(key);
    if (it == d.end()) return it;
    const std::string p = "device." + std::string(key) + ".";
    if (!it->is_object()) throw UsageError(origin + ": field 'device." + key + "' must be an object");
    require_source(*it, p, origin);
    seconds = numbers(*it, p, "kernel_us", origin, true);
    for (double& us : seconds) us *= 1e-6;
    share = numbers(*it, p, "share", origin, false);
    if (share.size() != seconds.size())
      throw UsageError(origin + ": field '" + p + "share' must hold one share per kernel_us");
    for (double v : share)
      if (v > 1) throw UsageError(origin + ": field '" + p + "share' holds fractions of a core, at most 1");
    return it;
  };
  if (auto it = d.find("host_gap"); it != d.end()) {
    if (!it->is_object()) throw UsageError(origin + ": field 'device.host_gap' must be an object");
    require_source(*it, "device.host_gap.", origin);
    h.host_gap = positive(*it, "device.host_gap.", "us", origin) * 1e-6;
  }
  shares("core_share", h.core_share_seconds, h.core_share);
  if (auto it = shares("overlap_steps", h.overlap_seconds, h.overlap_share); it != d.end()) {
    const std::string p = "device.overlap_steps.wait_us";
    auto w = it->find("wait_us");
    if (w == it->end() || !w->is_object() || w->empty())
      throw UsageError(origin + ": field '" + p + "' must be an object of times per collective");
    for (auto& [op, times] : w->items()) {
      std::vector<double> v = numbers(*w, p + ".", op.c_str(), origin, false);
      if (v.size() != h.overlap_seconds.size())
        throw UsageError(origin + ": field '" + p + "." + op + "' must hold one time per kernel_us");
      for (double& us : v) us *= 1e-6;
      h.overlap_wait[op] = std::move(v);
    }
  }
  if (auto it = d.find("kernel_times"); it != d.end()) {
    if (!it->is_object()) throw UsageError(origin + ": field 'device.kernel_times' must be an object");
    require_source(*it, "device.kernel_times.", origin);
    for (auto& [op, g] : it->items()) {
      if (op == "source" || op == "note") continue;
      const std::string p = "device.kernel_times." + op + ".";
      if (!g.is_object()) throw UsageError(origin + ": field 'device.kernel_times." + op + "' must be an object");
      h.kernel_times[op] = grid(g, p, "rows", "cols", origin);
    }
  }
  if (auto it = d.find("gemm_times"); it != d.end()) h.gemm_times = gemm_times(*it, "device.gemm_times.", origin);
  if (auto it = d.find("attention_times"); it != d.end()) {
    const std::string p = "device.attention_times.";
    if (!it->is_object()) throw UsageError(origin + ": field 'device.attention_times' must be an object");
    require_source(*it, p, origin);
    h.attention_times.heads = int(positive(*it, p, "heads", origin));
    h.attention_times.kv_heads = int(positive(*it, p, "kv_heads", origin));
    h.attention_times.head_dim = int(positive(*it, p, "head_dim", origin));
    h.attention_times.grid = grid(*it, p, "tq", "tk", origin);
  }
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

namespace {
// Log-linear in x between the measured points, the nearest one outside them.
double log_linear(const std::vector<double>& x, const std::vector<double>& y, double at, double none) {
  if (x.empty()) return none;
  if (at <= x.front()) return y.front();
  if (at >= x.back()) return y.back();
  const size_t i = size_t(std::upper_bound(x.begin(), x.end(), at) - x.begin());
  const double f = std::log(at / x[i - 1]) / std::log(x[i] / x[i - 1]);
  return y[i - 1] + f * (y[i] - y[i - 1]);
}
}  // namespace

double core_share_at(const HardwareProfile& hw, double cpu_seconds) {
  return log_linear(hw.core_share_seconds, hw.core_share, cpu_seconds, 1.0);
}

double segment_wall(const HardwareProfile& hw, double cpu_seconds) {
  return cpu_seconds > 0 ? cpu_seconds / core_share_at(hw, cpu_seconds) : 0.0;
}

double overlap_segment_wall(const HardwareProfile& hw, double cpu_seconds) {
  return cpu_seconds > 0 ? cpu_seconds / log_linear(hw.overlap_seconds, hw.overlap_share, cpu_seconds, 1.0) : 0.0;
}

double overlap_wait_at(const HardwareProfile& hw, const std::string& op, double cpu_seconds) {
  auto it = hw.overlap_wait.find(op);
  if (it == hw.overlap_wait.end()) it = hw.overlap_wait.find("broadcast");
  if (it == hw.overlap_wait.end()) return 0;
  return log_linear(hw.overlap_seconds, it->second, cpu_seconds, 0.0);
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
