// `bench --train`: the training step against bare GEMMs on one device, then
// every training strategy on D real ranks (through `train`), all measured in
// the same run so ratios hold on a noisy shared machine.
#include "runtime/bench_train.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "core/dtype.h"
#include "cpu/kernels.h"
#include "model/model.h"
#include "protocol/analysis.h"
#include "runtime/process.h"
#include "runtime/train.h"
#include "sim/meta_backend.h"

namespace ss {
namespace {

std::vector<proto::Event> read_events(const std::string& path) {
  std::vector<proto::Event> out;
  proto::Reader reader;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (auto r = reader.parse_line(line); r.event) out.push_back(std::move(*r.event));
  return out;
}

// Hidden share of the comm spans `pick` selects, over all ranks.
template <class Pick>
double hidden_share(const std::vector<proto::Event>& ev, Pick pick) {
  std::map<int, std::vector<std::pair<int64_t, int64_t>>> comm, compute;
  for (auto& e : ev)
    if (auto* s = std::get_if<proto::Span>(&e)) {
      if (s->stream == "comm" && pick(*s)) comm[s->rank].emplace_back(s->t0, s->t1);
      else if (s->stream == "compute") compute[s->rank].emplace_back(s->t0, s->t1);
    }
  double total = 0, hidden = 0;
  for (auto& [r, iv] : comm) {
    total += proto::union_ns(iv);
    hidden += proto::overlap_ns(iv, compute[r]);
  }
  return total > 0 ? hidden / total : NAN;
}

// The most any rank held per category, and at once.
std::pair<std::array<int64_t, proto::kCategoryCount>, int64_t> max_peaks(const proto::RunStats& st) {
  std::array<int64_t, proto::kCategoryCount> peak{};
  int64_t total = 0;
  for (auto& [r, rs] : st.ranks) {
    for (int c = 0; c < proto::kCategoryCount; ++c) peak[size_t(c)] = std::max(peak[size_t(c)], rs.peak[size_t(c)]);
    total = std::max(total, rs.peak_total);
  }
  return {peak, total};
}

// Seconds per step after the first (which pays for first touches and primitive creation).
double step_seconds(const std::vector<proto::Event>& ev) {
  std::vector<double> s;
  for (auto& e : ev)
    if (auto* t = std::get_if<proto::TrainStep>(&e)) s.push_back(double(t->tokens) / std::max(t->tokens_per_s, 1e-9));
  if (s.size() > 1) s.erase(s.begin());
  std::sort(s.begin(), s.end());
  return s.empty() ? NAN : s[s.size() / 2];
}

std::string run_train(const std::string& args, std::string* first_err) {
  char tmpl[] = "/tmp/shardscope-bench-train-XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd >= 0) close(fd);
  const std::string err = std::string(tmpl) + ".err";
  const std::string cmd = "'" + self_exe() + "' train " + args + " --events " + tmpl + " 2>'" + err + "'";
  (void)std::system(cmd.c_str());
  std::ifstream e(err);
  std::getline(e, *first_err);
  std::filesystem::remove(err);
  return tmpl;
}

// `train ARGS --strategy s` on `devices` ranks (tp_sp on the squarest mesh): its events.
std::vector<proto::Event> run_strategy(std::string args, const std::string& s, int devices, std::string* first_err) {
  args += " --strategy " + s + " --devices " + std::to_string(devices);
  if (s == "tp_sp") {
    int t = 1;
    while ((t * 2) * (t * 2) <= devices) t *= 2;
    args += " --mesh " + std::to_string(t) + "x" + std::to_string(devices / t);
  }
  const std::string file = run_train(args, first_err);
  auto ev = read_events(file);
  std::filesystem::remove(file);
  return ev;
}

}  // namespace

int run_train_bench(const TrainBenchOptions& o, std::ostream& out) {
  char line[512];
  const ModelConfig cfg = resolve_model(o.model, nullptr);
  const int64_t T = o.seq_len, M = T * o.micro_batch;
  out << "shardscope-engine bench --train  host " << host_name() << ", " << sysconf(_SC_NPROCESSORS_ONLN)
      << " cores; " << o.model << " (d " << cfg.d_model << ", " << cfg.n_layers << " layers), " << o.micro_batch
      << " x " << T << " tokens a step, fp32, " << o.steps << " steps (the first not counted)\n";

  // 1. One device: the step's FLOP rate against bare sgemm of its GEMM shapes.
  {
    const std::string common = "--model " + o.model + " --seq-len " + std::to_string(T) + " --micro-batch " +
                               std::to_string(o.micro_batch) + " --steps " + std::to_string(o.steps) + " --lr 1e-4";
    std::string why;
    const std::string file = run_train(common, &why);
    const auto ev = read_events(file);
    std::filesystem::remove(file);
    const double step = step_seconds(ev);
    if (std::isnan(step)) {
      out << "single: the run failed: " << why << "\n";
      return 1;
    }
    // GEMM FLOPs of a step: every linear weight [N, K] (the LM head too) in
    // three products of M rows (forward, data and weight gradients), plus
    // causal attention's 12 d per visible (query, key) pair per layer
    // (forward 4 d, backward 8 d), the "6 N tokens + attention" of the field.
    Allocator none;
    Recorder quiet;
    MetaBackend meta(none, quiet);
    const Model model(cfg, meta);
    std::map<std::pair<int64_t, int64_t>, int> shapes;  // (N, K) -> count
    for (const WeightSpec& w : model.weights())
      if (w.shape.size() == 2 && w.name.find("embed_tokens") == std::string::npos) ++shapes[{w.shape[0], w.shape[1]}];
    if (cfg.tie_embeddings) ++shapes[{cfg.vocab, cfg.d_model}];
    double gemm_flops = 0, bare = 0;
    for (auto& [nk, count] : shapes) {
      const auto [N, K] = nk;
      gemm_flops += 3 * 2.0 * double(M) * double(N) * double(K) * count;
      // y = x w^T, dx = dy w, dw = dy^T x: the same FLOPs in three layouts, each timed bare.
      bare += count * (cpu::library_gemm_seconds(M, N, K, DType::F32, 2) + cpu::library_gemm_seconds(M, K, N, DType::F32, 2) +
                       cpu::library_gemm_seconds(N, K, M, DType::F32, 2)) / 2;
    }
    const double pairs = double(o.micro_batch) * double(T) * double(T + 1) / 2;
    const double attn_flops = 12.0 * double(cfg.d_model) * pairs * cfg.n_layers;
    const double rate = (gemm_flops + attn_flops) / step, bare_rate = gemm_flops / bare;
    std::snprintf(line, sizeof line,
                  "\nsingle device: step %.2f s, %.1f GFLOP/s (6 N tokens + attention = %.1f GFLOP); bare sgemm of the "
                  "step's shapes %.1f GFLOP/s; ratio %.2f (goal >= 0.50)\n",
                  step, rate * 1e-9, (gemm_flops + attn_flops) * 1e-9, bare_rate * 1e-9, rate / bare_rate);
    out << line << std::flush;
  }

  // 2. Every strategy on D ranks.
  out << "\nD = " << o.devices << " (one MPI rank each" << (o.devices > sysconf(_SC_NPROCESSORS_ONLN) ? ", oversubscribed: times stretch" : "")
      << "): tokens/s; hidden: share of gradient communication (dp/sp: the overlapped gradient sums; tp: the "
         "input-gradient all-reduces) overlapped by compute; peaks per rank in MiB (max over ranks)\n";
  std::snprintf(line, sizeof line, "%-7s %10s %8s %8s %9s %9s %9s %9s %9s %9s %9s\n", "strategy", "tokens/s", "hidden",
                "fwd hid.", "weights", "grads", "optim", "activ.", "comm buf", "workspace", "peak");
  out << line;
  for (const std::string& s : o.strategies) {
    std::string args = "--model " + o.model + " --seq-len " + std::to_string(T) + " --steps " + std::to_string(o.steps) +
                       " --lr 1e-4";
    args += " --micro-batch " + std::to_string(s == "dp" ? std::max(1, o.micro_batch / o.devices) : o.micro_batch);
    std::string why;
    const auto ev = run_strategy(args, s, o.devices, &why);
    const proto::RunStats st = proto::analyze(ev);
    if (st.status != "ok") {
      std::snprintf(line, sizeof line, "%-7s  %s: %s\n", s.c_str(), st.status.empty() ? "failed" : st.status.c_str(),
                    (!st.errors.empty() ? st.errors.front().message : why).substr(0, 160).c_str());
      out << line << std::flush;
      continue;
    }
    // Gradient traffic: dp/sp's gradient sums, tp's input-gradient
    // all-reduces, tsp's ring (weight shards and their travelling gradients).
    const double hidden = hidden_share(ev, [&](const proto::Span& sp) {
      return sp.phase == "backward" &&
             (sp.site.find("grad") != std::string::npos || sp.site.find("ring_backward") != std::string::npos);
    });
    const double forward_hidden = hidden_share(ev, [&](const proto::Span& sp) {
      return sp.phase == "forward" &&
             (sp.site.find(".ring") != std::string::npos || sp.site.find(".broadcast") != std::string::npos);
    });
    const auto [peak, total] = max_peaks(st);
    double step_tokens = 0;
    for (auto& e : ev)
      if (auto* t = std::get_if<proto::TrainStep>(&e)) step_tokens = double(t->tokens);
    const double tokens_per_s = step_tokens / step_seconds(ev);
    auto percent = [](double v) {
      char b[16];
      if (std::isnan(v)) std::snprintf(b, sizeof b, "-");
      else std::snprintf(b, sizeof b, "%.0f%%", 100 * v);
      return std::string(b);
    };
    std::snprintf(line, sizeof line, "%-7s %10.0f %8s %8s %9s %9s %9s %9s %9s %9s %9s\n", s.c_str(), tokens_per_s,
                  percent(hidden).c_str(), percent(forward_hidden).c_str(),
                  mib(double(peak[0])).c_str(), mib(double(peak[6])).c_str(), mib(double(peak[7])).c_str(),
                  mib(double(peak[1])).c_str(), mib(double(peak[4])).c_str(), mib(double(peak[5])).c_str(),
                  mib(double(total)).c_str());
    out << line << std::flush;
  }
  // 3. Peak memory per strategy at a long sequence, on simulated devices of
  //    the same code (whose memory equals the cpu ranks', tst_train).
  out << "\nPeak memory per rank at " << o.long_seq << " tokens, D = " << o.devices << ", simulated on "
      << o.hardware << " (the allocations of cpu ranks, without their time), MiB:\n";
  std::snprintf(line, sizeof line, "%-7s %9s %9s %9s %9s %9s %9s %9s\n", "strategy", "weights", "grads", "optim",
                "activ.", "comm buf", "workspace", "peak");
  out << line;
  std::map<std::string, int64_t> long_peak;
  for (const std::string& s : {std::string("tp"), std::string("sp"), std::string("tp_sp"), std::string("tsp")}) {
    const std::string args = "--backend sim --hardware " + o.hardware + " --model " + o.model + " --seq-len " +
                             std::to_string(o.long_seq) + " --steps 1";
    std::string why;
    const auto ev = run_strategy(args, s, o.devices, &why);
    const proto::RunStats st = proto::analyze(ev);
    if (st.status != "ok") {
      std::snprintf(line, sizeof line, "%-7s  %s\n", s.c_str(),
                    (!st.errors.empty() ? st.errors.front().message : why).substr(0, 160).c_str());
      out << line;
      continue;
    }
    const auto [peak, total] = max_peaks(st);
    long_peak[s] = total;
    std::snprintf(line, sizeof line, "%-7s %9s %9s %9s %9s %9s %9s %9s\n", s.c_str(), mib(double(peak[0])).c_str(),
                  mib(double(peak[6])).c_str(), mib(double(peak[7])).c_str(), mib(double(peak[1])).c_str(),
                  mib(double(peak[4])).c_str(), mib(double(peak[5])).c_str(), mib(double(total)).c_str());
    out << line;
  }
  if (long_peak.count("tsp") && long_peak.count("tp"))
    out << "tsp / tp peak: " << std::to_string(double(long_peak["tsp"]) / double(long_peak["tp"])).substr(0, 5)
        << " (goal <= 1)\n";
  return 0;
}

}  // namespace ss
