// The options a run is planned from, as the command line and the explorer
// hand them over: one field per line (model preset, config overrides,
// strategy, devices, mesh, split, attention, batch, dtype, kv dtype,
// all-reduce precision, prompt, decode, capacity, tokens, then training's
// sequence length, micro-batch, accumulation, global batch, steps,
// recomputation, and the backend: cpu or sim). Each value goes through the parser the
// command line uses, then into plan_inference and plan_training, which must
// refuse with one UsageError or FormatError or return a plan that holds
// together.
#include <charconv>

#include "comm/quantize.h"
#include "fuzz_support.h"
#include "model/config.h"
#include "runtime/run.h"
#include "runtime/train.h"
#include "train/train_model.h"

namespace {

// A number field as CLI11 would take it; false when it is not one (CLI11 refuses those itself).
template <class T>
bool number(const std::string& s, T& out) {
  if (s.empty()) return true;  // absent: the default
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) out.push_back(std::exchange(cur, {}));
    else cur.push_back(c);
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> f = ss::fuzz::fields(data, size);
  f.resize(22);
  static const std::vector<std::string> presets = ss::preset_names();
  if (presets.empty()) std::abort();  // SHARDSCOPE_RESOURCES must name the resources folder
  ss::TrainOptions t;
  ss::RunOptions& o = t.run;
  // The explorer offers presets; a folder would make this a checkpoint fuzzer.
  size_t pick = 0;
  for (char c : f[0]) pick = pick * 31 + uint8_t(c);
  o.model = presets[pick % presets.size()];
  o.overrides = split(f[1], ',');
  if (!f[2].empty()) o.strategy = f[2];
  o.mesh = f[4];
  if (!f[5].empty()) o.split = f[5];
  if (!f[6].empty()) o.attention = f[6];
  o.comm_precision = f[10];
  int64_t tokens_field = 0;
  if (!number(f[3], o.devices) || !number(f[7], o.batch) || !number(f[11], o.prompt_len) ||
      !number(f[12], o.decode) || !number(f[13], o.capacity) || !number(f[15], t.seq_len) ||
      !number(f[16], t.micro_batch) || !number(f[17], t.grad_accum) || !number(f[18], t.global_batch) ||
      !number(f[19], t.steps))
    return 0;
  for (const std::string& tok : split(f[14], ','))
    if (!number(tok, tokens_field) || tokens_field != int32_t(tokens_field)) return 0;
    else o.tokens.push_back(int32_t(tokens_field));
  if (!f[20].empty()) t.recompute = f[20];
  const std::string backend = f[21] == "sim" ? "sim" : "cpu";
  if (backend == "sim") {
    o.backend = "sim";
    t.hardware = "h100-sxm";
  }
  ss::fuzz::expect_clean("options", [&] {
    if (!f[8].empty()) o.dtype = ss::parse_compute_dtype(f[8]);
    if (!f[9].empty()) o.kv_dtype = ss::parse_compute_dtype(f[9], "--kv-dtype");
    if (!o.comm_precision.empty()) (void)ss::parse_comm_precision(o.comm_precision).str();
    for (const std::string& q : split(f[10], ',')) (void)ss::parse_quant_spec(q);
  });
  ss::fuzz::expect_clean("options", [&] {
    const ss::RunPlan p = ss::plan_inference(o, backend);
    if (p.tp * p.sp != p.devices && p.strategy != ss::Strategy::TSP && p.strategy != ss::Strategy::DP &&
        p.strategy != ss::Strategy::Single)
      std::abort();
  });
  ss::fuzz::expect_clean("options", [&] {
    (void)ss::parse_recompute(t.recompute);
    const ss::TrainPlan p = ss::plan_training(t);
    if (p.grad_accum < 1 || p.replicas < 1) std::abort();
  });
  return 0;
}
