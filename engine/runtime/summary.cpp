#include "runtime/summary.h"

#include "runtime/scale.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <string>

#include "core/allocator.h"
#include "core/error.h"
#include "protocol/analysis.h"
#include "protocol/events.h"

namespace ss {

int summarize_stream(std::istream& in, std::ostream& out, const std::string& name) {
  proto::Reader reader;
  nlohmann::json config;
  std::map<std::string, double> metrics;
  std::map<int, proto::Mem> peak_mem;  // per rank: the sample with the highest total
  std::map<std::string, std::pair<double, int>> op_time;  // op -> (ns, count)
  std::map<std::string, double> phase_time;
  std::vector<proto::Error> errors;
  // A sweep's accuracy records: config -> metric -> value, configs in order.
  std::vector<std::string> sweep_order;
  std::vector<proto::ScalePoint> scale_points;  // a scaling sweep's
  std::vector<proto::TrainStep> train_steps;    // a training run's
  std::optional<std::string> prompt_text, answer_text;  // a run whose model reads text
  std::map<std::string, std::map<std::string, double>> sweep;
  std::map<std::string, double> own_accuracy, reference_accuracy;  // verify's: metric.site
  std::string status = "(no done record: the run did not finish)";
  std::string first_error;
  int64_t bad = 0;
  std::string line;
  while (std::getline(in, line)) {
    auto r = reader.parse_line(line);
    if (!r.event) {
      if (!r.error.empty()) {
        ++bad;
        if (first_error.empty()) first_error = r.error;
      }
      if (reader.refused()) throw UsageError(name + ": cannot read this stream: " + r.error);
      continue;
    }
    std::visit(
        [&](auto&& e) {
          using T = std::decay_t<decltype(e)>;
          if constexpr (std::is_same_v<T, proto::Config>) config = e.config;
          else if constexpr (std::is_same_v<T, proto::Metric>) metrics[e.name] = e.value;
          else if constexpr (std::is_same_v<T, proto::Mem>) {
            int64_t tot = 0, best = 0;
            for (auto b : e.bytes) tot += b;
            if (auto it = peak_mem.find(e.rank); it != peak_mem.end())
              for (auto b : it->second.bytes) best += b;
            if (!peak_mem.count(e.rank) || tot >= best) peak_mem[e.rank] = e;
          } else if constexpr (std::is_same_v<T, proto::Span>) {
            auto& [ns, n] = op_time[e.stream + ":" + e.op];
            ns += double(e.t1 - e.t0);
            ++n;
            phase_time[e.phase] += double(e.t1 - e.t0);
          } else if constexpr (std::is_same_v<T, proto::Accuracy>) {
            if (!e.config.empty() && e.site.empty()) {
              if (!sweep.count(e.config)) sweep_order.push_back(e.config);
              sweep[e.config][e.metric] = e.value;
            } else if (e.config.empty() || e.config == "reference") {  // verify's, the run's or one device's
              (e.config.empty() ? own_accuracy : reference_accuracy)[e.metric + (e.site.empty() ? "" : "." + e.site)] =
                  e.value;
            }
          } else if constexpr (std::is_same_v<T, proto::ScalePoint>) scale_points.push_back(e);
          else if constexpr (std::is_same_v<T, proto::TrainStep>) train_steps.push_back(e);
          else if constexpr (std::is_same_v<T, proto::Prompt>) prompt_text = e.text;
          else if constexpr (std::is_same_v<T, proto::Generation>) {
            if (e.config.empty() && e.text) answer_text = *e.text;
          }
          else if constexpr (std::is_same_v<T, proto::Error>) errors.push_back(e);
          else if constexpr (std::is_same_v<T, proto::Done>) status = e.status;
        },
        *r.event);
  }
  if (reader.version() == 0)
    throw UsageError(name + ": not an event stream (no hello line" +
                     (first_error.empty() ? std::string(")") : "; " + first_error + ")") +
                     "; give a file written with --events");
  // The run's errors (with their code and rank where there are devices), and
  // what could not be read.
  auto print_errors = [&](bool detailed) {
    for (auto& e : errors)
      out << (detailed ? "error (" + e.code + ", rank " + std::to_string(e.rank) + "): " : std::string("error: "))
          << e.message << "\n";
  };
  auto note_unread = [&] {
    if (bad) out << "note: " << bad << " line(s) could not be read; first: " << first_error << "\n";
  };
  if (!config.is_object()) {
    // A run refused before its setup was recorded: its errors are all there is.
    out << "run: ended before its setup was recorded\nstatus: " << status << "\n";
    print_errors(true);
    note_unread();
    return 0;
  }
  char buf[256];
  const auto& model = config.value("model", nlohmann::json::object());
  const auto& work = config.value("workload", nlohmann::json::object());
  if (config.contains("scale")) {
    // A scaling sweep: the peak of every strategy at every length.
    // The config is free-form: read what the engine writes, and "?" for anything else.
    auto text = [](const nlohmann::json& j, const char* k) {
      return j.is_object() && j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string("?");
    };
    auto count = [](const nlohmann::json& j, const char* k) {
      return j.contains(k) && j[k].is_number_integer() ? std::to_string(j[k].get<int64_t>()) : std::string("?");
    };
    out << "scaling sweep: " << text(config.contains("model") ? config["model"] : nlohmann::json(), "name") << ", "
        << count(config, "devices") << " devices on " << count(config, "nodes") << " node(s), " << text(config, "dtype")
        << ", " << scale_points.size() << " points\nstatus: " << status << "\n";
    print_errors(false);
    print_scale_table(scale_points, out);
    for (auto& p : scale_points)
      if (!p.applicable()) out << (p.mesh.empty() ? p.strategy : p.strategy + " " + p.mesh) << " at " << p.seq_len
                               << ": " << p.reason << "\n";
    return status == "ok" ? 0 : 1;
  }
  if (config.contains("verify") && config["verify"].is_object() && config["verify"].value("train", false)) {
    // train --verify: a training step against one device's, tensor by tensor.
    const auto& v = config["verify"];
    const int64_t sequences = work.value("sequences", int64_t(1)), steps = work.value("steps", int64_t(1));
    const bool rounded = v.contains("exact");
    const std::string dtype = config.value("dtype", std::string("fp32"));
    out << "verify: " << v.value("run", "?") << " trains against " << v.value("reference", "?") << " ("
        << model.value("name", "?") << ", " << dtype << "; " << sequences << (sequences > 1 ? " sequences" : " sequence")
        << " of " << work.value("seq_len", int64_t(0)) << " tokens a step, " << steps << (steps > 1 ? " steps" : " step")
        << ")\nstatus: " << status << "\n";
    const std::string first = "step " + std::to_string(metrics.count("verify_first_step")
                                                           ? int64_t(metrics["verify_first_step"]) : int64_t(1));
    if (own_accuracy.count("rel_l2.loss")) {
      std::snprintf(buf, sizeof buf, "  %s: loss %.3g from one device's, gradient norm %.3g (relative)\n",
                    first.c_str(), own_accuracy["rel_l2.loss"], own_accuracy["rel_l2.grad_norm"]);
      out << buf;
    }
    // The tensors nearest their bound first (in bf16 each has its own).
    const double bound = v.value("bound", 0.0), factor = v.value("factor", 0.0);
    std::vector<std::pair<double, std::string>> tensors;  // (share of its bound, name)
    for (auto& [key, value] : own_accuracy)
      if (key.rfind("grad_rel_l2.", 0) == 0 && key != "grad_rel_l2.whole") {
        const double allowed = proto::train_verify_tensor_bound(v, reference_accuracy[key]);
        tensors.push_back({allowed > 0 ? value / allowed : value, key.substr(12)});
      }
    std::sort(tensors.rbegin(), tensors.rend());
    if (own_accuracy.count("grad_rel_l2.whole")) {
      std::snprintf(buf, sizeof buf, "  %s gradient, %zu tensors: %.3g relative L2 from %s", first.c_str(), tensors.size(),
                    own_accuracy["grad_rel_l2.whole"], rounded ? "one device's fp32 gradient" : "one device's");
      out << buf;
      if (rounded) {
        std::snprintf(buf, sizeof buf, " (one %s device's: %.3g)", dtype.c_str(),
                      reference_accuracy["grad_rel_l2.whole"]);
        out << buf;
      }
      out << "; " << int64_t(metrics["verify_tensors_past"]) << " past their bound\n";
    }
    for (size_t i = 0; i < std::min<size_t>(tensors.size(), 3); ++i) {
      const std::string key = "grad_rel_l2." + tensors[i].second;
      std::snprintf(buf, sizeof buf, "    %-48s %.3g", tensors[i].second.c_str(), own_accuracy[key]);
      out << buf;
      if (rounded) {
        std::snprintf(buf, sizeof buf, "  (one device's %.3g)", reference_accuracy[key]);
        out << buf;
      }
      out << "\n";
    }
    if (own_accuracy.count("max_abs_diff.loss_curve")) {
      std::snprintf(buf, sizeof buf, "  %d steps from %s: the losses differ by at most %.3g nats (not bounded)\n",
                    int(steps), first.c_str(), own_accuracy["max_abs_diff.loss_curve"]);
      out << buf;
    }
    if (rounded)
      std::snprintf(buf, sizeof buf, "  bounds: %.3g for the loss and norm; a tensor %g x one device's distance + %.3g"
                    " (%d layers)\n", v.value("loss_bound", 0.0), factor, bound, v.value("layers", 0));
    else
      std::snprintf(buf, sizeof buf, "  bound: %.3g (%d layers)\n", bound, v.value("layers", 0));
    out << buf;
    print_errors(false);
    note_unread();
    return 0;
  }
  if (config.contains("verify") && config["verify"].is_object()) {
    // verify: a run against one device, row by row.
    const auto& v = config["verify"];
    const int64_t P = work.value("prompt_len", int64_t(0)), decode = work.value("decode", int64_t(0));
    const int batch = work.value("batch", 1);
    out << "verify: " << v.value("run", "?") << " against " << v.value("reference", "?") << " (" << model.value("name", "?")
        << ", " << config.value("dtype", std::string("fp32")) << "; "
        << (batch > 1 ? std::to_string(batch) + " sequences of " : "") << P << " tokens"
        << (decode ? ", " + std::to_string(decode) + " decode steps" : "") << ")\nstatus: " << status << "\n";
    for (const char* phase : {"prefill", "decode"}) {
      const auto rel = own_accuracy.find(std::string("rel_l2.") + phase);
      if (rel == own_accuracy.end()) continue;
      std::snprintf(buf, sizeof buf, "worst row relative L2 %.3g", rel->second);
      out << "  " << phase << ", " << metrics[std::string("verify_rows.") + phase] << " rows: " << buf << " at "
          << proto::row_place(int64_t(metrics[std::string("verify_worst_row.") + phase]), P, decode, batch > 1, false);
      std::snprintf(buf, sizeof buf, ", largest difference %.3g\n", own_accuracy[std::string("max_abs_diff.") + phase]);
      out << buf;
    }
    if (own_accuracy.count("top1")) {
      std::snprintf(buf, sizeof buf, "  top-1 token: the same in %.1f%% of rows\n", 100 * own_accuracy["top1"]);
      out << buf;
    }
    std::snprintf(buf, sizeof buf, "  bound: %.3g (%d layers)\n", v.value("bound", 0.0), v.value("layers", 0));
    out << buf;
    print_errors(false);
    note_unread();
    return 0;
  }
  if (config.contains("sweep")) {
    // A quantization sweep: no devices to account, a trade-off to show.
    const std::string dtype = config.value("dtype", std::string("fp32"));
    out << "sweep: " << model.value("name", "?") << ", " << config.value("strategy", "?") << " on "
        << config.value("devices", 1) << " ranks, " << dtype << ", prompt " << work.value("prompt_len", 0)
        << " + decode " << work.value("decode", 0) << " tokens\nstatus: " << status << "\n";
    print_errors(false);
    std::snprintf(buf, sizeof buf, "%-22s %12s %9s %12s %8s %8s  %s\n", "config", "wire B/rank", ("vs " + dtype).c_str(),
                  "logits KL", "top-1", "decided", "first divergence");
    out << buf;
    for (const std::string& c : sweep_order) {
      const auto& m = sweep[c];
      auto v = [&](const char* k) { auto it = m.find(k); return it == m.end() ? 0.0 : it->second; };
      const double div = m.count("first_divergence") ? v("first_divergence") : -1;
      const double native = v("wire_bytes_native");
      std::snprintf(buf, sizeof buf, "%-22s %12.0f %8.3fx %12.3e %7.2f%% %7.2f%%  %s\n", c.c_str(), v("wire_bytes"),
                    native > 0 ? v("wire_bytes") / native : 1.0, v("kl"), 100 * v("top1"), 100 * v("top1_decided"),
                    !m.count("first_divergence") ? "-"  // teacher-forced windows: nothing decoded
                    : div < 0                      ? "never"
                                                   : ("step " + std::to_string(int(div))).c_str());
      out << buf;
    }
    note_unread();
    return 0;
  }
  const double parameters = config.value("parameters", 0.0);
  std::snprintf(buf, sizeof buf, parameters >= 1e9 ? "%.2f B" : parameters >= 1e6 ? "%.1f M" : "%.1f K",
                parameters >= 1e9 ? parameters / 1e9 : parameters >= 1e6 ? parameters / 1e6 : parameters / 1e3);
  out << (config.value("mode", std::string()) == "train" ? "train: " : "run: ") << model.value("name", "?") << " ("
      << model.value("family", "?") << ", " << buf << " parameters), backend " << config.value("backend", "?")
      << ", strategy " << proto::strategy_label(config) << ", " << config.value("devices", 1) << " device(s), "
      << config.value("dtype", std::string("fp32"))
      << (config.value("kv_dtype", config.value("dtype", std::string("fp32"))) != config.value("dtype", std::string("fp32"))
              ? " (KV cache " + config.value("kv_dtype", std::string()) + ")"
              : std::string())
      << "\n";
  const bool training = config.value("mode", std::string()) == "train";
  if (training) {
    const auto& t = config.value("training", nlohmann::json::object());
    const int64_t micro = t.value("micro_batch", int64_t(1)), accum = t.value("grad_accum", int64_t(1)),
                  replicas = t.value("replicas", int64_t(1));
    out << "workload: training, " << t.value("steps", 0) << " steps, each " << micro * accum * replicas
        << " sequences of " << t.value("seq_len", 0) << " tokens (micro-batch " << micro << " x " << accum
        << " accumulated x " << replicas << (replicas == 1 ? " replica" : " replicas") << "); data "
        << t.value("data", std::string("?")) << "; weights " << config.value("weights", "?") << "\n";
  } else {
    out << "workload: prompt " << work.value("prompt_len", 0) << " tokens, " << work.value("decode", 0)
        << " decode steps; weights " << config.value("weights", "?") << "\n";
  }
  out << "status: " << status << "\n";
  if (prompt_text) out << "prompt: " << *prompt_text << "\n";
  if (answer_text) out << "answer: " << *answer_text << "\n";
  print_errors(true);
  auto metric = [&](const char* name, const char* label, const char* fmt) {
    if (auto it = metrics.find(name); it != metrics.end()) {
      std::snprintf(buf, sizeof buf, fmt, it->second);
      out << "  " << label << ": " << buf << "\n";
    }
  };
  if (!train_steps.empty()) {
    const proto::TrainStep &first = train_steps.front(), &last = train_steps.back();
    out << "training: " << train_steps.size() << " step(s) recorded\n";
    if (config.value("backend", std::string()) == "sim") {
      out << "  loss: not computed (simulated devices hold no values)\n";
    } else {
      double lowest = first.loss;
      for (auto& t : train_steps) lowest = std::min(lowest, t.loss);
      std::snprintf(buf, sizeof buf, "  loss: %.4f at step %d, %.4f at step %d (lowest %.4f); grad norm %.3g at the last\n",
                    first.loss, first.step, last.loss, last.step, lowest, last.grad_norm);
      out << buf;
    }
    // The first step pays for warming up; the rest are the steady rate.
    double rate = 0;
    for (size_t i = train_steps.size() > 1 ? 1 : 0; i < train_steps.size(); ++i) rate += train_steps[i].tokens_per_s;
    rate /= double(train_steps.size() > 1 ? train_steps.size() - 1 : 1);
    std::snprintf(buf, sizeof buf, "  %.1f tokens/s (mean over step%s), lr %.3g at the last\n", rate,
                  train_steps.size() > 1 ? "s after the first" : " 1", last.lr);
    out << buf;
  }
  static const char* const kLatency[] = {"ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s", "replicas"};
  if (std::any_of(std::begin(kLatency), std::end(kLatency), [&](const char* m) { return metrics.count(m) > 0; }))
    out << "throughput and latency:\n";
  metric("ttft_ms", "time to first token", "%.2f ms");
  metric("prefill_tokens_per_s", "prefill", "%.1f tokens/s");
  metric("decode_tokens_per_s", "decode", "%.1f tokens/s");
  metric("decode_ms_per_token", "per decoded token", "%.2f ms");
  metric("replicas", "data-parallel replicas", "%.0f");
  metric("total_devices", "devices in all", "%.0f");
  metric("aggregate_prefill_tokens_per_s", "prefill, all replicas", "%.1f tokens/s");
  metric("aggregate_decode_tokens_per_s", "decode, all replicas", "%.1f tokens/s");
  if (!peak_mem.empty()) out << "peak memory per device (accounted):\n";
  for (auto& [rank, m] : peak_mem) {
    int64_t tot = 0;
    for (auto b : m.bytes) tot += b;
    out << "  rank " << rank << ": " << format_bytes(tot) << " =";
    for (int c = 0; c < proto::kCategoryCount; ++c)
      if (m.bytes[size_t(c)]) out << " " << kCategoryNames[size_t(c)] << " " << format_bytes(m.bytes[size_t(c)]);
    out << "\n";
  }
  std::vector<std::pair<std::string, std::pair<double, int>>> ops(op_time.begin(), op_time.end());
  std::sort(ops.begin(), ops.end(), [](auto& a, auto& b) { return a.second.first > b.second.first; });
  double total_ns = 0;
  for (auto& o : ops) total_ns += o.second.first;
  if (!ops.empty()) out << "time by op (all ranks, all phases):\n";
  constexpr size_t kOpsShown = 8;
  for (size_t i = 0; i < std::min(ops.size(), kOpsShown); ++i) {
    std::snprintf(buf, sizeof buf, "  %-30s %10.2f ms %6.1f%%  (%d calls)\n", ops[i].first.c_str(),
                  ops[i].second.first * 1e-6, 100.0 * ops[i].second.first / std::max(total_ns, 1.0),
                  ops[i].second.second);
    out << buf;
  }
  if (ops.size() > kOpsShown) {
    double rest = 0;
    for (size_t i = kOpsShown; i < ops.size(); ++i) rest += ops[i].second.first;
    std::snprintf(buf, sizeof buf, "  ... %zu more ops                   %10.2f ms %6.1f%%\n", ops.size() - kOpsShown,
                  rest * 1e-6, 100.0 * rest / std::max(total_ns, 1.0));
    out << buf;
  }
  note_unread();
  return 0;
}

}  // namespace ss
