#include "runtime/scale.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <ostream>
#include <set>
#include <thread>
#include <tuple>

#include "core/allocator.h"
#include "core/error.h"
#include "protocol/analysis.h"
#include "runtime/forecast.h"
#include "runtime/run.h"
#include "runtime/train.h"
#include "sim/hardware.h"
#include "sim/textbook.h"
#include "train/train_model.h"

namespace ss {
namespace {

std::vector<int64_t> default_lengths() {
  std::vector<int64_t> v;
  for (int64_t L = 4096; L <= (int64_t(1) << 20); L *= 2) v.push_back(L);
  return v;
}

struct ScaleCase {
  ScaleVariant v;
  int64_t seq_len = 0;
  int micro_batch = 1;
};

class Sweep {
 public:
  Sweep(const ScaleOptions& o, HardwareProfile hw, ModelConfig cfg) : m_o(o), m_hw(std::move(hw)), m_cfg(std::move(cfg)) {}

  // One whole simulated run of the point; its figures, or why it cannot run.
  proto::ScalePoint simulate(const ScaleCase& p) const {
    proto::ScalePoint sp;
    sp.strategy = p.v.strategy;
    sp.mesh = p.v.mesh;
    sp.mode = m_o.mode;
    sp.seq_len = p.seq_len;
    sp.micro_batch = p.micro_batch;
    sp.devices = p.v.devices;
    sp.nodes = p.v.nodes;
    sp.capacity = m_hw.memory_bytes;
    if (m_o.mode == "infer" && p.micro_batch > 1 && p.v.strategy != "single" && p.v.strategy != "dp") {
      sp.reason = "inference with more than one sequence runs under single and dp only: the model-parallel "
                  "strategies serve one sequence at a time";
      return sp;
    }
    std::vector<proto::Event> events;
    try {
      events = run_point(p);
    } catch (const UsageError& e) {  // the model does not split this way
      sp.reason = e.what();
      return sp;
    }
    const proto::RunStats st = proto::analyze(events);
    if (st.status != "ok") {
      // A shape a rank refuses is this strategy not splitting the model; anything else is a failure.
      const std::string why = st.errors.empty() ? "the simulation ended " + st.status : st.errors.front().message;
      if (st.errors.empty() || st.errors.front().code != "usage")
        throw std::runtime_error(p.v.strategy + " at " + std::to_string(p.seq_len) + " tokens: " + why);
      sp.reason = why;
      return sp;
    }
    for (auto& [rank, r] : st.ranks)
      if (r.peak_total > sp.peak_bytes) {
        sp.peak_bytes = r.peak_total;
        sp.peak_rank = rank;
        sp.bytes = r.at_peak;
      }
    sp.fits = sp.peak_bytes <= sp.capacity;
    // A training point's run has kTrainSteps steps: its work and traffic are a step's share.
    const double steps = m_o.mode == "train" ? kTrainSteps : 1;
    double forward_flops = 0;
    for (auto& [rank, r] : st.ranks) {
      forward_flops += r.forward_flops / steps;
      if (r.comm_bytes / steps > sp.comm_activation_bytes + sp.comm_weight_bytes) {
        sp.comm_weight_bytes = r.comm_weight_bytes / steps;
        sp.comm_activation_bytes = (r.comm_bytes - r.comm_weight_bytes) / steps;
      }
    }
    sp.hidden_fraction = st.hidden_fraction();
    auto metric = [&](const char* name) {
      auto it = st.metrics.find(name);
      return it == st.metrics.end() ? 0.0 : it->second;
    };
    double model_flops = 0;
    if (m_o.mode == "train") {
      sp.tokens_per_s = metric("train_tokens_per_s");
      const double tokens = double(p.seq_len) * p.micro_batch * (p.v.strategy == "dp" ? p.v.devices : 1);
      sp.step_s = sp.tokens_per_s > 0 ? tokens / sp.tokens_per_s : 0;
      model_flops = 3 * forward_flops;  // the forward, and backward's two GEMMs per forward one
    } else {
      // A replica prefills and decodes its micro-batch's sequences one after
      // another: the step is all of them (dp's replicas run at once).
      const double prefill_tps = metric("prefill_tokens_per_s");
      const double sequences = p.micro_batch;
      sp.step_s = (prefill_tps > 0 ? sequences * double(p.seq_len) / prefill_tps : 0) +
                  metric("decode_ms_per_token") * 1e-3 * m_o.decode * sequences;
      sp.tokens_per_s = prefill_tps * (p.v.strategy == "dp" ? p.v.devices : 1);
      model_flops = forward_flops;
    }
    const double rate = m_hw.matmul_rate(m_o.dtype) * p.v.devices;
    sp.mfu = sp.step_s > 0 && rate > 0 ? model_flops / (sp.step_s * rate) : 0;
    return sp;
  }

  // The textbook terms of the point (sim/textbook.h).
  nlohmann::json textbook_of(const ScaleCase& p) const {
    TextbookCase c;
    c.strategy = parse_strategy(p.v.strategy);
    c.devices = p.v.devices;
    if (c.strategy == Strategy::TPSP) {
      c.tp = std::stoi(p.v.mesh);
      c.sp = p.v.devices / c.tp;
    } else if (c.strategy == Strategy::TP) {
      c.tp = p.v.devices;
    } else if (c.strategy == Strategy::SP) {
      c.sp = p.v.devices;
    }
    c.seq_len = p.seq_len;
    c.micro_batch = p.micro_batch;
    c.train = m_o.mode == "train";
    c.recompute = m_o.recompute;
    return textbook(m_cfg, c).to_json();
  }

  // The largest micro-batch that fits (0: none), given whether the point's
  // own `mb` fits and its peak there. A step's allocations are constant or
  // proportional to the micro-batch, so its peak is the largest of lines in
  // mb: convex, and the sizes that fit are 1 .. m*. Extended past its two
  // points, a chord of a convex function runs below it, so where the chord
  // through the last two fitting sizes meets the capacity is at or past m*:
  // simulated, that guess either fits (and is m*; its next size then fails)
  // or bounds m* from above. Where the peak does not grow between them (the
  // constant part), the guess doubles. Once a size has failed, bisection
  // closes the bracket; a point that does not fit at its own mb searches
  // below it. Every size named fits by simulation; a bracket left open after
  // kSearchRuns runs (which convexity rules out) reports the largest size
  // simulated to fit.
  int largest_micro_batch(const ScaleCase& p, bool fits, int64_t peak_at_mb) const {
    constexpr int kSearchRuns = 40, kMaxMicroBatch = 4096;
    const int64_t cap = m_hw.memory_bytes;
    // lo fits (0: nothing yet); hi fails, or is past the search.
    int lo = fits ? p.micro_batch : 0, hi = fits ? kMaxMicroBatch + 1 : p.micro_batch;
    bool failed = !fits;
    int64_t peak_lo = fits ? peak_at_mb : -1, slope = -1;  // bytes per sequence between the last two fitting sizes
    for (int run = 0; run < kSearchRuns && hi - lo > 1; ++run) {
      int guess = lo + 1;
      if (failed) guess = lo + (hi - lo) / 2;
      else if (slope == 0) guess = 2 * lo;
      else if (slope > 0) guess = int(std::min<int64_t>(hi - 1, lo + (cap - peak_lo) / slope));
      guess = std::clamp(guess, lo + 1, hi - 1);
      ScaleCase q = p;
      q.micro_batch = guess;
      const int64_t peak = peak_of(q);
      if (peak >= 0 && peak <= cap) {
        if (peak_lo >= 0) slope = std::max<int64_t>(0, (peak - peak_lo) / (guess - lo));
        lo = guess;
        peak_lo = peak;
      } else {
        hi = guess;
        failed = true;
      }
    }
    return lo;
  }

 private:
  // The peak of a run without its timeline; -1 when the strategy refuses
  // the size (a usage error). Any other failure ends the sweep.
  int64_t peak_of(const ScaleCase& p) const {
    try {
      const proto::RunStats st = proto::analyze(run_point(p, false));
      if (st.status == "ok") return st.max_peak();
      if (!st.errors.empty() && st.errors.front().code == "usage") return -1;
      throw std::runtime_error(p.v.strategy + " at " + std::to_string(p.seq_len) + " tokens, micro-batch " +
                               std::to_string(p.micro_batch) + ": " +
                               (st.errors.empty() ? "the run ended " + st.status : st.errors.front().message));
    } catch (const UsageError&) {
      return -1;
    }
  }

  // Steps of a training point's run. The second can hold more than the
  // first (tsp's communication buffers, kept from the first step's
  // backward, beside the second's forward), and every later step repeats
  // the second's shapes: two give the peak a long run reaches, as `check`
  // forecasts it (forecast_training).
  static constexpr int kTrainSteps = 2;

  // The options of the point's run: training's or inference's.
  TrainOptions train_options(const ScaleCase& p) const {
    TrainOptions t;
    fill_run(t.run, p);
    t.steps = kTrainSteps;
    t.seq_len = p.seq_len;
    t.micro_batch = p.micro_batch;
    t.recompute = m_o.recompute;
    t.hardware = m_o.hardware;
    t.nodes = p.v.nodes;
    return t;
  }
  RunOptions infer_options(const ScaleCase& p) const {
    RunOptions r;
    fill_run(r, p);
    r.prompt_len = p.seq_len;
    r.decode = m_o.decode;
    r.attention = m_o.attention;
    // dp gives each device its own sequences: micro_batch of them per device.
    r.batch = p.micro_batch * (p.v.strategy == "dp" ? p.v.devices : 1);
    return r;
  }

  // The point's whole run; without `timeline`, only its summary records
  // (peaks), and untimed: its ranks' collectives do not wait for each other
  // (RunOptions::timeline). On this 2-core VM those meetings were 12 s of the
  // default sweep's 74, 8 rank threads handing the cores to each other at
  // every collective.
  std::vector<proto::Event> run_point(const ScaleCase& p, bool timeline = true) const {
    if (m_o.mode == "train") {
      TrainOptions t = train_options(p);
      t.run.timeline = timeline;
      return capture_stream([&](proto::Writer& w) { return simulate_training(t, w); });
    }
    RunOptions r = infer_options(p);
    r.timeline = timeline;
    return capture_stream([&](proto::Writer& w) { return ss::simulate(r, m_hw, p.v.nodes, 1, w); });
  }

  void fill_run(RunOptions& r, const ScaleCase& p) const {
    r.model = m_o.model;
    r.overrides = m_o.overrides;
    r.strategy = p.v.strategy;
    r.devices = p.v.devices;
    r.mesh = p.v.mesh;
    r.dtype = m_o.dtype;
    r.seed = m_o.seed;
    // A refusal speaks of the point: its length (one of --seq-lens) and micro-batch, not a run's options.
    r.shape_names = ShapeFlags{"the length", "micro-batch"};
    for_simulation(r);  // untimed unless run_point asks for its timeline
  }

 public:
  // Refuses, before any point runs, what no strategy could run: each
  // length's plan on one device (a usage error here is the options', not a
  // strategy's).
  void check(const std::vector<int64_t>& lengths) const {
    for (int64_t L : lengths) {
      const ScaleCase p{{"single", "", 1, 1}, L, 1};
      if (m_o.mode == "train") plan_training(train_options(p));
      else plan_inference(infer_options(p), "sim");
    }
  }

  const ScaleOptions& m_o;
  HardwareProfile m_hw;
  ModelConfig m_cfg;
};

}  // namespace

std::vector<ScaleVariant> scale_variants(const ScaleOptions& o) {
  std::vector<std::string> names = o.strategies;
  if (names.empty()) names = {"single", "dp", "tp", "sp", "tp_sp", "tsp"};
  std::vector<ScaleVariant> out;
  for (const std::string& n : names) {
    parse_strategy(n);  // a name that is none: UsageError listing the choices
    if (n == "single") {
      out.push_back({"single", "", 1, 1});
    } else if (n == "tp_sp") {
      for (int t = 2; t < o.devices; ++t)
        if (o.devices % t == 0) out.push_back({"tp_sp", std::to_string(t) + "x" + std::to_string(o.devices / t), o.devices, o.nodes});
    } else if (o.devices > 1) {
      out.push_back({n, "", o.devices, o.nodes});
    }
  }
  return out;
}

void print_scale_table(const std::vector<proto::ScalePoint>& pts, std::ostream& os) {
  // Rows in the sweep's order of strategies (tp_sp by mesh), columns by length, a table per micro-batch.
  static const std::vector<std::string> order = {"single", "dp", "tp", "sp", "tp_sp", "tsp"};
  auto rank = [&](const std::string& s) { return std::find(order.begin(), order.end(), s) - order.begin(); };
  using Row = std::pair<std::string, std::string>;
  std::set<Row> row_set;
  std::set<int64_t> length_set;
  std::set<int> batch_set;
  std::map<std::tuple<std::string, std::string, int64_t, int>, const proto::ScalePoint*> at;
  int64_t capacity = 0;
  for (auto& p : pts) {
    row_set.insert({p.strategy, p.mesh});
    length_set.insert(p.seq_len);
    batch_set.insert(p.micro_batch);
    at[{p.strategy, p.mesh, p.seq_len, p.micro_batch}] = &p;
    capacity = std::max(capacity, p.capacity);
  }
  // A stream written by hand may hold any number of them: a table is for what a sweep makes.
  constexpr size_t kMaxCells = 100000;
  if (row_set.size() * length_set.size() * batch_set.size() > kMaxCells || row_set.size() > 1000 ||
      length_set.size() > 1000) {
    os << pts.size() << " points over " << row_set.size() << " strategies and " << length_set.size()
       << " lengths: too many to tabulate\n";
    return;
  }
  std::vector<Row> rows(row_set.begin(), row_set.end());
  std::sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) {
    // tp_sp by its mesh's T (strtoll clamps what a hand-written stream may hold)
    return rank(a.first) != rank(b.first) ? rank(a.first) < rank(b.first)
                                          : std::strtoll(a.second.c_str(), nullptr, 10) < std::strtoll(b.second.c_str(), nullptr, 10);
  });
  // In the unit of the largest peak: a tiny model's KiB are not 0.0 GiB.
  int64_t largest = 0;
  for (auto& p : pts)
    if (p.applicable()) largest = std::max(largest, p.peak_bytes);
  const auto [unit, unit_bytes] = largest >= (int64_t(1) << 30) ? std::pair{"GiB", double(1 << 30)}
                                  : largest >= (int64_t(1) << 20) ? std::pair{"MiB", double(1 << 20)}
                                                                   : std::pair{"KiB", 1024.0};
  char buf[64];
  for (int mb : batch_set) {
    os << "peak memory per device (" << unit << "; "
       << (capacity > 0 ? "* does not fit the " + format_bytes(capacity) + " device; " : std::string())
       << "- not applicable), micro-batch " << mb << "\n";
    std::snprintf(buf, sizeof buf, "%-12s", "strategy");
    os << buf;
    for (int64_t L : length_set) {
      std::snprintf(buf, sizeof buf, "%10s", (L % 1024 == 0 ? std::to_string(L / 1024) + "K" : std::to_string(L)).c_str());
      os << buf;
    }
    os << "\n";
    for (auto& [strategy, mesh] : rows) {
      std::snprintf(buf, sizeof buf, "%-12.40s", (mesh.empty() ? strategy : strategy + " " + mesh).c_str());
      os << buf;
      for (int64_t L : length_set) {
        auto it = at.find({strategy, mesh, L, mb});
        if (it == at.end() || !it->second->applicable()) std::snprintf(buf, sizeof buf, "%10s", "-");
        else
          std::snprintf(buf, sizeof buf, "%9.1f%s", double(it->second->peak_bytes) / unit_bytes,
                        it->second->fits ? " " : "*");
        os << buf;
      }
      os << "\n";
    }
  }
}

int run_scale(const ScaleOptions& o, proto::Writer& out, std::ostream& progress, std::ostream* table) {
  if (o.mode != "train" && o.mode != "infer") throw UsageError("--mode must be train or infer");
  if (o.devices < 1 || o.devices > 1024) throw UsageError("--devices must be between 1 and 1024");
  check_nodes(o.nodes, o.devices);
  if (o.mode == "train") parse_recompute(o.recompute);
  if (o.mode == "train" && o.dtype == DType::F16)
    throw UsageError("--dtype fp16 training needs loss scaling, which is not built; use --dtype bf16 or fp32");
  if (o.decode < 0) throw UsageError("--decode must be >= 0");
  const std::vector<int64_t> lengths = o.seq_lens.empty() ? default_lengths() : o.seq_lens;
  for (int64_t L : lengths)
    if (L < 1 || L > (int64_t(1) << 24)) throw UsageError("--seq-lens: " + std::to_string(L) + " is not between 1 and 16M");
  for (int mb : o.micro_batches)
    if (mb < 1 || mb > 4096) throw UsageError("--micro-batches: " + std::to_string(mb) + " is not between 1 and 4096");
  const HardwareProfile hw = load_hardware(o.hardware);
  const int per_node = o.devices / o.nodes;
  if (per_node > hw.max_devices_per_node)
    throw UsageError(std::to_string(per_node) + " devices per node exceed the profile's " +
                     std::to_string(hw.max_devices_per_node) + "; raise --nodes");
  ModelConfig cfg = resolve_model(o.model, nullptr, o.overrides);
  cfg.dtype = o.dtype;
  cfg.kv_dtype = o.dtype;
  const std::vector<ScaleVariant> variants = scale_variants(o);
  if (variants.empty()) throw UsageError("--strategies: none of them runs on --devices " + std::to_string(o.devices));

  std::vector<ScaleCase> points;
  for (auto& v : variants)
    for (int64_t L : lengths)
      for (int mb : o.micro_batches) points.push_back({v, L, mb});

  const Sweep sweep(o, hw, cfg);
  sweep.check(lengths);
#ifdef __GLIBC__
  // Dozens of short-lived rank threads would each get a malloc arena of
  // their own and keep its high-water mark: two arenas hold the default
  // sweep's peak RSS (batch search off) at 0.53 GB instead of 0.88, and run
  // it no slower.
  mallopt(M_ARENA_MAX, 2);
#endif

  const auto t0 = std::chrono::steady_clock::now();
  out.write(proto::Hello{proto::kVersion, engine_version(), host_name()});
  nlohmann::json strategies = nlohmann::json::array();
  for (auto& v : variants) strategies.push_back(v.mesh.empty() ? v.strategy : v.strategy + ":" + v.mesh);
  out.write(proto::Config{{{"scale",
                            {{"mode", o.mode},
                             {"seq_lens", lengths},
                             {"micro_batches", o.micro_batches},
                             {"strategies", strategies},
                             {"recompute", o.recompute},
                             {"decode", o.decode},
                             {"search_micro_batch", o.search_micro_batch},
                             {"model", o.model},
                             {"overrides", o.overrides}}},
                           {"model", cfg.to_json()},
                           {"backend", "sim"},
                           {"hardware", hw.source},
                           {"hardware_file", hw.file},
                           {"devices", o.devices},
                           {"nodes", o.nodes},
                           {"capacity", hw.memory_bytes},
                           {"dtype", std::string(compute_dtype_name(o.dtype))},
                           {"seed", o.seed},
                           {"command", invocation()}}});
  out.flush();

  // Points run on `jobs` threads (each simulation runs its ranks as threads
  // of its own) and are written as they finish.
  const int jobs = std::max(1, std::min<int>(o.jobs > 0 ? o.jobs : int(std::thread::hardware_concurrency()),
                                             int(points.size())));
  std::atomic<size_t> next{0};
  std::mutex out_mutex;
  size_t done = 0, fitting = 0;
  std::vector<proto::ScalePoint> finished;
  std::exception_ptr failure;
  auto worker = [&] {
    for (size_t i = next++; i < points.size(); i = next++) {
      try {
        proto::ScalePoint sp = sweep.simulate(points[i]);
        if (sp.applicable()) {
          sp.textbook = sweep.textbook_of(points[i]);
          if (o.mode == "train" && o.search_micro_batch)
            sp.max_micro_batch = sweep.largest_micro_batch(points[i], sp.fits, sp.peak_bytes);
        }
        std::lock_guard lock(out_mutex);
        if (table) finished.push_back(sp);
        out.write(sp);
        out.flush();
        ++done;
        fitting += sp.fits;
        const std::string name = sp.mesh.empty() ? sp.strategy : sp.strategy + " " + sp.mesh;
        progress << "scale: " << done << "/" << points.size() << "  " << name << " at " << sp.seq_len << " tokens: "
                 << (sp.applicable() ? format_bytes(sp.peak_bytes) + (sp.fits ? " (fits)" : " (does not fit)")
                                     : "not applicable: " + sp.reason)
                 << "\n"
                 << std::flush;
      } catch (...) {
        std::lock_guard lock(out_mutex);
        if (!failure) failure = std::current_exception();
        next = points.size();
      }
    }
  };
  std::vector<std::thread> threads;
  for (int j = 0; j < jobs; ++j) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      out.write(proto::Error{"internal", -1, e.what(), nullptr});
      out.write(proto::Done{"failed", 0, kExitFailure});
      out.flush();
      throw;
    }
  }

  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (table) print_scale_table(finished, *table);
  out.write(proto::Metric{"points", double(points.size()), "count", -1});
  out.write(proto::Metric{"points_fitting", double(fitting), "count", -1});
  out.write(proto::Metric{"wall_s", wall, "s", -1});
  out.write(proto::Metric{"peak_rss_bytes", double(peak_rss_bytes()), "bytes", -1});
  out.write(proto::Done{"ok", int64_t(wall * 1e9), kExitOk});
  out.flush();
  return kExitOk;
}

}  // namespace ss
