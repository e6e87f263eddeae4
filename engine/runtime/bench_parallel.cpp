#include "runtime/bench_parallel.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "comm/mpi_bench.h"
#include "comm/mpi_communicator.h"
#include "comm/quantized_all_reduce.h"
#include "core/allocator.h"
#include "cpu/cpu_backend.h"
#include "protocol/analysis.h"
#include "runtime/calibrate.h"
#include "runtime/calibrate_common.h"
#include "runtime/process.h"
#include "runtime/run.h"

#include <chrono>
#include <sstream>

namespace ss {
namespace {

std::vector<proto::Event> read_stream(const std::string& path) {
  std::vector<proto::Event> out;
  proto::Reader reader;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    auto r = reader.parse_line(line);
    if (r.event) out.push_back(std::move(*r.event));
  }
  return out;
}

// Hidden share of the comm spans whose op is in `ops`, over all ranks.
double hidden_fraction(const std::vector<proto::Event>& ev, const std::set<std::string>& ops) {
  std::map<int, std::vector<std::pair<int64_t, int64_t>>> comm, compute;
  for (auto& e : ev)
    if (auto* s = std::get_if<proto::Span>(&e)) {
      if (s->stream == "comm" && ops.count(s->op)) comm[s->rank].emplace_back(s->t0, s->t1);
      else if (s->stream == "compute") compute[s->rank].emplace_back(s->t0, s->t1);
    }
  double total = 0, hidden = 0;
  for (auto& [r, iv] : comm) {
    total += proto::union_ns(iv);
    hidden += proto::overlap_ns(iv, compute[r]);
  }
  return total > 0 ? hidden / total : 0;
}

// The prefill attention time of the slowest rank over the fastest's: 1 where
// the causal work is even (tp's heads; sp's and tsp's zigzag chunks, with
// the kernel trimming each run of gathered keys); NAN without attention.
double attention_imbalance(const std::vector<proto::Event>& ev) {
  std::map<int, double> per_rank;
  for (auto& e : ev)
    if (auto* s = std::get_if<proto::Span>(&e); s && s->op == "attention" && s->phase == "prefill")
      per_rank[s->rank] += double(s->t1 - s->t0);
  double lo = INFINITY, hi = 0;
  for (auto& [r, t] : per_rank) lo = std::min(lo, t), hi = std::max(hi, t);
  return per_rank.empty() || !(lo > 0) ? NAN : hi / lo;
}

int mesh_side(int d) {
  int t = int(std::sqrt(double(d)));
  while (t > 1 && d % t) --t;
  return t;
}

// Runs `shardscope-engine ARGS --events FILE` as its own process: its wall
// time, peak RSS and exit code, and the lines of FILE that contain `count`.
struct Measured {
  double wall_s = 0, rss_mb = 0;
  int64_t lines = 0;
  int rc = 0;
};
Measured run_measured(const std::string& args, const std::string& count = "") {
  char tmpl[] = "/tmp/shardscope-simbench-XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd >= 0) close(fd);
  const std::string cmd = "/usr/bin/env time -f %M -o '" + std::string(tmpl) + ".rss' '" + self_exe() + "' " + args +
                          " --events '" + tmpl + "' >/dev/null 2>&1";
  Measured m;
  const auto t0 = std::chrono::steady_clock::now();
  m.rc = std::system(cmd.c_str());
  m.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  {
    std::ifstream in(tmpl);
    std::string l;
    while (std::getline(in, l)) m.lines += l.find(count) != std::string::npos;
  }
  {
    std::ifstream r(std::string(tmpl) + ".rss");
    double kb = 0;
    if (r >> kb) m.rss_mb = kb / 1024;
  }
  std::filesystem::remove(tmpl);
  std::filesystem::remove(std::string(tmpl) + ".rss");
  return m;
}

}  // namespace

int run_strategy_bench(const StrategyBenchOptions& o, std::ostream& out) {
  char line[512];
  out << "shardscope-engine bench --strategies  host " << host_name() << ", " << o.devices
      << " cpu devices (one MPI rank each, " << sysconf(_SC_NPROCESSORS_ONLN) << " cores), prompt " << o.prompt_len
      << ", decode " << o.decode << "\n";
  out << "bytes/token: wire bytes of all ranks per processed token; hidden: share of comm time overlapped by compute "
         "(ring/bcast: tsp's weight transfers only); attn max/min: the prefill attention time of the slowest rank "
         "over the fastest's; peaks per rank in MiB (max over ranks)\n";
  for (const auto& model : o.models) {
    out << "\n" << model << "\n";
    std::snprintf(line, sizeof line, "%-7s %3s %10s %10s %12s %7s %10s %12s %9s %9s %9s %9s %9s %9s\n", "strategy",
                  "D", "prefill/s", "decode/s", "bytes/token", "hidden", "ring/bcast", "attn max/min", "weights",
                  "activ.", "kv", "ssm", "comm buf", "peak");
    out << line;
    for (const auto& s : o.strategies) {
      const bool single = s == "single";
      const int d = single ? 1 : o.devices;
      char tmpl[] = "/tmp/shardscope-bench-XXXXXX";
      const int fd = mkstemp(tmpl);
      if (fd >= 0) close(fd);
      std::string cmd = "'" + self_exe() + "' " + (single ? "run" : "launch") + " --model " + model + " --strategy " + s +
                        " --devices " + std::to_string(d) + " --prompt-len " + std::to_string(o.prompt_len) +
                        " --decode " + std::to_string(o.decode) + " --events " + tmpl;
      if (s == "tp_sp") {
        const int t = mesh_side(d);
        cmd += " --mesh " + std::to_string(t) + "x" + std::to_string(d / t);
      }
      const std::string err = std::string(tmpl) + ".err";
      cmd += " 2>'" + err + "'";
      const int rc = std::system(cmd.c_str());
      const auto ev = read_stream(tmpl);
      std::string first_err;
      {
        std::ifstream e(err);
        std::getline(e, first_err);
      }
      std::filesystem::remove(tmpl);
      std::filesystem::remove(err);
      const proto::RunStats st = proto::analyze(ev);
      if (st.status != "ok") {
        const std::string why = !st.errors.empty() ? st.errors.front().message
                                : !first_err.empty() ? first_err
                                                     : "exit " + std::to_string(rc);
        std::snprintf(line, sizeof line, "%-7s %3d  %s: %s\n", s.c_str(), d, st.status.empty() ? "failed" : st.status.c_str(),
                      why.substr(0, 160).c_str());
        out << line << std::flush;
        continue;
      }
      std::array<int64_t, proto::kCategoryCount> peak{};
      int64_t peak_total = 0;
      for (auto& [r, rs] : st.ranks) {
        for (int c = 0; c < proto::kCategoryCount; ++c) peak[size_t(c)] = std::max(peak[size_t(c)], rs.peak[size_t(c)]);
        peak_total = std::max(peak_total, rs.peak_total);
      }
      auto metric = [&](const char* n) { return st.metrics.count(n) ? st.metrics.at(n) : 0.0; };
      const double tokens = double(o.prompt_len + o.decode);
      const double ring = s == "tsp" ? hidden_fraction(ev, {"broadcast", "sendrecv"}) : NAN;
      char ringbuf[16];
      if (std::isnan(ring)) std::snprintf(ringbuf, sizeof ringbuf, "-");
      else std::snprintf(ringbuf, sizeof ringbuf, "%.0f%%", 100 * ring);
      const double imbalance = attention_imbalance(ev);
      char attnbuf[16];
      if (std::isnan(imbalance)) std::snprintf(attnbuf, sizeof attnbuf, "-");
      else std::snprintf(attnbuf, sizeof attnbuf, "%.2fx", imbalance);
      std::snprintf(line, sizeof line, "%-7s %3d %10.1f %10.2f %12.0f %6.0f%% %10s %12s %9s %9s %9s %9s %9s %9s\n",
                    s.c_str(), d, metric("prefill_tokens_per_s"), metric("decode_tokens_per_s"), st.comm_bytes / tokens,
                    100 * st.hidden_fraction(), ringbuf, attnbuf, mib(double(peak[0])).c_str(), mib(double(peak[1])).c_str(),
                    mib(double(peak[2])).c_str(), mib(double(peak[3])).c_str(), mib(double(peak[4])).c_str(),
                    mib(double(peak_total)).c_str());
      out << line << std::flush;
    }
  }
  return 0;
}

namespace {

// Simulated against measured end to end: TTFT and decode time per token of
// every strategy on 2 and 4 cpu ranks, on profiles calibrated in this run for
// that many ranks (every strategy's GEMM shapes, contention included).
//
// This host is shared, and what the neighbours leave of its memory bandwidth
// drifts over minutes: one-row GEMMs, which decode is made of, came out 30%
// slower in one calibration of three taken a minute apart, and the launches
// move with them. So the launches go in rounds (every strategy once a round),
// calibrations come between them (before every kCalibrateEvery-th round and
// after the last), and each strategy's simulated time is the median over the
// calibrations, set against the median over the launches of the same span.
// Bursts of load from elsewhere last seconds: of two benches with 4 rounds
// and 3 calibrations, each missed one figure of 14 by a burst alone (one
// calibration simulated tp's first token on 4 ranks at 1,044 ms, the other
// two at 710 and 841, against launches of 651-985), so there are 4
// calibrations, and a median stands past one burst on either side. Launches
// back to back spread more than calibrations do (tp's decode on 4 ranks:
// 23.5, 28.3 and 34.8 ms a token in three launches within a minute, against
// 28.4-31.5 simulated from four calibrations over ten), and a launch costs
// seconds where a calibration costs a minute: 12 rounds of launches, a
// calibration before every fourth.
int end_to_end_check(const SimBenchOptions& o, std::ostream& out) {
  // Rounds of launches, and a calibration before every kCalibrateEvery-th round and after the last.
  // A launch shares this host with whatever else runs on it, which only ever adds
  // time: on a shared 2-core VM the same tsp run measured 776 to 1,640 ms to its
  // first token within half an hour.
  constexpr int kRounds = 12, kCalibrateEvery = 4;
  static_assert(kRounds % kCalibrateEvery == 0, "the text below counts kRounds / kCalibrateEvery + 1 calibrations");
  char line[400];
  out << "\nSimulated vs measured end to end: " << o.check_model << ", prompt " << o.check_prompt
      << ", decode 8, on D cpu ranks of this host. Measured: median (and range) of " << kRounds
      << " launches with --warm-start (a first untimed prefill and decode step, so that, as in the simulator, buffers "
         "are not allocated and faulted in during the timed ones), and the fastest of them; the launches go in "
         "rounds, every strategy once a round. Simulated: median (and range) over " << kRounds / kCalibrateEvery + 1
      << " profiles calibrated for D ranks in this run, before every " << kCalibrateEvery
      << "th round and after the last. Goal: within "
         "15%\n";
  std::snprintf(line, sizeof line, "%-8s %2s %24s %8s %24s %7s %7s  %22s %8s %22s %7s %7s\n", "strategy", "D",
                "TTFT ms median (range)", "fastest", "simulated (range)", "error", "vs fast", "ms/token median (range)",
                "fastest", "simulated (range)", "error", "vs fast");
  out << line;
  const std::string base = "/tmp/shardscope-e2e-" + std::to_string(getpid());
  std::vector<std::string> files = {base + ".jsonl", base + ".err"};
  int failed = 0, figures = 0, near_median = 0, near_fastest = 0;  // within 15%
  for (int D : {2, 4}) {
    std::vector<std::pair<std::string, std::string>> runs = {{"tp", ""}, {"sp", ""}, {"tsp", ""}};
    if (D == 4) runs.emplace_back("tp_sp", " --mesh 2x2");
    auto args = [&](const std::pair<std::string, std::string>& r) {
      return " --model " + o.check_model + " --strategy " + r.first + r.second + " --devices " + std::to_string(D) +
             " --prompt-len " + std::to_string(o.check_prompt) + " --decode 8";
    };
    CalibrateOptions copt;
    for (auto& r : runs)
      add_run_shapes(copt, args(r), o.hardware);
    std::vector<std::string> profiles;
    std::string contention;
    auto calibrate_now = [&] {
      std::ostringstream calib_log;
      const nlohmann::json prof = calibrate_machine(calib_log, D, copt);
      profiles.push_back(base + "-" + std::to_string(D) + "-" + std::to_string(profiles.size()) + ".json");
      files.push_back(profiles.back());
      std::ofstream(profiles.back()) << prof.dump(2);
      const auto& dev = prof["device"];
      const auto& c = dev.value("contention", nlohmann::json::object());
      char b[200];
      if (const auto& ov = dev.value("overlap_steps", nlohmann::json::object()); !ov.empty()) {
        // More ranks than cores: the overlap steps stand for the contention (sim/sim_clock.h).
        std::string waits;
        for (const auto& [op, us] : ov["wait_us"].items()) {
          waits += (waits.empty() ? "" : " ") + op + " +";
          for (size_t i = 0; i < us.size(); ++i) waits += (i ? "/+" : "") + std::to_string(std::lround(us[i].get<double>()));
        }
        std::snprintf(b, sizeof b, "%swaits %s us", contention.empty() ? "" : "; ", waits.c_str());
      } else {
        std::snprintf(b, sizeof b, "%s%.0f%% / %.0f%% / %.0f us", contention.empty() ? "" : ", ",
                      100 * c.value("compute", 0.0), 100 * c.value("comm", 0.0), c.value("hold_us", 0.0));
      }
      contention += b;
    };
    std::string why;  // the last line a failed run wrote to stderr
    auto metrics = [&](const std::string& cmd) -> std::pair<double, double> {
      why.clear();
      if (std::system((cmd + " --events " + base + ".jsonl >/dev/null 2>" + base + ".err").c_str()) != 0) {
        std::ifstream err(base + ".err");
        for (std::string l; std::getline(err, l);)
          if (!l.empty()) why = l;
        return {NAN, NAN};
      }
      const auto st = proto::analyze(read_stream(base + ".jsonl"));
      auto m = [&](const char* n) { return st.metrics.count(n) ? st.metrics.at(n) : NAN; };
      return {m("ttft_ms"), m("decode_ms_per_token")};
    };
    std::vector<std::vector<double>> ttft(runs.size()), tok(runs.size());
    std::vector<std::string> launch_why(runs.size());
    for (int round = 0; round < kRounds; ++round) {
      if (round % kCalibrateEvery == 0) calibrate_now();
      for (size_t i = 0; i < runs.size(); ++i) {
        const auto [a, b] = metrics("'" + self_exe() + "' launch" + args(runs[i]) + " --warm-start");
        if (std::isnan(a)) {
          launch_why[i] = why;
          continue;
        }
        ttft[i].push_back(a);
        tok[i].push_back(b);
      }
    }
    calibrate_now();
    out << "(D = " << D << ": contention compute / comm / hold of the calibrations, or with more ranks than "
           "cores the overlap steps' waits past each collective: " << contention << ")\n"
        << std::flush;
    struct Cell {
      double median = NAN, fastest = NAN;
      std::string text;
    };
    auto cell = [](const std::vector<double>& v) {
      const double med = median(v);
      const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
      char b[64];
      std::snprintf(b, sizeof b, "%.1f (%.1f-%.1f)", med, *lo, *hi);
      return Cell{med, *lo, b};
    };
    for (size_t i = 0; i < runs.size(); ++i) {
      const auto& r = runs[i];
      std::vector<double> sim_ttft, sim_tok;
      for (const std::string& prof : profiles) {
        const auto [sa, sb] = metrics("'" + self_exe() + "' simulate --hardware '" + prof + "'" + args(r));
        if (std::isnan(sa)) break;
        sim_ttft.push_back(sa);
        sim_tok.push_back(sb);
      }
      if (ttft[i].empty() || sim_ttft.size() != profiles.size()) {
        const std::string& w = ttft[i].empty() ? launch_why[i] : why;
        out << r.first << " D=" << D << ": the " << (ttft[i].empty() ? "measured" : "simulated") << " run failed ("
            << (w.empty() ? "no message" : w) << ")\n";
        ++failed;
        continue;
      }
      const Cell t = cell(ttft[i]), d = cell(tok[i]), st = cell(sim_ttft), sd = cell(sim_tok);
      for (const auto& [measured, simulated] : {std::pair{t, st}, std::pair{d, sd}}) {
        ++figures;
        near_median += std::abs(simulated.median / measured.median - 1) <= 0.15;
        near_fastest += std::abs(simulated.median / measured.fastest - 1) <= 0.15;
      }
      std::snprintf(line, sizeof line,
                    "%-8s %2d %24s %8.1f %24s %+6.0f%% %+6.0f%%  %22s %8.1f %22s %+6.0f%% %+6.0f%%\n", r.first.c_str(), D,
                    t.text.c_str(), t.fastest, st.text.c_str(), 100 * (st.median / t.median - 1),
                    100 * (st.median / t.fastest - 1), d.text.c_str(), d.fastest, sd.text.c_str(),
                    100 * (sd.median / d.median - 1), 100 * (sd.median / d.fastest - 1));
      out << line << std::flush;
    }
  }
  for (const auto& f : files) std::filesystem::remove(f);
  out << "within 15%: " << near_median << " of " << figures << " figures against the median launch, " << near_fastest
      << " of " << figures << " against the fastest\n";
  out << "error: simulated median / measured median - 1; vs fast: simulated median / fastest launch - 1. Each "
         "profile's kernel times are the median of three passes, measured with every rank measuring at once, its "
         "collectives' on data from memory; its contention figures hold a collective posted beside kernels until "
         "they wait (or the hold passes) and slow the overlapped part of each stream after; with more ranks than "
         "cores its overlap steps do instead (a collective posted beside kernels waits for them, then takes longer "
         "than alone by what calibrate measured). Bursts of load from "
         "elsewhere on the host drop out of those medians, while a launch pays for every burst in its span (which "
         "only ever adds time): the fastest launch is the one that paid least.\n";
  return failed ? 1 : 0;
}

}  // namespace

void set_sim_check(SimBenchOptions& o, const std::string& spec) {
  const auto bad = [&] {
    return UsageError("--sim-check " + spec + ": give STRATEGY:D[:MESH] with D of 2 or more, e.g. tsp:4 or tp_sp:4:2x2");
  };
  const size_t a = spec.find(':');
  if (a == 0 || a == std::string::npos) throw bad();
  const size_t b = spec.find(':', a + 1);
  const std::string d = spec.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1);
  if (d.empty() || d.size() > 4 || d.find_first_not_of("0123456789") != std::string::npos || std::stoi(d) < 2) throw bad();
  o.check_strategy = spec.substr(0, a);
  o.check_devices = std::stoi(d);
  o.check_mesh = b == std::string::npos ? "" : spec.substr(b + 1);
  if (b != std::string::npos && o.check_mesh.empty()) throw bad();
  // Both go into the commands the bench runs: a strategy's name, a mesh's TxS.
  if (o.check_strategy.find_first_not_of("abcdefghijklmnopqrstuvwxyz_") != std::string::npos ||
      o.check_mesh.find_first_not_of("0123456789x") != std::string::npos)
    throw bad();
}

int run_sim_bench(const SimBenchOptions& o, std::ostream& out) {
  char line[512];
  out << "shardscope-engine bench --sim  host " << host_name() << "\n\nSimulator speed (wall time of the whole simulate "
         "command, one process, one thread per rank)\n";
  std::snprintf(line, sizeof line, "%-34s %4s %9s %9s %10s %12s %10s\n", "run", "D", "prompt", "wall s", "events",
                "events/s", "max RSS MB");
  out << line;
  if (o.accuracy_only) out << "(skipped: --sim-accuracy)\n";
  struct Case {
    std::string label, model, strategy, mesh;
    int devices;
    int64_t prompt;
  };
  const std::vector<Case> cases = {
      {"llama2-7b tsp, " + o.hardware, "llama2-7b", "tsp", "", 8, 131072},
      {"llama2-7b tp, " + o.hardware, "llama2-7b", "tp", "", 8, 131072},
      {"llama2-7b tp_sp 8x8, 8 nodes, " + o.hardware, "llama2-7b", "tp_sp", "8x8", 64, 32768},
      {"mamba2-2.7b sp, " + o.hardware, "mamba2-2.7b", "sp", "", 4, 65536},
  };
  for (const Case& c : o.accuracy_only ? std::vector<Case>{} : cases) {
    const Measured m =
        run_measured("simulate --hardware " + o.hardware + " --model " + c.model + " --strategy " + c.strategy +
                     " --devices " + std::to_string(c.devices) + " --prompt-len " + std::to_string(c.prompt) +
                     " --decode 4" + (c.mesh.empty() ? "" : " --mesh " + c.mesh) + " --nodes " +
                     std::to_string(std::max(1, c.devices / 8)));
    std::snprintf(line, sizeof line, "%-34s %4d %9lld %9.2f %10lld %12.0f %10.0f%s\n", c.label.c_str(), c.devices,
                  static_cast<long long>(c.prompt), m.wall_s, static_cast<long long>(m.lines), m.lines / m.wall_s,
                  m.rss_mb, m.rc == 0 ? "" : "  (failed)");
    out << line << std::flush;
  }

  // The scaling sweep (`scale`): the default one, and without the batch search.
  out << "\nScaling sweep: llama2-7b, 8 x mi300x, train bf16, lengths 4K..1M, every strategy (goal: under 60 s "
         "and 1 GB)\n";
  std::snprintf(line, sizeof line, "%-34s %7s %9s %9s %10s\n", "sweep", "points", "wall s", "points/s", "max RSS MB");
  out << line;
  for (const std::string& extra : o.accuracy_only ? std::vector<std::string>{} : std::vector<std::string>{"", " --no-batch-search"}) {
    const Measured m = run_measured("scale --model llama2-7b --hardware mi300x --devices 8" + extra, "\"scale_point\"");
    std::snprintf(line, sizeof line, "%-34s %7lld %9.2f %9.2f %10.0f%s\n",
                  extra.empty() ? "default (largest micro-batch too)" : "--no-batch-search",
                  static_cast<long long>(m.lines), m.wall_s, m.lines / m.wall_s, m.rss_mb, m.rc == 0 ? "" : "  (failed)");
    out << line << std::flush;
  }

  // Simulated against measured, on this machine.
  out << "\nSimulated vs measured per-op time: " << o.check_model << ", " << o.check_strategy
      << (o.check_mesh.empty() ? "" : " " + o.check_mesh) << " on " << o.check_devices << " cpu ranks, prompt "
      << o.check_prompt << ", decode 8; profile calibrated in this run\n" << std::flush;
  const std::string base = "/tmp/shardscope-simcheck-" + std::to_string(getpid());
  const std::string common = " --model " + o.check_model + " --strategy " + o.check_strategy +
                             (o.check_mesh.empty() ? "" : " --mesh " + o.check_mesh) + " --devices " +
                             std::to_string(o.check_devices) + " --prompt-len " + std::to_string(o.check_prompt) +
                             " --decode 8";
  auto simulate = [&](const std::string& hw, const std::string& events) {
    return std::system(("'" + self_exe() + "' simulate --hardware '" + hw + "'" + common + " --events '" + events +
                        "' 2>/dev/null").c_str());
  };
  // The GEMM shapes this model and strategy use, from a simulation (any
  // profile gives the same shapes): calibrate measures them besides its grid.
  CalibrateOptions copt;
  add_run_shapes(copt, common, o.hardware);
  std::ostringstream calib_log;
  const nlohmann::json prof = calibrate_machine(calib_log, o.check_devices, copt);
  out << calib_log.str();
  std::ofstream(base + ".profile.json") << prof.dump(2);
  // The same profile with the GEMM grid only (what `calibrate` writes).
  std::ofstream(base + ".grid.json") << grid_only(prof).dump(2);
  // The host's load around the measured run: other processes on these cores
  // stretch its spans (and its ranks' waits) beyond what calibrate measured.
  auto loadavg = [] {
    std::ifstream f("/proc/loadavg");
    double one = -1;
    f >> one;
    return one;
  };
  const double load0 = loadavg();
  const int rc1 = std::system(("'" + self_exe() + "' launch" + common + " --events " + base + ".cpu 2>/dev/null").c_str());
  const double load1 = loadavg();
  {
    char l[200];
    std::snprintf(l, sizeof l, "host load (1-min average) before / after the measured run: %.2f / %.2f on %ld cores\n",
                  load0, load1, sysconf(_SC_NPROCESSORS_ONLN));
    out << l;
  }
  const int rc2 = simulate(base + ".profile.json", base + ".sim");
  const int rc3 = simulate(base + ".grid.json", base + ".simgrid");
  const auto real = read_stream(base + ".cpu"), sim = read_stream(base + ".sim"), simgrid = read_stream(base + ".simgrid");
  for (auto ext : {".cpu", ".sim", ".simgrid", ".profile.json", ".grid.json"}) std::filesystem::remove(base + ext);
  if (rc1 || rc2 || rc3) {
    out << "the measured or simulated run failed\n";
    return 1;
  }
  // Pair spans per rank and stream in order: the same code issues them.
  auto by_rank = [](const std::vector<proto::Event>& ev) {
    std::map<std::pair<int, std::string>, std::vector<proto::Span>> m;
    for (auto& e : ev)
      if (auto* s = std::get_if<proto::Span>(&e)) m[{s->rank, s->stream}].push_back(*s);
    return m;
  };
  auto kind = [](const std::string& stream, const proto::Span& a) {
    return stream + ":" + a.op + (a.phase == "decode" ? " (decode)" : "");
  };
  const auto R = by_rank(real);
  std::map<std::string, double> meas_total;
  int64_t mismatched = 0;
  // op kind -> relative errors of each span (simulated against measured).
  auto errors = [&](const std::vector<proto::Event>& simulated, bool count) {
    const auto S = by_rank(simulated);
    std::map<std::string, std::vector<double>> err;
    for (auto& [key, rs] : R) {
      auto it = S.find(key);
      if (it == S.end() || it->second.size() != rs.size()) {
        if (count) ++mismatched;
        continue;
      }
      for (size_t i = 0; i < rs.size(); ++i) {
        const auto& a = rs[i];
        const auto& b = it->second[i];
        if (a.op != b.op) {
          if (count) ++mismatched;
          continue;
        }
        const double m = double(a.t1 - a.t0), p = double(b.t1 - b.t0);
        const std::string k = kind(key.second, a);
        if (count) meas_total[k] += m;
        if (m > 0) err[k].push_back((p - m) / m);
      }
    }
    // Collectives once more, as the cost model defines their time: from
    // the last participant's arrival to the last one's end. A rank's own span
    // also holds its wait for the others, which is the other ranks' compute.
    auto instances = [&](const std::vector<proto::Event>& ev) {
      // The i-th collective of a kind over the same members, on each member.
      std::map<std::tuple<std::string, int, std::vector<int>>, int> seen;
      std::map<std::tuple<std::string, std::vector<int>, int>, std::vector<const proto::Span*>> inst;
      for (auto& e : ev)
        if (auto* s = std::get_if<proto::Span>(&e); s && s->stream == "comm") {
          std::vector<int> members = s->peers;
          members.push_back(s->rank);
          std::sort(members.begin(), members.end());
          const std::string k = kind("comm", *s) + " (after last arrival)";
          const int n = seen[{k, s->rank, members}]++;
          inst[{k, members, n}].push_back(s);
        }
      // Each rank process starts its clock on its own: align the ranks on the
      // ends of their all-reduces, which all members reach within microseconds.
      std::map<int, std::vector<double>> skew;
      for (auto& [key, spans] : inst)
        if (std::get<0>(key).rfind("comm:all_reduce", 0) == 0 && spans.size() == std::get<1>(key).size())
          for (auto* s : spans) {
            auto ref = std::min_element(spans.begin(), spans.end(), [](auto* a, auto* b) { return a->rank < b->rank; });
            skew[s->rank].push_back(double(s->t1 - (*ref)->t1));
          }
      std::map<int, double> offset;
      for (auto& [rank, v] : skew) {
        std::sort(v.begin(), v.end());
        offset[rank] = v[v.size() / 2];
      }
      std::map<std::tuple<std::string, std::vector<int>, int>, double> out;
      for (auto& [key, spans] : inst) {
        if (spans.size() != std::get<1>(key).size()) continue;
        double start = -1e300, end = -1e300;
        for (auto* s : spans) {
          const double off = offset.count(s->rank) ? offset[s->rank] : 0.0;
          start = std::max(start, double(s->t0) - off);
          end = std::max(end, double(s->t1) - off);
        }
        out[key] = std::max(0.0, end - start);
      }
      return out;
    };
    const auto ri = instances(real), si = instances(simulated);
    for (auto& [key, m] : ri) {
      auto it = si.find(key);
      if (it == si.end()) continue;
      if (count) meas_total[std::get<0>(key)] += m;
      if (m > 0) err[std::get<0>(key)].push_back((it->second - m) / m);
    }
    return err;
  };
  const auto err = errors(sim, true), err_grid = errors(simgrid, false);
  auto stats = [](std::vector<double> e) {
    std::vector<double> ab(e.size());
    std::transform(e.begin(), e.end(), ab.begin(), [](double v) { return std::fabs(v); });
    std::sort(ab.begin(), ab.end());
    std::sort(e.begin(), e.end());
    return std::array<double, 3>{ab[ab.size() / 2], ab[std::min(ab.size() - 1, ab.size() * 9 / 10)], e[e.size() / 2]};
  };
  std::snprintf(line, sizeof line, "%-46s %6s %11s %7s %9s %7s %12s\n", "op (stream)", "spans", "measured ms",
                "median", "p90 |err|", "bias", "median, grid");
  out << line;
  std::vector<std::pair<double, std::string>> order;
  for (auto& [k, t] : meas_total) order.emplace_back(-t, k);
  std::sort(order.begin(), order.end());
  for (auto& [neg, k] : order) {
    auto it = err.find(k);
    if (it == err.end() || it->second.empty()) continue;
    const auto st = stats(it->second);
    auto g = err_grid.find(k);
    char grid[16] = "-";
    if (g != err_grid.end() && !g->second.empty()) std::snprintf(grid, sizeof grid, "%.0f%%", 100 * stats(g->second)[0]);
    std::snprintf(line, sizeof line, "%-46s %6zu %11.2f %6.0f%% %8.0f%% %6.0f%% %12s\n", k.c_str(), it->second.size(),
                  -neg * 1e-6, 100 * st[0], 100 * st[1], 100 * st[2], grid);
    out << line;
  }
  if (mismatched) out << mismatched << " span sequences did not pair up (different op order)\n";
  out << "median: of |simulated - measured| / measured per span; bias: the median signed error; median, grid: the same "
         "with the profile `calibrate` writes (GEMM times on its grid of weight shapes only; above: also this model's "
         "shapes). Comm spans per rank include waiting for the other ranks (their compute, and this host's load); "
         "'after last arrival' is one value per collective, the time the cost model predicts (the calibrated "
         "times at that size). Goal: median within 25% per op kind.\n";
  return end_to_end_check(o, out);
}

int run_cache_bench(std::ostream& out) {
  char line[512];
  out << "shardscope-engine bench --cache  host " << host_name() << "  (single cpu device)\n";
  std::snprintf(line, sizeof line, "%-14s %7s %7s %10s %14s %16s %9s %14s\n", "model", "prompt", "decode", "TTFT ms",
                "ms/token cache", "ms/token no cache", "speedup", "cache MiB");
  out << line;
  for (std::string model : {"small-llama", "small-mamba2"})
    for (int64_t prompt : {256, 1024}) {
      double ms[2] = {0, 0}, ttft = 0, cache_bytes = 0;
      for (int nc = 0; nc < 2; ++nc) {
        char tmpl[] = "/tmp/shardscope-cache-XXXXXX";
        const int fd = mkstemp(tmpl);
        if (fd >= 0) close(fd);
        const std::string cmd = "'" + self_exe() + "' run --model " + model + " --prompt-len " + std::to_string(prompt) +
                                " --decode 8" + (nc ? " --no-cache" : "") + " --events " + tmpl + " 2>/dev/null";
        if (std::system(cmd.c_str()) != 0) out << model << ": run failed\n";
        const auto st = proto::analyze(read_stream(tmpl));
        std::filesystem::remove(tmpl);
        auto metric = [&](const char* n) { return st.metrics.count(n) ? st.metrics.at(n) : 0.0; };
        ms[nc] = metric("decode_ms_per_token");
        if (!nc) {
          ttft = metric("ttft_ms");
          cache_bytes = metric("peak_kv_cache_bytes") + metric("peak_ssm_state_bytes");
        }
      }
      std::snprintf(line, sizeof line, "%-14s %7lld %7d %10.1f %14.2f %16.2f %8.1fx %14.2f\n", model.c_str(),
                    static_cast<long long>(prompt), 8, ttft, ms[0], ms[1], ms[1] / std::max(ms[0], 1e-9),
                    cache_bytes / (1 << 20));
      out << line << std::flush;
    }
  return 0;
}

int run_comm_bench(std::ostream& out) {
  char line[256];
  out << "shardscope-engine bench --comm  host " << host_name() << "\n\nquantize + dequantize throughput, one core "
      << "(bytes of fp32 input per second)\n";
  const int64_t n = 1 << 22;
  std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = std::sin(0.001f * float(i)) * 3.0f;
  for (const char* spec : {"bf16", "int8:128", "int8:128:sr", "int4:128", "fp8:128"}) {
    const QuantSpec s = parse_quant_spec(spec);
    std::vector<uint8_t> q(static_cast<size_t>(quantized_bytes(n, s)));
    const auto t0 = std::chrono::steady_clock::now();
    int reps = 0;
    double secs = 0;
    do {
      quantize_values(x.data(), n, s, 0, q.data());
      dequantize_values(q.data(), n, s, y.data(), false);
      ++reps;
      secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (secs < 0.5);
    std::snprintf(line, sizeof line, "  %-12s %8.2f GB/s\n", spec, 4.0 * double(n) * reps / secs * 1e-9);
    out << line;
  }
  out << "\nall-reduce: bare MPI (fp32) and the quantized all-reduce (reduce-scatter + all-gather hops) in the same "
         "run; time is the slowest rank's mean; busbw with the all-reduce factor 2(n-1)/n on the fp32 size\n"
      << std::flush;
  for (int d : {2, 4}) {
    if (!stream_command(mpirun_self_command(d, "bench-comm-rank"), out)) return 1;
  }
  out << "Goals: int8 (B=128) wire <= 0.27x fp32; int8 faster than fp32 for messages >= 1 MiB; quantize+dequantize "
         ">= 2 GB/s per core.\n";
  return 0;
}

int comm_bench_rank(const std::vector<int64_t>& sizes, int iterations) {
  MpiWorld mpi;
  Recorder rec(mpi.rank());
  {
    auto stream = std::make_shared<CommStream>();
    MpiCommunicator world(stream, MPI_COMM_WORLD, rec, "world");
    Allocator alloc;
    CpuBackend be(alloc, rec);
    const int D = mpi.size();
    if (mpi.rank() == 0)
      std::printf("\n%d ranks\n%-12s %10s %11s %10s %12s %11s %8s\n", D, "precision", "bytes", "time us",
                  "busbw GB/s", "wire B/rank", "vs fp32", "speedup");
    for (int64_t bytes : sizes) {
      const int64_t n = bytes / 4;
      Tensor buf = be.alloc({n}, Category::CommBuffers, "bench");
      double fp32_time = 0;
      for (const char* spec : {"fp32", "bf16", "int8:128", "int4:128", "fp8:128"}) {
        const QuantSpec s = parse_quant_spec(spec);
        be.fill(buf, 1.0f);
        WireBytes w = quantized_all_reduce(world, be, buf, s, 0);  // warm-up
        world.barrier();
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iterations; ++i) w = quantized_all_reduce(world, be, buf, s, uint64_t(i) << 32);
        double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iterations;
        Tensor tt = be.alloc({1}, Category::Workspace, "t");
        float tf = float(t);
        be.upload(tt, &tf, DType::F32);
        world.all_reduce(tt);  // the mean over ranks
        be.download(tt, &tf);
        t = double(tf) / D;
        if (s.is_plain()) fp32_time = t;
        rec.clear();
        if (mpi.rank() == 0)
          std::printf("%-12s %10lld %11.1f %10.3f %12.0f %10.3fx %7.2fx\n", spec, static_cast<long long>(bytes), t * 1e6,
                      2.0 * (D - 1) / D * double(bytes) / t * 1e-9, w.sent, w.sent / std::max(w.fp32, 1.0),
                      fp32_time / t);
      }
    }
    std::fflush(stdout);
  }
  return 0;
}

int run_collective_bench(const CollectiveBenchOptions& o, std::ostream& out) {
  out << "shardscope-engine bench --collectives  host " << host_name() << "  (nccl-tests conventions: algbw = "
         "bytes/time, busbw = algbw x 2(n-1)/n for all_reduce, (n-1)/n for all_gather)\n";
  out << "bare: the MPI call itself; engine: the same collective through MpiCommunicator (comm stream, spans), in "
         "the same run\n" << std::flush;
  std::string sizes;
  for (auto s : o.sizes) sizes += (sizes.empty() ? "" : ",") + std::to_string(s);
  for (int d : o.devices) {
    const std::string args =
        "bench-collectives-rank --sizes " + sizes + " --iterations " + std::to_string(o.iterations);
    if (!stream_command(mpirun_self_command(d, args), out)) return 1;
  }
  return 0;
}

int collective_bench_rank(const std::vector<int64_t>& sizes, int iterations, bool json,
                          const std::vector<std::string>& extra) {
  // --json: the per-collective timings calibrate fits alpha and beta to.
  if (json) return collective_timing_rank(sizes, iterations, extra);
  MpiWorld mpi;
  Recorder rec(mpi.rank());
  {
    auto stream = std::make_shared<CommStream>();
    MpiCommunicator world(stream, MPI_COMM_WORLD, rec, "world");
    Allocator alloc;
    CpuBackend be(alloc, rec);
    const auto rows = bench_collectives(world, be, sizes, iterations);
    if (mpi.rank() == 0) {
      std::printf("\n%d ranks\n%-11s %10s %11s %10s %10s %11s %10s %10s %8s %6s\n", mpi.size(), "op", "bytes",
                  "bare us", "algbw GB/s", "busbw GB/s", "engine us", "algbw GB/s", "busbw GB/s", "eng/bare", "wrong");
      for (size_t i = 0; i + 1 < rows.size(); i += 2) {
        const auto& b = rows[i];
        const auto& e = rows[i + 1];
        std::printf("%-11s %10lld %11.1f %10.3f %10.3f %11.1f %10.3f %10.3f %7.0f%% %6lld\n", b.op.c_str(),
                    static_cast<long long>(b.bytes), b.time_s * 1e6, b.algbw * 1e-9, b.busbw * 1e-9, e.time_s * 1e6,
                    e.algbw * 1e-9, e.busbw * 1e-9, 100 * e.busbw / std::max(b.busbw, 1e-30),
                    static_cast<long long>(b.wrong + e.wrong));
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace ss
