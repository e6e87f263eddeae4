// Figures derived from an event stream, shared by the command line (bench,
// summarize) and the explorer: where time went, how much communication hid
// behind compute, bytes on the wire, peak memory per rank and category.
#pragma once

#include <array>
#include <map>
#include <string>
#include <vector>

#include "protocol/events.h"

namespace ss::proto {

struct RankStats {
  std::array<int64_t, kCategoryCount> peak{};  // per category
  int64_t peak_total = 0;
  double compute_ns = 0, comm_ns = 0;  // union of each stream's busy time
  double hidden_ns = 0;                // comm time overlapped by compute
  double comm_bytes = 0;               // bytes this rank put on the wire ...
  double comm_weight_bytes = 0;        // ... of them, weight-proportional (comm_kind)
  double flops = 0;
  double forward_flops = 0;            // of compute spans in the forward, prefill and decode phases
  std::array<int64_t, kCategoryCount> at_peak{};  // per category when the total peaked (at_peak_* metrics)
};

struct RunStats {
  nlohmann::json config;
  std::map<int, RankStats> ranks;
  std::map<std::string, double> metrics;  // run-wide metrics (rank -1)
  std::string status;                     // the done record's, empty if none
  std::vector<Error> errors;
  double comm_bytes = 0;
  double comm_ns = 0, hidden_ns = 0;
  double hidden_fraction() const { return comm_ns > 0 ? hidden_ns / comm_ns : 0; }
  int64_t max_peak() const;
};

// Interval arithmetic on [t0, t1) spans: measure of the union, and of the
// intersection of two unions.
double union_ns(std::vector<std::pair<int64_t, int64_t>> iv);
double overlap_ns(std::vector<std::pair<int64_t, int64_t>> a, std::vector<std::pair<int64_t, int64_t>> b);

RunStats analyze(const std::vector<Event>& events);

// What a collective's bytes grow with. "weight": weight shards moved by tsp's
// broadcasts and rings (sites `*.broadcast`, `*.ring`, `*.ring_backward`)
// and gradient sums of weights (`grad_sync`): the model's size. "activation":
// everything else (tp's all-reduces, K/V and state gathers, their backward
// conjugates, scalars): the tokens'.
bool is_weight_comm(const Span& s);

// A run's strategy as its config names it, tp_sp with its mesh: "tp_sp 2x2".
std::string strategy_label(const nlohmann::json& config);

// train --verify's bound on one gradient tensor's relative L2 distance, as
// the stream's config.verify states it: `bound` where the run is compared
// with one device's gradient (fp32); where the dtype rounds (`exact` names a
// third, fp32 run), `factor` times one device's own distance from that exact
// gradient, plus `bound`. The engine's verdict and both renderings use it.
double train_verify_tensor_bound(const nlohmann::json& verify, double one_device_rel_l2);

}  // namespace ss::proto
