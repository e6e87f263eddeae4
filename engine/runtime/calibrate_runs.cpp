// What calibrate learns from the engine's own runs: a run's GEMM shapes and
// message sizes (from a simulation of it), and the host time the engine
// spends between kernels (from a real run).
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "protocol/analysis.h"
#include "protocol/events.h"
#include "runtime/calibrate.h"
#include "runtime/calibrate_common.h"
#include "runtime/process.h"

namespace ss {
namespace {

// The spans a command's --events file holds (the file is removed).
std::vector<proto::Span> spans_of(const std::string& command, const std::string& events, int& rc) {
  rc = std::system((command + " --events '" + events + "' 2>/dev/null >/dev/null").c_str());
  std::vector<proto::Span> out;
  proto::Reader reader;
  std::ifstream in(events);
  std::string line;
  while (std::getline(in, line))
    if (auto r = reader.parse_line(line); r.event)
      if (auto* s = std::get_if<proto::Span>(&*r.event)) out.push_back(std::move(*s));
  std::filesystem::remove(events);
  return out;
}

}  // namespace

void add_run_shapes(CalibrateOptions& options, const std::string& run_args, const std::string& hardware) {
  int rc = 0;
  const std::vector<proto::Span> spans =
      spans_of("'" + self_exe() + "' simulate --hardware '" + hardware + "' " + run_args,
               "/tmp/shardscope-shapes-" + std::to_string(getpid()) + ".jsonl", rc);
  std::set<std::array<int64_t, 3>> shapes;
  int ranks = 1;
  for (const proto::Span& s : spans) {
    ranks = std::max(ranks, s.rank + 1);
    if (s.op == "gemm" && s.dims.size() == 3) shapes.insert({s.dims[0], s.dims[1], s.dims[2]});
  }
  if (rc != 0 || shapes.empty())
    throw UsageError("--for '" + run_args + "' is not a run the simulator accepts; try it with `shardscope-engine check " +
                     run_args + "`");
  options.gemm_shapes.insert(options.gemm_shapes.end(), shapes.begin(), shapes.end());
  // A span carries its wire bytes; the tables key a collective by its buffer
  // (wire_bytes' argument). The tables hold the run's own rank count and
  // groups of each count that divides it (calibrate_collectives.cpp); a
  // collective over any other count reads the fitted figures, so only those
  // are worth timing; ring steps are kept whatever their ring.
  for (const proto::Span& s : spans) {
    if (s.stream != "comm" || s.bytes <= 0) continue;
    const int n = s.op == "sendrecv" ? ranks : int(s.peers.size()) + 1;
    const double per_byte = wire_bytes(s.op, 1.0, n);
    if (n < 2 || ranks % n != 0 || per_byte <= 0) continue;
    if (std::find(kTimedCollectives.begin(), kTimedCollectives.end(), s.op) != kTimedCollectives.end())
      options.message_sizes[s.op].insert(std::llround(s.bytes / per_byte));
  }
  // The host gap is measured on the model of the first run asked for.
  if (options.host_gap_model.empty()) {
    std::istringstream words(run_args);
    for (std::string w; words >> w;)
      if (w == "--model" && (words >> w)) options.host_gap_model = w;
  }
}

nlohmann::json measure_host_gap(std::ostream& log, int threads, const CalibrateOptions& options) {
  const std::string model =
      !options.host_gap_model.empty() ? options.host_gap_model : options.quick ? "tiny-llama" : "small-llama";
  constexpr int kSteps = 24;
  int rc = 0;
  const std::vector<proto::Span> spans = spans_of(
      "'" + self_exe() + "' run --model '" + model + "' --prompt-len 64 --decode " + std::to_string(kSteps) +
          " --warm-start --threads " + std::to_string(threads),
      "/tmp/shardscope-gap-" + std::to_string(getpid()) + ".jsonl", rc);
  // Decode's kernels, back to back on one thread: whatever of a step's wall
  // time no span covers is the engine's own. Each step (from its embedding
  // to the next step's) gives its own figure, and the median of them stands
  // past a burst of load from elsewhere on the host.
  std::vector<std::pair<int64_t, int64_t>> k;
  std::vector<int64_t> starts;
  for (const proto::Span& s : spans)
    if (s.stream == "compute" && s.phase == "decode") {
      k.emplace_back(s.t0, s.t1);
      if (s.op == "embedding") starts.push_back(s.t0);
    }
  std::sort(k.begin(), k.end());
  std::sort(starts.begin(), starts.end());
  if (rc != 0 || starts.size() < 3) {
    log << "  host gap: the run of " << model << " did not come back; left out\n";
    return nullptr;
  }
  std::vector<double> per_step;
  size_t j = 0;
  for (size_t i = 0; i + 1 < starts.size(); ++i) {
    std::vector<std::pair<int64_t, int64_t>> step;
    for (; j < k.size() && k[j].first < starts[i + 1]; ++j)
      if (k[j].first >= starts[i]) step.push_back(k[j]);
    if (step.empty()) continue;
    const double idle = double(starts[i + 1] - starts[i]) - proto::union_ns(step);
    per_step.push_back(std::max(0.0, idle) * 1e-9 / double(step.size()));
  }
  const double gap = median(per_step);
  log << "  host gap: " << gap * 1e6 << " us before each kernel, the median of " << per_step.size()
      << " decode steps of " << model << "\n";
  return {{"us", std::max(gap * 1e6, 1e-3)},
          {"note", "the engine's own time between two kernels on a rank's thread (model code, tensors, the "
                   "recorder), which the kernel tables leave out: the part of a decode step's wall time no "
                   "kernel span covers, per kernel, the median over " + std::to_string(per_step.size()) +
                       " steps of " + model + " (prompt 64, --warm-start, " + std::to_string(threads) +
                       " thread(s))"},
          {"source", calibration_source(threads)}};
}

}  // namespace ss
