#include "runtime/host_memory.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "core/error.h"
#include "model/model.h"
#include "sim/meta_backend.h"

namespace ss {

int64_t host_available_bytes() {
  if (const char* env = std::getenv("SHARDSCOPE_HOST_MEMORY"); env && *env) return parse_bytes(env);
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;  // unknown: no limit
}

int64_t weight_bytes_per_rank(const ModelConfig& cfg, const RunOptions& o) {
  const Strategy s = parse_strategy(o.strategy);
  const auto [T, S] = mesh_of(o);
  Parallel par;
  par.strategy = s;
  if (s == Strategy::TP || s == Strategy::SP || s == Strategy::TPSP) {
    par.tp_size = T;
    par.sp_size = S;
  } else if (s == Strategy::TSP) {
    par.tp_size = par.sp_size = o.devices;
  }
  Allocator none;
  Recorder quiet;
  MetaBackend meta(none, quiet);
  ModelConfig c = cfg;
  c.dtype = o.dtype;
  return Model(c, meta, par).local_parameter_count() * dtype_size(o.dtype);
}

void check_host_memory(const ModelConfig& cfg, const RunOptions& o, int ranks_here,
                       int64_t available) {
  if (available <= 0 || o.capacity > 0)
    return;  // unknown, or the person set a capacity of their own
  const int64_t per_rank = available / std::max(ranks_here, 1),
                weights = weight_bytes_per_rank(cfg, o);
  if (weights <= per_rank) return;
  throw UsageError(
      "the weights alone need " + format_bytes(weights) + " per device, but this host has " +
      format_bytes(available) + " available" +
      (ranks_here > 1 ? " for its " + std::to_string(ranks_here) + " ranks (" +
                            format_bytes(per_rank) + " each)"
                      : std::string()) +
      "; choose a smaller model, " +
      (o.dtype == DType::F32 ? std::string("--dtype bf16, ") : std::string()) +
      "a strategy that shards weights over more devices or hosts (--hostfile), or the simulator "
      "(`shardscope-engine simulate`)");
}

}  // namespace ss
