#include "runtime/sweep.h"

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "comm/quantize.h"
#include "core/error.h"
#include "io/npy.h"
#include "model/config.h"
#include "protocol/events.h"
#include "runtime/child_run.h"
#include "runtime/prompt.h"
#include "text/corpus.h"

namespace ss {
namespace {

struct SweepPoint {
  std::string label, precision, site;
  int block = 0;
  bool ok = false;
  std::string error;
  int exit_code = 0;  // of its run
  double wire = 0, wire_fp32 = 0, wire_native = 0, kl = 0, top1 = 0, top1_decided = 0, ppl = NAN;
  int first_divergence = -1;  // decode step, -1: none
  std::map<std::string, double> site_rel_l2;
};

// Runs one configuration; returns its logits and fills wire and site errors.
NpyArray run_point(RunOptions o, const std::string& precision, const std::string& base, SweepPoint& pt,
                   const std::vector<int32_t>& forced = {}) {
  o.comm_precision = precision;
  o.measure_sites = true;
  o.force_decode = forced;
  std::map<std::string, std::pair<double, int>> site_sum;
  ChildRun r = run_child(o, base, [&](const proto::Event& ev) {
    if (auto* m = std::get_if<proto::Metric>(&ev); m && m->rank == 0) {
      if (m->name.rfind("wire_bytes_fp32.", 0) == 0) pt.wire_fp32 += m->value;
      else if (m->name.rfind("wire_bytes_native.", 0) == 0) pt.wire_native += m->value;
      else if (m->name.rfind("wire_bytes.", 0) == 0) pt.wire += m->value;
    } else if (auto* a = std::get_if<proto::Accuracy>(&ev); a && a->metric == "rel_l2") {
      auto& [sum, n] = site_sum[a->site];
      sum += a->value;
      ++n;
    }
  });
  for (auto& [site, sn] : site_sum) pt.site_rel_l2[site] = sn.first / sn.second;
  pt.exit_code = r.exit_code;
  pt.ok = r.ok;
  pt.error = r.error;
  return std::move(r.logits);
}

// Log-softmax of one row, in double.
std::vector<double> log_softmax(const float* row, int64_t n) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, double(row[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(row[i]) - mx);
  std::vector<double> out(static_cast<size_t>(n));
  const double lse = mx + std::log(sum);
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = double(row[i]) - lse;
  return out;
}

// The spacing of bf16 values at magnitude |x| (2^-133 below the normal range).
double bf16_step(double x) {
  x = std::fabs(x);
  if (x < 0x1p-126) return 0x1p-133;
  int e;
  std::frexp(x, &e);  // x = m 2^e, m in [0.5, 1): bf16 keeps 8 significant bits
  return std::ldexp(1.0, e - 8);
}

}  // namespace

int run_sweep(const SweepOptions& given, std::ostream& table) {
  SweepOptions so = given;
  RunOptions o = so.run;
  // The model once: its config, and its tokenizer where it reads text.
  std::filesystem::path model_dir;
  const ModelConfig cfg = resolve_model(o.model, &model_dir, o.overrides);
  const std::optional<text::Tokenizer> tokenizer = optional_tokenizer(model_dir);
  // No prompt given, and a model that reads text: score the held-out corpus.
  if (o.tokens.empty() && o.prompt_len == 0 && so.eval_tokens.empty() && so.eval_text.empty() && tokenizer)
    so.eval_text = "heldout";
  if (!so.eval_tokens.empty()) {
    std::ifstream in(so.eval_tokens);
    if (!in) throw UsageError("--eval-tokens " + so.eval_tokens + ": cannot open");
    std::string tok;
    o.tokens.clear();
    while (in >> tok) {
      for (char& c : tok)
        if (c == ',') c = ' ';
      std::istringstream parts(tok);
      long long v;
      while (parts >> v) o.tokens.push_back(int32_t(v));
    }
    if (o.tokens.size() < 2) throw UsageError("--eval-tokens " + so.eval_tokens + ": needs at least two token ids");
    o.prompt_len = 0;
  }
  if (!so.eval_text.empty()) {
    if (!so.eval_tokens.empty()) throw UsageError("--eval-text and --eval-tokens each give the text: use one");
    // Bounded so the tokens pass to each rank run as one argument (under 128 KiB).
    if (so.eval_windows < 1 || so.eval_window < 2 || so.eval_window > 16384 ||
        int64_t(so.eval_windows) * so.eval_window > 16384)
      throw UsageError("--eval-windows x --eval-window must be at most 16384 tokens (windows >= 1, of >= 2 tokens)");
    if (!tokenizer) {
      model_tokenizer(model_dir);  // a file it cannot follow: its own reason
      throw UsageError("--eval-text needs a model folder with a tokenizer.json; --model " + o.model + " has none");
    }
    const std::string path = so.eval_text == "heldout" ? text::brown_heldout_path() : so.eval_text;
    std::vector<int32_t> ids = text::encode_documents(text::read_text(path, "--eval-text"), *tokenizer);
    const int64_t want = int64_t(so.eval_windows) * so.eval_window;
    if (int64_t(ids.size()) < want)
      throw UsageError("--eval-text " + path + " holds " + std::to_string(ids.size()) + " tokens, fewer than " +
                       std::to_string(so.eval_windows) + " windows of " + std::to_string(so.eval_window));
    ids.resize(size_t(want));
    o.tokens = ids;
    o.prompt.reset();
    o.prompt_len = 0;
    o.window = so.eval_window;
    o.batch = so.eval_windows;
    o.decode = 0;
  }
  if (!o.sampling.greedy())
    throw UsageError("sweep compares each configuration's decode with the reference's greedy tokens; --temperature and "
                     "--top-k are for run and launch");
  // Refuse before any run: the setup must run, its strategy all-reduce, the grid parse.
  validate(o);
  check_child_arguments(o);
  if (!has_tp_all_reduces(o))
    throw UsageError("sweep quantizes tensor-parallel all-reduces, and --strategy " + o.strategy +
                     " has none; use --strategy tp or tp_sp with T > 1");
  bool has_attn = false, has_mixer = false;
  for (int i = 0; i < cfg.n_layers; ++i) (cfg.layer_kind(i) == LayerKind::Attention ? has_attn : has_mixer) = true;
  std::vector<std::string> sites;
  for (auto& s : so.sites) {
    if (s != "all" && s != "attn" && s != "mlp" && s != "mixer")
      throw UsageError("--sites: unknown site '" + s + "'; sites are all, attn, mlp, mixer");
    if ((s == "attn" || s == "mlp") && !has_attn) continue;
    if (s == "mixer" && !has_mixer) continue;
    sites.push_back(s);
  }
  if (so.rounding != "rn" && so.rounding != "sr") throw UsageError("--rounding must be rn or sr");
  std::vector<std::pair<std::string, std::string>> specs;  // (spec, precision name)
  for (auto& p : so.precisions) {
    if (p.find(':') != std::string::npos)  // "int8:64" would become "int8:64:128", the last block silently winning
      throw UsageError("--precisions " + p + ": name formats only (fp32, bf16, fp16, int8, int4, fp8); block sizes go in "
                       "--blocks, rounding in --rounding");
    const QuantSpec probe_spec = parse_quant_spec(p, "--precisions");  // refuses unknown precisions
    if (!probe_spec.is_block()) specs.emplace_back(p, p);
    else
      for (const std::string& b : so.blocks) specs.emplace_back(p + ":" + b + (so.rounding == "sr" ? ":sr" : ""), p);
  }
  for (auto& [spec, name] : specs) parse_quant_spec(spec, "--blocks");  // block sizes

  std::FILE* f = stdout;
  if (!so.events.empty() && so.events != "-") {
    f = std::fopen(so.events.c_str(), "w");
    if (!f) throw UsageError("--events " + so.events + ": cannot create the file");
  }
  proto::Writer out(f);
  out.write(proto::Hello{proto::kVersion, engine_version(), host_name()});
  nlohmann::json sweep = {{"precisions", so.precisions}, {"blocks", so.blocks}, {"sites", sites},
                          {"per_layer", so.per_layer}, {"rounding", so.rounding}, {"eval_tokens", so.eval_tokens},
                          {"eval_text", so.eval_text}, {"windows", o.window ? o.batch : 0}, {"window", o.window}};
  const std::string dtype(compute_dtype_name(o.dtype));
  out.write(proto::Config{{{"sweep", sweep}, {"model", cfg.to_json()}, {"strategy", o.strategy},
                           {"devices", o.devices}, {"dtype", dtype},
                           {"kv_dtype", std::string(compute_dtype_name(cache_dtype(o)))}, {"workload", {{"prompt_len", o.tokens.empty() ? o.prompt_len : int64_t(o.tokens.size())}, {"decode", o.decode}, {"seed", o.seed}}},
                           {"command", invocation()}}});
  out.flush();

  const std::string base = scratch_base("sweep");
  // The reference: the all-reduces unquantized, in the run's own dtype.
  SweepPoint ref;
  ref.label = dtype;
  const NpyArray R = run_point(o, dtype, base, ref);
  if (!ref.ok) {
    out.write(proto::Error{"failed", -1, "the unquantized reference run failed: " + ref.error, {}});
    out.write(proto::Done{"failed", 0, kExitFailure});
    out.flush();
    if (f != stdout) std::fclose(f);
    throw UsageError("the unquantized reference run failed: " + ref.error);
  }
  const int64_t V = R.shape.back(), rows = int64_t(R.data.size()) / V;
  // --eval-text: W-token windows, each scored on its own (P: one window).
  const int64_t W = o.window, P = W ? W : o.tokens.empty() ? o.prompt_len : int64_t(o.tokens.size());
  // The reference's greedy tokens: every quantized run decodes them (teacher
  // forcing), so each position is compared in the same context; where the
  // quantized run's own greedy choice would first differ is reported apart.
  std::vector<int32_t> forced;
  for (int64_t k = 0; k < o.decode && P - 1 + k < rows; ++k)
    forced.push_back(int32_t(argmax_row(&R.data[size_t((P - 1 + k) * V)], V)));
  auto perplexity = [&](const NpyArray& L) -> double {
    if (o.tokens.empty()) return NAN;
    double nll = 0;
    int64_t n = 0;
    const int64_t windows = W ? int64_t(o.tokens.size()) / W : 1;
    for (int64_t w = 0; w < windows; ++w)  // row w P + i predicts token w P + i + 1 of its window
      for (int64_t i = 0; i + 1 < P; ++i, ++n)
        nll -= log_softmax(&L.data[size_t((w * P + i) * V)], V)[size_t(o.tokens[size_t(w * P + i + 1)])];
    return std::exp(nll / double(std::max<int64_t>(n, 1)));
  };
  ref.ppl = perplexity(R);
  ref.top1 = 1;
  ref.top1_decided = 1;
  // Positions the reference itself does not decide at bf16 resolution: its two
  // highest logits lie within one bf16 step of each other (at their
  // magnitude), so bf16 logits could not even order them and any bf16
  // rounding upstream may swap them. Top-1 agreement is reported over all
  // positions and over the decided ones; how many are tied is reported too.
  // The same positions are excluded for every configuration.
  std::vector<char> tied(static_cast<size_t>(rows), 0);
  int64_t ties = 0;
  double entropy = 0;
  std::vector<double> margin_steps;  // top-2 gap in bf16 steps, per position
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = &R.data[size_t(r * V)];
    const int64_t a = argmax_row(z, V);
    double second = -INFINITY;
    for (int64_t v = 0; v < V; ++v)
      if (v != a) second = std::max(second, double(z[v]));
    const double top = std::fabs(double(z[a]));
    const double step = bf16_step(std::isfinite(second) ? std::max(top, std::fabs(second)) : top);
    margin_steps.push_back((double(z[a]) - second) / step);
    tied[size_t(r)] = double(z[a]) - second < step;
    ties += tied[size_t(r)];
    const auto lp = log_softmax(z, V);
    for (int64_t v = 0; v < V; ++v) entropy -= std::exp(lp[size_t(v)]) * lp[size_t(v)];
  }
  entropy /= double(std::max<int64_t>(rows, 1));
  std::sort(margin_steps.begin(), margin_steps.end());
  const double median_margin = margin_steps.empty() ? 0 : margin_steps[margin_steps.size() / 2];
  auto emit = [&](const SweepPoint& p) {
    auto acc = [&](const char* metric, double v, const std::string& site = "") {
      out.write(proto::Accuracy{metric, site, -1, v, p.label});
    };
    acc("wire_bytes", p.wire);
    acc("wire_bytes_fp32", p.wire_fp32);
    acc("wire_bytes_native", p.wire_native);
    acc("kl", p.kl);
    acc("top1", p.top1);
    acc("top1_decided", p.top1_decided);
    if (!W) acc("first_divergence", p.first_divergence);  // teacher-forced windows decode nothing
    if (!std::isnan(p.ppl)) acc("perplexity", p.ppl);
    for (auto& [site, v] : p.site_rel_l2) acc("rel_l2", v, site);
    out.flush();
  };
  // The greedy token a configuration would choose at each decode step (its
  // logits' argmax, in the reference's context), for the explorer to set side
  // by side; the first difference is the first divergence.
  if (tokenizer && o.prompt) out.write(proto::Prompt{*o.prompt, std::vector<int64_t>(o.tokens.begin(), o.tokens.end())});
  auto greedy = [&](const NpyArray& L, const std::string& label) {
    proto::Generation g;
    g.config = label;
    for (int64_t k = 0; k <= o.decode && P - 1 + k < rows; ++k)
      g.tokens.push_back(argmax_row(&L.data[size_t((P - 1 + k) * V)], V));
    if (tokenizer) describe_tokens(g, *tokenizer);
    out.write(g);
  };
  emit(ref);
  greedy(R, ref.label);
  out.write(proto::Accuracy{"positions", "", -1, double(rows), ref.label});
  out.write(proto::Accuracy{"tied_positions", "", -1, double(ties), ref.label});
  out.write(proto::Accuracy{"entropy", "", -1, entropy, ref.label});
  out.flush();

  // The configurations: each spec at every site together and at one site at
  // a time; with --per-layer, also every site of one layer at a time.
  struct Config {
    std::string spec, name, site, label;
  };
  std::vector<Config> configs;
  for (auto& [spec, name] : specs) {
    for (auto& site : sites) configs.push_back({spec, name, site, site == "all" ? spec : site + "=" + spec});
    if (so.per_layer)
      for (int l = 0; l < cfg.n_layers; ++l)
        configs.push_back({spec, name, "layer " + std::to_string(l),
                           "all@" + std::to_string(l) + "-" + std::to_string(l) + "=" + spec});
  }
  std::vector<SweepPoint> points;
  int index = 0;
  const int total = int(configs.size());
  for (const Config& c : configs) {
    const std::string& spec = c.spec;
    {
      SweepPoint p;
      p.precision = c.name;
      p.block = parse_quant_spec(spec).is_block() ? parse_quant_spec(spec).block : 0;
      p.site = c.site;
      p.label = c.label;
      std::fprintf(stderr, "sweep: %d/%d %s\n", ++index, total, p.label.c_str());
      const NpyArray Q = run_point(o, p.label, base, p, forced);
      if (p.ok && Q.data.size() != R.data.size()) {
        p.ok = false;
        p.error = "its logits hold " + std::to_string(Q.data.size()) + " values where the reference's hold " +
                  std::to_string(R.data.size());
      }
      if (p.ok) {
        double kl = 0;
        int64_t agree = 0, agree_decided = 0;
        for (int64_t r = 0; r < rows; ++r) {
          const auto lp = log_softmax(&R.data[size_t(r * V)], V), lq = log_softmax(&Q.data[size_t(r * V)], V);
          for (int64_t v = 0; v < V; ++v) kl += std::exp(lp[size_t(v)]) * (lp[size_t(v)] - lq[size_t(v)]);
          const bool same = argmax_row(&R.data[size_t(r * V)], V) == argmax_row(&Q.data[size_t(r * V)], V);
          agree += same;
          agree_decided += same && !tied[size_t(r)];
        }
        p.kl = kl / double(rows);
        p.top1 = double(agree) / double(rows);
        p.top1_decided = rows > ties ? double(agree_decided) / double(rows - ties) : 1.0;
        for (int64_t k = 0; k <= o.decode && P - 1 + k < rows; ++k)
          if (argmax_row(&R.data[size_t((P - 1 + k) * V)], V) != argmax_row(&Q.data[size_t((P - 1 + k) * V)], V)) {
            p.first_divergence = int(k);
            break;
          }
        p.ppl = perplexity(Q);
        emit(p);
        greedy(Q, p.label);
      } else {
        // The configuration's own failure, in the protocol's codes.
        const char* code = p.exit_code == kExitOom ? "oom" : p.exit_code == kExitUsage ? "usage" : "internal";
        out.write(proto::Error{code, -1, p.label + ": " + p.error, {}});
      }
      points.push_back(p);
    }
  }
  // A grid with holes is not a finished sweep: the table below shows what
  // ran, and the run fails.
  const bool all_ran = std::all_of(points.begin(), points.end(), [](const SweepPoint& p) { return p.ok; });
  out.write(all_ran ? proto::Done{"ok", 0, kExitOk} : proto::Done{"failed", 0, kExitFailure});
  out.flush();
  if (f != stdout) std::fclose(f);

  // The trade-off table, the Pareto front over (wire bytes, KL), and sensitivity.
  char line[512];
  table << "\nsweep: " << cfg.name << ", " << o.strategy << " on " << o.devices << " ranks, " << rows << " positions ";
  if (W)
    table << "(" << o.batch << " windows of " << W << " tokens of " << so.eval_text << ", teacher-forced), ";
  else
    table << "(prompt " << P << " + decode " << o.decode << ", decoded with the reference's greedy tokens), ";
  table << "rounding " << so.rounding << "\n";
  std::snprintf(line, sizeof line,
                "reference: mean next-token entropy %.2f nats (uniform: %.2f); median top-2 logit gap %.1f bf16 steps; "
                "%lld of %lld positions tied (top-2 gap under one bf16 step), excluded from 'decided'\n",
                entropy, std::log(double(V)), median_margin, static_cast<long long>(ties), static_cast<long long>(rows));
  table << line;
  const std::string versus = "vs " + dtype;
  std::snprintf(line, sizeof line, "%-22s %12s %9s %12s %10s %10s %10s %10s %s\n", "config", "wire B/rank", versus.c_str(),
                "logits KL", "top-1", "decided", "diverges", "perplexity", "site rel L2");
  table << line;
  auto row = [&](const SweepPoint& p, bool pareto) {
    std::string sites_err;
    for (auto& [s, v] : p.site_rel_l2) {
      char b[48];
      std::snprintf(b, sizeof b, "%s %.2e ", s.c_str(), v);
      sites_err += b;
    }
    char div[16], ppl[24];
    if (W) std::snprintf(div, sizeof div, "-");  // teacher-forced windows: nothing is decoded
    else if (p.first_divergence < 0) std::snprintf(div, sizeof div, "never");
    else std::snprintf(div, sizeof div, "step %d", p.first_divergence);
    if (std::isnan(p.ppl)) std::snprintf(ppl, sizeof ppl, "-");
    else std::snprintf(ppl, sizeof ppl, "%.4f", p.ppl);
    std::snprintf(line, sizeof line, "%-22s %12.0f %8.3fx %12.3e %9.2f%% %9.2f%% %10s %10s %s%s\n", p.label.c_str(),
                  p.wire, p.wire_native > 0 ? p.wire / p.wire_native : 1.0, p.kl, 100 * p.top1, 100 * p.top1_decided, div,
                  ppl, sites_err.c_str(), pareto ? " *" : "");
    table << line;
  };
  row(ref, false);
  for (const SweepPoint& p : points) {
    if (!p.ok) {
      table << p.label << ": failed: " << p.error << "\n";
      continue;
    }
    bool dominated = false;
    for (const SweepPoint& q : points)
      if (q.ok && q.site == "all" && p.site == "all" && (q.wire <= p.wire && q.kl <= p.kl) &&
          (q.wire < p.wire || q.kl < p.kl))
        dominated = true;
    row(p, p.site == "all" && !dominated);
  }
  table << "* on the Pareto front of wire bytes against logits KL (all sites quantized)\n";
  if (o.tokens.empty()) table << "perplexity: give --eval-text FILE (or --eval-tokens FILE of token ids) to score a text\n";
  // Sensitivity: the points of one spec whose site passes `which`, highest KL first.
  auto sensitivity = [&](const char* title, const std::function<bool(const std::string&)>& which) {
    table << title;
    for (auto& [spec, name] : specs) {
      std::vector<std::pair<double, std::string>> rank;
      for (size_t i = 0; i < points.size(); ++i)
        if (points[i].ok && configs[i].spec == spec && which(points[i].site)) rank.emplace_back(-points[i].kl, points[i].site);
      std::sort(rank.begin(), rank.end());
      table << "  " << spec << ":";
      for (auto& [negkl, site] : rank) {
        std::snprintf(line, sizeof line, " %s (KL %.2e)", site.c_str(), -negkl);
        table << line;
      }
      table << "\n";
    }
  };
  if (sites.size() > 2)
    sensitivity("\nper-site sensitivity (only that site quantized; highest KL first)\n",
                [](const std::string& s) { return s == "attn" || s == "mlp" || s == "mixer"; });
  if (so.per_layer)
    sensitivity("\nper-layer sensitivity (only that layer's all-reduces quantized; highest KL first)\n",
                [](const std::string& s) { return s.rfind("layer ", 0) == 0; });
  if (!all_ran)
    table << "\nsweep: " << std::count_if(points.begin(), points.end(), [](const SweepPoint& p) { return !p.ok; })
          << " of " << points.size() << " configurations failed (above)\n";
  return all_ran ? kExitOk : kExitFailure;
}

}  // namespace ss
