#include "runtime/run.h"

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "core/error.h"
#include "cpu/cpu_backend.h"
#include "cpu/kernels.h"
#include "io/checkpoint.h"
#include "io/npy.h"
#include "model/model.h"

#ifndef SHARDSCOPE_VERSION
#define SHARDSCOPE_VERSION "0.0.0"
#endif

namespace ss {
namespace {

int64_t status_field(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key))) * 1024;
  return 0;
}

// Writes the recorder's spans and memory samples, then flushes: one step.
void drain(Recorder& rec, proto::Writer& out) {
  for (auto& m : rec.mem_samples()) out.write(m);
  for (auto& s : rec.spans()) out.write(s);
  rec.clear();
  out.flush();
}

void emit_metric(proto::Writer& out, const char* name, double value, const char* unit) {
  out.write(proto::Metric{name, value, unit, -1});
}

}  // namespace

std::string engine_version() { return SHARDSCOPE_VERSION; }

std::string host_name() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

int64_t peak_rss_bytes() { return status_field("VmHWM:"); }
int64_t current_rss_bytes() { return status_field("VmRSS:"); }

std::vector<int32_t> make_prompt(const RunOptions& o, int64_t vocab) {
  if (!o.tokens.empty()) {
    for (int32_t t : o.tokens)
      if (t < 0 || t >= vocab)
        throw UsageError("--tokens: id " + std::to_string(t) + " is outside the vocabulary [0, " +
                         std::to_string(vocab) + ")");
    return o.tokens;
  }
  std::vector<int32_t> p(static_cast<size_t>(o.prompt_len));
  uint64_t x = o.seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
  for (auto& t : p) {  // xorshift64*: a reproducible token stream
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    t = int32_t((x * 0x2545f4914f6cdd1dull >> 33) % uint64_t(vocab));
  }
  return p;
}

void validate(const RunOptions& o) {
  if (o.backend != "cpu")
    throw UsageError("--backend " + o.backend + " is not available in this command; use --backend cpu");
  if (o.strategy != "single")
    throw UsageError("--strategy " + o.strategy + " needs several devices: use `shardscope-engine launch`");
  if (o.tokens.empty() && o.prompt_len <= 0) throw UsageError("give a prompt: --prompt-len N (N >= 1) or --tokens 1,2,3");
  if (!o.tokens.empty() && o.prompt_len > 0) throw UsageError("give either --prompt-len or --tokens, not both");
  if (o.decode < 0) throw UsageError("--decode must be >= 0");
  if (o.capacity < 0) throw UsageError("--capacity must be >= 0");
  if (o.prompt_len > 100'000'000) throw UsageError("--prompt-len is over 100M tokens");
}

RunResult run_inference(const RunOptions& o, proto::Writer& out) {
  RunResult res;
  const auto origin = std::chrono::steady_clock::now();
  Allocator alloc(o.capacity);
  Recorder rec(0);
  rec.set_origin(origin);
  alloc.set_listener([&](const MemState& m) { rec.mem_sample(rec.now(), m); });
  CpuBackend be(alloc, rec);
  if (o.threads > 0) cpu::set_threads(o.threads);

  out.write(proto::Hello{proto::kVersion, engine_version(), host_name()});
  auto fail = [&](const char* code, const std::string& msg, int exit_code, nlohmann::json detail = {}) {
    drain(rec, out);
    out.write(proto::Error{code, 0, msg, std::move(detail)});
    const char* status = exit_code == kExitOom ? "oom" : "failed";
    out.write(proto::Done{status, rec.now(), exit_code});
    out.flush();
    res.exit_code = exit_code;
    res.status = status;
    res.error = msg;
    return res;
  };

  try {
    validate(o);
    std::filesystem::path dir;
    ModelConfig cfg = resolve_model(o.model, &dir, o.overrides);
    Model model(cfg, be);
    std::unique_ptr<TensorSource> src;
    if (dir.empty()) src = std::make_unique<SyntheticSource>(o.seed);
    else src = std::make_unique<CheckpointSource>(dir, model.weights());
    const std::vector<int32_t> prompt = make_prompt(o, cfg.vocab);
    const int64_t P = int64_t(prompt.size()), total = P + o.decode;

    nlohmann::json conf = {
        {"model", cfg.to_json()},
        {"weights", src->describe()},
        {"parameters", model.parameter_count()},
        {"backend", o.backend},
        {"strategy", o.strategy},
        {"devices", 1},
        {"workload", {{"batch", 1}, {"prompt_len", P}, {"decode", o.decode}, {"seed", o.seed}}},
        {"capacity", o.capacity},
        {"threads", cpu::threads()},
    };
    out.write(proto::Config{conf});
    out.write(proto::Device{0, "cpu", be.device_name(), o.capacity, host_name()});
    out.write(proto::Tokens{0, {{0, total}}});
    out.write(proto::Phase{"load", rec.now()});
    out.flush();

    rec.set_phase("load");
    model.load(*src);
    for (const WeightSpec& w : model.weights()) {
      proto::Placement p;
      p.rank = 0;
      p.tensor = w.name;
      p.layer = w.layer;
      p.shape = w.shape;
      p.mode = "mirrored";
      p.bytes = numel(w.shape) * 4;
      out.write(p);
    }
    Cache cache = model.make_cache(total);
    drain(rec, out);

    std::vector<float> logits_rows;
    const bool keep_logits = !o.logits_out.empty();
    auto keep = [&](const Tensor& logits) {
      if (!keep_logits) return;
      const size_t at = logits_rows.size();
      logits_rows.resize(at + size_t(logits.numel()));
      be.download(logits, logits_rows.data() + at);
    };

    // Prefill: the whole prompt in one forward; TTFT ends with the first token.
    out.write(proto::Phase{"prefill", rec.now()});
    rec.set_phase("prefill");
    std::vector<int32_t> pos(static_cast<size_t>(P));
    for (int64_t i = 0; i < P; ++i) pos[size_t(i)] = int32_t(i);
    const int64_t t_prefill = rec.now();
    int32_t next;
    {
      Tensor logits = model.forward(prompt, pos, cache, keep_logits);
      next = be.argmax_row(logits, logits.rows() - 1);
      keep(logits);
    }
    const int64_t t_first = rec.now();
    res.ttft_s = (t_first - t_prefill) * 1e-9;
    res.prefill_s = res.ttft_s;
    drain(rec, out);

    // Decode: one token per step, reusing the KV and SSM state caches.
    std::vector<double> step_ms;
    if (o.decode > 0) {
      out.write(proto::Phase{"decode", rec.now()});
      rec.set_phase("decode");
    }
    for (int k = 0; k < o.decode; ++k) {
      res.generated.push_back(next);
      const int32_t p1 = int32_t(P + k);
      const int64_t t0 = rec.now();
      Tensor logits = model.forward(std::span<const int32_t>(&next, 1), std::span<const int32_t>(&p1, 1), cache, false);
      next = be.argmax_row(logits, 0);
      keep(logits);
      step_ms.push_back((rec.now() - t0) * 1e-6);
      drain(rec, out);
    }
    for (double ms : step_ms) res.decode_s += ms * 1e-3;

    const MemState& m = alloc.state();
    res.peak_bytes = m.peak_total;
    emit_metric(out, "ttft_ms", res.ttft_s * 1e3, "ms");
    emit_metric(out, "prefill_tokens_per_s", P / std::max(res.prefill_s, 1e-12), "tokens/s");
    if (o.decode > 0) {
      emit_metric(out, "decode_tokens_per_s", o.decode / std::max(res.decode_s, 1e-12), "tokens/s");
      emit_metric(out, "decode_ms_per_token", res.decode_s * 1e3 / o.decode, "ms");
    }
    emit_metric(out, "parameters", double(model.parameter_count()), "count");
    emit_metric(out, "peak_bytes", double(m.peak_total), "bytes");
    for (int c = 0; c < kCategoryCount; ++c)
      emit_metric(out, ("peak_" + std::string(kCategoryNames[size_t(c)]) + "_bytes").c_str(), double(m.peak_bytes[size_t(c)]),
                  "bytes");
    emit_metric(out, "peak_rss_bytes", double(peak_rss_bytes()), "bytes");
    if (keep_logits) {
      const std::vector<int64_t> shape = {total, cfg.vocab};
      write_npy(o.logits_out, shape, logits_rows.data());
    }
    res.generated.push_back(next);
    out.write(proto::Done{"ok", rec.now(), kExitOk});
    out.flush();
    res.status = "ok";
    return res;
  } catch (const OomError& e) {
    return fail("oom", e.what(), kExitOom,
                {{"category", e.category}, {"requested", e.requested}, {"in_use", e.in_use}, {"capacity", e.capacity}});
  } catch (const UsageError& e) {
    return fail("usage", e.what(), kExitUsage);
  } catch (const FormatError& e) {
    return fail("format", e.what(), kExitUsage);
  } catch (const std::exception& e) {
    return fail("internal", e.what(), kExitFailure);
  }
}

}  // namespace ss
