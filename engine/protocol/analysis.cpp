#include "protocol/analysis.h"

#include <algorithm>
#include <cstdint>
#include <string_view>

namespace ss::proto {
namespace {

using Intervals = std::vector<std::pair<int64_t, int64_t>>;

Intervals merged(Intervals iv) {
  std::sort(iv.begin(), iv.end());
  Intervals out;
  for (auto& x : iv) {
    if (x.second <= x.first) continue;
    if (!out.empty() && x.first <= out.back().second) out.back().second = std::max(out.back().second, x.second);
    else out.push_back(x);
  }
  return out;
}

}  // namespace

double union_ns(Intervals iv) {
  double total = 0;
  for (auto& [a, b] : merged(std::move(iv))) total += double(b - a);
  return total;
}

double overlap_ns(Intervals a, Intervals b) {
  const Intervals x = merged(std::move(a)), y = merged(std::move(b));
  double total = 0;
  size_t i = 0, j = 0;
  while (i < x.size() && j < y.size()) {
    const int64_t lo = std::max(x[i].first, y[j].first), hi = std::min(x[i].second, y[j].second);
    if (hi > lo) total += double(hi - lo);
    if (x[i].second < y[j].second) ++i;
    else ++j;
  }
  return total;
}

int64_t RunStats::max_peak() const {
  int64_t m = 0;
  for (auto& [r, s] : ranks) m = std::max(m, s.peak_total);
  return m;
}

namespace {

// A byte count from a metric's double: NaN and negatives as 0, huge values
// held at the largest int64 (a stream may carry anything).
int64_t metric_bytes(double v) {
  if (!(v > 0)) return 0;
  return v >= 9.2e18 ? INT64_MAX : int64_t(v);
}

// The category of "<category>_bytes", or -1.
int category_of(std::string_view name) {
  for (int c = 0; c < kCategoryCount; ++c) {
    const std::string_view cat = kCategoryNames[c];
    if (name.size() == cat.size() + 6 && name.substr(0, cat.size()) == cat && name.substr(cat.size()) == "_bytes")
      return c;
  }
  return -1;
}

}  // namespace

bool is_weight_comm(const Span& s) {
  const std::string_view site = s.site;
  auto ends_with = [&](std::string_view tail) {
    return site.size() >= tail.size() && site.substr(site.size() - tail.size()) == tail;
  };
  return site == "grad_sync" || ends_with(".broadcast") || ends_with(".ring") || ends_with(".ring_backward");
}

RunStats analyze(const std::vector<Event>& events) {
  RunStats st;
  std::map<int, Intervals> compute, comm;
  std::map<int, bool> peak_from_metrics;
  for (const Event& e : events) {
    if (auto* c = std::get_if<Config>(&e)) st.config = c->config;
    else if (auto* s = std::get_if<Span>(&e)) {
      if (s->phase == "warmup") continue;  // run --warm-start: untimed, the run's own spans follow
      RankStats& r = st.ranks[s->rank];
      if (s->stream == "comm") {
        comm[s->rank].emplace_back(s->t0, s->t1);
        r.comm_bytes += s->bytes;
        if (is_weight_comm(*s)) r.comm_weight_bytes += s->bytes;
      } else {
        compute[s->rank].emplace_back(s->t0, s->t1);
        r.flops += s->flops;
        if (s->phase == "forward" || s->phase == "prefill" || s->phase == "decode") r.forward_flops += s->flops;
      }
    } else if (auto* m = std::get_if<Mem>(&e)) {
      RankStats& r = st.ranks[m->rank];
      if (peak_from_metrics[m->rank]) continue;
      int64_t tot = 0;
      for (int c = 0; c < kCategoryCount; ++c) {
        r.peak[size_t(c)] = std::max(r.peak[size_t(c)], m->bytes[size_t(c)]);
        tot += m->bytes[size_t(c)];
      }
      r.peak_total = std::max({r.peak_total, tot, m->peak});
    } else if (auto* mt = std::get_if<Metric>(&e)) {
      if (mt->rank < 0) {
        st.metrics[mt->name] = mt->value;
        continue;
      }
      // Exact per-rank peaks reported by the allocator supersede samples.
      RankStats& r = st.ranks[mt->rank];
      const std::string_view name = mt->name;
      const int64_t bytes = metric_bytes(mt->value);
      if (name == "peak_bytes") {
        r.peak_total = bytes;
        continue;
      }
      const bool at_peak = name.rfind("at_peak_", 0) == 0;
      if (!at_peak && name.rfind("peak_", 0) != 0) continue;
      const int c = category_of(name.substr(at_peak ? 8 : 5));
      if (c < 0) continue;
      if (at_peak) {
        r.at_peak[size_t(c)] = bytes;
      } else {
        if (!peak_from_metrics[mt->rank]) r.peak = {};
        peak_from_metrics[mt->rank] = true;
        r.peak[size_t(c)] = bytes;
      }
    } else if (auto* d = std::get_if<Done>(&e)) {
      st.status = d->status;
    } else if (auto* er = std::get_if<Error>(&e)) {
      st.errors.push_back(*er);
    }
  }
  for (auto& [rank, r] : st.ranks) {
    r.compute_ns = union_ns(compute[rank]);
    r.comm_ns = union_ns(comm[rank]);
    r.hidden_ns = overlap_ns(comm[rank], compute[rank]);
    st.comm_bytes += r.comm_bytes;
    st.comm_ns += r.comm_ns;
    st.hidden_ns += r.hidden_ns;
  }
  return st;
}

std::string strategy_label(const nlohmann::json& config) {
  std::string s = config.contains("strategy") && config["strategy"].is_string() ? config["strategy"].get<std::string>() : "?";
  if (s == "tp_sp" && config.contains("mesh") && config["mesh"].is_object())
    s += " " + std::to_string(config["mesh"].value("tp", 0)) + "x" + std::to_string(config["mesh"].value("sp", 0));
  return s;
}

double train_verify_tensor_bound(const nlohmann::json& verify, double one_device_rel_l2) {
  const double bound = verify.value("bound", 0.0);
  return verify.contains("exact") ? verify.value("factor", 0.0) * one_device_rel_l2 + bound : bound;
}

}  // namespace ss::proto
