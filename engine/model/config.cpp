#include "model/config.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <numbers>
#include <optional>

#include "core/error.h"

namespace ss {
namespace {

using json = nlohmann::json;

// A field the config gets wrong: the message names the file and the field;
// `top` is its top-level key (rope_scaling for rope_scaling.factor), so that
// an override that set it can take the blame.
struct FieldError : FormatError {
  FieldError(const std::string& origin, const std::string& key, const std::string& why)
      : FormatError(origin + ": field '" + key + "' " + why), top(key.substr(0, key.find('.'))),
        what_of_field("field '" + key + "' " + why) {}
  std::string top, what_of_field;
};

// The parser reads a config through Fields, which notes every key it looks
// at (present or not), so that an override of a key it never reads is
// refused rather than silently ignored.
struct Fields {
  const json& j;
  const std::string& origin;
  ConfigReads* reads = nullptr;

  // Finds `key`, noting it as read.
  json::const_iterator find(const std::string& key) const {
    if (reads) reads->keys.insert(key);
    return j.find(key);
  }
  bool has(const std::string& key) const { return find(key) != j.end(); }
  bool given(const std::string& key) const {
    auto it = find(key);
    return it != j.end() && !it->is_null();
  }
  // `loser` is passed over for `winner`, which the config gives.
  void overrule(const std::string& loser, const std::string& winner) const {
    if (reads) reads->overruled[loser] = winner;
  }
  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw FieldError(origin, key, why);
  }
  int64_t i(const char* key, std::optional<int64_t> def = std::nullopt) const {
    auto it = find(key);
    if (it == j.end() || it->is_null()) {
      if (def) return *def;
      fail(key, "is missing");
    }
    if (!it->is_number_integer()) fail(key, "must be an integer");
    int64_t v = it->get<int64_t>();
    if (v < 0 || v > (int64_t(1) << 40)) fail(key, "is out of range");
    return v;
  }
  double f(const char* key, double def) const {
    auto it = find(key);
    if (it == j.end() || it->is_null()) return def;
    if (!it->is_number()) fail(key, "must be a number");
    return it->get<double>();
  }
  // An integer stored as int.
  int i32(const char* key, std::optional<int64_t> def = std::nullopt) const {
    const int64_t v = i(key, def);
    if (v > std::numeric_limits<int>::max()) fail(key, "is out of range");
    return int(v);
  }
  // A number stored as float: finite and within float's range (no overflowing cast).
  float f32(const char* key, double def) const {
    const double v = f(key, def);
    if (!std::isfinite(v) || std::abs(v) > double(std::numeric_limits<float>::max()))
      fail(key, "is out of range for a float");
    return float(v);
  }
  bool b(const char* key, bool def) const {
    auto it = find(key);
    if (it == j.end() || it->is_null()) return def;
    if (!it->is_boolean()) fail(key, "must be true or false");
    return it->get<bool>();
  }
  std::string s(const char* key, const std::string& def) const {
    auto it = find(key);
    if (it == j.end() || it->is_null()) return def;
    if (!it->is_string()) fail(key, "must be a string");
    return it->get<std::string>();
  }
  void positive(const char* key, int64_t v) const {
    if (v <= 0) fail(key, "must be positive");
  }
};

// rope_scaling as transformers writes it: {"rope_type": "llama3", "factor":
// 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
// "original_max_position_embeddings": 8192} (older folders say "type").
void parse_rope_scaling(const Fields& F, ModelConfig& c) {
  auto it = F.find("rope_scaling");
  if (it == F.j.end() || it->is_null()) return;
  if (!it->is_object()) F.fail("rope_scaling", "must be an object or null");
  const json& r = *it;
  auto fail = [&](const std::string& key, const std::string& why) { F.fail("rope_scaling." + key, why); };
  std::string kind;
  for (const char* key : {"rope_type", "type"})
    if (auto t = r.find(key); t != r.end() && !t->is_null()) {
      if (!t->is_string()) fail(key, "must be a string");
      kind = t->get<std::string>();
      break;
    }
  auto number = [&](const char* key, std::optional<double> def) {
    auto v = r.find(key);
    if (v == r.end() || v->is_null()) {
      if (!def) fail(key, "is missing");
      return *def;
    }
    if (!v->is_number()) fail(key, "must be a number");
    const double d = v->get<double>();
    if (!std::isfinite(d) || d <= 0) fail(key, "must be a positive number");
    return d;
  };
  ModelConfig::RopeScaling& s = c.rope_scaling;
  using Kind = ModelConfig::RopeScaling::Kind;
  if (kind == "default") return;
  if (kind == "linear") {
    s.kind = Kind::Linear;
    s.factor = number("factor", std::nullopt);
  } else if (kind == "llama3") {
    s.kind = Kind::Llama3;
    s.factor = number("factor", std::nullopt);
    s.low_freq_factor = number("low_freq_factor", std::nullopt);
    s.high_freq_factor = number("high_freq_factor", std::nullopt);
    s.original_max_positions = number("original_max_position_embeddings", std::nullopt);
    if (s.high_freq_factor <= s.low_freq_factor) fail("high_freq_factor", "must be greater than low_freq_factor");
  } else {
    fail("rope_type", kind.empty() ? "is missing; supported: linear, llama3"
                                   : "'" + kind + "' is not supported; supported: linear, llama3");
  }
  if (auto a = r.find("attention_factor"); a != r.end() && !a->is_null() && (!a->is_number() || a->get<double>() != 1.0))
    fail("attention_factor", "other than 1 is not supported");
}

void parse_attention(const Fields& F, ModelConfig& c) {
  c.n_heads = F.i32("num_attention_heads");
  F.positive("num_attention_heads", c.n_heads);
  c.n_kv_heads = F.i32("num_key_value_heads", c.n_heads);
  F.positive("num_key_value_heads", c.n_kv_heads);
  if (c.n_heads % c.n_kv_heads)
    F.fail("num_key_value_heads", "(" + std::to_string(c.n_kv_heads) + ") must divide num_attention_heads (" +
                                      std::to_string(c.n_heads) + ")");
  if (c.d_model % c.n_heads && !F.given("head_dim"))
    F.fail("num_attention_heads", "must divide hidden_size, or head_dim must be given");
  c.head_dim = F.i32("head_dim", c.d_model / c.n_heads);
  if (c.head_dim % 2) F.fail("head_dim", "must be even for rotary embeddings");
  c.ffn_dim = F.i("intermediate_size");
  F.positive("intermediate_size", c.ffn_dim);
  c.rope_theta = F.f32("rope_theta", 10000.0);
  if (!(c.rope_theta > 1.0f)) F.fail("rope_theta", "must be greater than 1");
  parse_rope_scaling(F, c);
  // Llama's attention_bias puts biases on q, k, v and o; Qwen2 has q, k, v
  // biases always (and no field for them).
  const bool qwen2 = c.model_type == "qwen2";
  const bool attention_bias = F.b("attention_bias", false);
  c.qkv_bias = qwen2 || attention_bias;
  c.o_bias = !qwen2 && attention_bias;
  c.mlp_bias = F.b("mlp_bias", false);
  if (F.b("use_sliding_window", false))
    F.fail("use_sliding_window", "is true; sliding-window attention is not supported (set it to false to attend to the whole context)");
  if (F.s("hidden_act", "silu") != "silu") F.fail("hidden_act", "must be silu (SwiGLU MLP)");
}

void parse_mamba2(const Fields& F, ModelConfig& c) {
  c.d_state = F.i32("state_size", 128);
  c.d_conv = F.i32("conv_kernel", 4);
  if (c.d_conv < 2 || c.d_conv > 7) F.fail("conv_kernel", "must be between 2 and 7");
  const int64_t expand = F.i("expand", 2);
  c.d_inner = expand * c.d_model;
  c.ssm_head_dim = F.i32("head_dim", 64);
  F.positive("head_dim", c.ssm_head_dim);
  if (c.d_inner % c.ssm_head_dim)
    F.fail("head_dim", "(" + std::to_string(c.ssm_head_dim) + ") must divide expand*hidden_size (" +
                           std::to_string(c.d_inner) + ")");
  c.ssm_heads = F.i32("num_heads", c.d_inner / c.ssm_head_dim);
  if (int64_t(c.ssm_heads) * c.ssm_head_dim != c.d_inner)
    F.fail("num_heads", "times head_dim must equal expand*hidden_size (" + std::to_string(c.d_inner) + ")");
  c.n_groups = F.i32("n_groups", 1);
  F.positive("n_groups", c.n_groups);
  if (c.ssm_heads % c.n_groups) F.fail("n_groups", "must divide num_heads");
  c.chunk = F.i32("chunk_size", 256);
  F.positive("chunk_size", c.chunk);
  c.conv_bias = F.b("use_conv_bias", true);
  if (F.b("use_bias", false)) F.fail("use_bias", "is true; projection biases are not supported");
  if (!F.b("rms_norm", true)) F.fail("rms_norm", "is false; only the gated RMSNorm variant is supported");
  if (auto it = F.find("time_step_limit"); it != F.j.end() && it->is_array() && it->size() == 2) {
    auto lim = [](const json& v, float def) {
      if (!v.is_number()) return def;
      const double d = v.get<double>();  // past float's range: the infinity of its sign
      return std::abs(d) <= double(std::numeric_limits<float>::max()) ? float(d) : d > 0 ? INFINITY : -INFINITY;
    };
    c.dt_min = lim((*it)[0], 0.0f);
    c.dt_max = lim((*it)[1], INFINITY);
  }
}

}  // namespace

LayerKind ModelConfig::layer_kind(int i) const {
  switch (layer_pattern.at(size_t(i))) {
    case 'A': return LayerKind::Attention;
    case 'S': return LayerKind::Mamba;
    default: return LayerKind::Mamba2;
  }
}

// As transformers' rope initialisation computes them (modeling_rope_utils:
// the default, linear and llama3 forms), in double.
std::vector<double> ModelConfig::rope_inv_freq() const {
  const int half = head_dim / 2;
  std::vector<double> f(size_t(std::max(half, 0)));
  for (int i = 0; i < half; ++i) f[size_t(i)] = std::pow(double(rope_theta), -2.0 * i / head_dim);
  const RopeScaling& s = rope_scaling;
  if (s.kind == RopeScaling::Kind::Linear) {
    for (double& v : f) v /= s.factor;
  } else if (s.kind == RopeScaling::Kind::Llama3) {
    // Wavelengths longer than the original context / low_freq_factor are
    // slowed by `factor`, shorter than context / high_freq_factor kept, and
    // those between blended linearly in context / wavelength.
    const double low_wavelen = s.original_max_positions / s.low_freq_factor;
    const double high_wavelen = s.original_max_positions / s.high_freq_factor;
    for (double& v : f) {
      const double wavelen = 2.0 * std::numbers::pi / v;
      if (wavelen > low_wavelen) v /= s.factor;
      else if (wavelen >= high_wavelen) {
        const double smooth = (s.original_max_positions / wavelen - s.low_freq_factor) /
                              (s.high_freq_factor - s.low_freq_factor);
        v = (1.0 - smooth) * v / s.factor + smooth * v;
      }
    }
  }
  return f;
}

int64_t ModelConfig::conv_dim() const {
  if (family == Family::Mamba) return d_inner;
  return d_inner + 2 * int64_t(n_groups) * d_state;
}

int64_t ModelConfig::in_proj_dim() const {
  if (family == Family::Mamba) return 2 * d_inner;
  return 2 * d_inner + 2 * int64_t(n_groups) * d_state + ssm_heads;  // [z, x, B, C, dt]
}

std::string ModelConfig::family_name() const {
  switch (family) {
    case Family::Llama: return "transformer";
    case Family::Mamba: return bcdt_rms ? "falcon_mamba" : "mamba";
    case Family::Mamba2: return "mamba2";
    case Family::Hybrid: return "hybrid";
  }
  return "?";
}

json ModelConfig::to_json() const {
  json j = {{"name", name}, {"model_type", model_type}, {"family", family_name()}, {"vocab_size", vocab},
            {"hidden_size", d_model}, {"num_hidden_layers", n_layers}, {"tie_word_embeddings", tie_embeddings},
            {"norm_eps", norm_eps}, {"layer_pattern", layer_pattern}};
  if (n_heads) {
    j["num_attention_heads"] = n_heads;
    j["num_key_value_heads"] = n_kv_heads;
    j["head_dim"] = head_dim;
    j["intermediate_size"] = ffn_dim;
    j["rope_theta"] = rope_theta;
    if (rope_scaling.kind != RopeScaling::Kind::None) {
      const bool l3 = rope_scaling.kind == RopeScaling::Kind::Llama3;
      j["rope_scaling"] = {{"rope_type", l3 ? "llama3" : "linear"}, {"factor", rope_scaling.factor}};
      if (l3) {
        j["rope_scaling"]["low_freq_factor"] = rope_scaling.low_freq_factor;
        j["rope_scaling"]["high_freq_factor"] = rope_scaling.high_freq_factor;
        j["rope_scaling"]["original_max_position_embeddings"] = rope_scaling.original_max_positions;
      }
    }
    j["biases"] = {{"qkv", qkv_bias}, {"o", o_bias}, {"mlp", mlp_bias}};
  }
  if (d_inner) {
    j["d_inner"] = d_inner;
    j["state_size"] = d_state;
    j["conv_kernel"] = d_conv;
  }
  if (family == Family::Mamba) j["time_step_rank"] = dt_rank;
  if (d_inner) j["residual_in_fp32"] = residual_in_fp32;
  if (ssm_heads) {
    j["ssm_heads"] = ssm_heads;
    j["ssm_head_dim"] = ssm_head_dim;
    j["n_groups"] = n_groups;
    j["chunk_size"] = chunk;
  }
  return j;
}

ModelConfig parse_model_config(const json& j, const std::string& origin, ConfigReads* reads) {
  if (!j.is_object()) throw FormatError(origin + ": not a JSON object");
  Fields F{j, origin, reads};
  ModelConfig c;
  c.source = j;
  c.model_type = F.s("model_type", "");
  c.name = F.s("shardscope_name", F.s("_name_or_path", ""));
  c.vocab = F.i("vocab_size");
  F.positive("vocab_size", c.vocab);
  c.d_model = F.i("hidden_size");
  F.positive("hidden_size", c.d_model);
  // num_hidden_layers, else mamba_ssm's n_layer.
  if (F.given("num_hidden_layers")) F.overrule("n_layer", "num_hidden_layers");
  c.n_layers = F.given("num_hidden_layers") ? F.i32("num_hidden_layers") : F.i32("n_layer", 0);
  F.positive("num_hidden_layers", c.n_layers);
  // (Deeper than any model built: a bigger number is a typo, not a model to allocate for.)
  if (c.n_layers > 100000) F.fail("num_hidden_layers", "is over 100000 layers");

  const std::string& t = c.model_type;
  if (t == "llama" || t == "qwen2") {
    c.family = Family::Llama;
    c.norm_eps = F.f32("rms_norm_eps", 1e-6);
    c.tie_embeddings = F.b("tie_word_embeddings", false);
    parse_attention(F, c);
    c.layer_pattern.assign(size_t(c.n_layers), 'A');
  } else if (t == "mamba" || t == "falcon_mamba") {
    c.family = Family::Mamba;
    c.bcdt_rms = t == "falcon_mamba";
    c.norm_eps = F.f32("layer_norm_epsilon", 1e-5);
    c.mixer_rms_eps = F.f32("mixer_rms_eps", 1e-6);
    c.tie_embeddings = F.b("tie_word_embeddings", t == "mamba");
    c.d_state = F.i32("state_size", 16);
    c.d_conv = F.i32("conv_kernel", 4);
    if (c.d_conv < 2 || c.d_conv > 7) F.fail("conv_kernel", "must be between 2 and 7");
    if (F.given("intermediate_size")) F.overrule("expand", "intermediate_size");
    c.d_inner = F.given("intermediate_size") ? F.i("intermediate_size") : F.i("expand", 2) * c.d_model;
    auto r = F.find("time_step_rank");
    if (r == j.end() || r->is_null() || (r->is_string() && r->get<std::string>() == "auto"))
      c.dt_rank = int((c.d_model + 15) / 16);
    else
      c.dt_rank = F.i32("time_step_rank");
    F.positive("time_step_rank", c.dt_rank);
    c.conv_bias = F.b("use_conv_bias", true);
    if (F.b("use_bias", false)) F.fail("use_bias", "is true; projection biases are not supported");
    c.residual_in_fp32 = F.b("residual_in_fp32", true);
    c.layer_pattern.assign(size_t(c.n_layers), 'S');
  } else if (t == "mamba2") {
    c.family = Family::Mamba2;
    c.norm_eps = F.f32("layer_norm_epsilon", 1e-5);
    c.tie_embeddings = F.b("tie_word_embeddings", false);
    parse_mamba2(F, c);
    c.residual_in_fp32 = F.b("residual_in_fp32", true);
    c.layer_pattern.assign(size_t(c.n_layers), 'M');
  } else if (t == "shardscope_hybrid") {
    c.family = Family::Hybrid;
    c.norm_eps = F.f32("rms_norm_eps", 1e-5);
    c.tie_embeddings = F.b("tie_word_embeddings", false);
    for (const char* part : {"attention", "mamba2"})
      if (F.has(part) && !j[part].is_object())
        throw FormatError(origin + ": '" + part + "' must be an object of that part's config.json fields");
    json attn = j.value("attention", json::object());
    json ssm = j.value("mamba2", json::object());
    for (auto& [k, v] : j.items())
      if (k != "attention" && k != "mamba2") {
        if (!attn.contains(k)) attn[k] = v;
        if (!ssm.contains(k)) ssm[k] = v;
      }
    parse_attention(Fields{attn, origin, reads}, c);
    parse_mamba2(Fields{ssm, origin, reads}, c);
    c.residual_in_fp32 = F.b("residual_in_fp32", false);
    c.layer_pattern = F.s("layer_pattern", "");
    if (c.layer_pattern.empty()) {
      const int64_t every = F.i("attention_every", 6);
      F.positive("attention_every", every);
      for (int i = 0; i < c.n_layers; ++i) c.layer_pattern += ((i + 1) % every == 0) ? 'A' : 'M';
    } else {
      F.overrule("attention_every", "layer_pattern");
    }
    if (int(c.layer_pattern.size()) != c.n_layers ||
        c.layer_pattern.find_first_not_of("AM") != std::string::npos)
      F.fail("layer_pattern", "must have one letter per layer, A (attention) or M (Mamba2)");
  } else {
    throw FormatError(origin + ": unknown architecture model_type '" + t +
                      "'; supported: llama, qwen2, mamba, falcon_mamba, mamba2, shardscope_hybrid");
  }
  return c;
}

std::filesystem::path resources_dir() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("SHARDSCOPE_RESOURCES"); env && *env) return env;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path cand : {exe.parent_path().parent_path() / "share" / "shardscope",
                          exe.parent_path() / "resources"})
      if (fs::exists(cand / "models", ec)) return cand;
  }
#ifdef SHARDSCOPE_SOURCE_RESOURCES
  return SHARDSCOPE_SOURCE_RESOURCES;
#else
  return "resources";
#endif
}

std::vector<std::string> preset_names() {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator(resources_dir() / "models", ec)) {
    std::error_code ignored;
    if (e.path().extension() == ".json") out.push_back(e.path().stem().string());
    else if (std::filesystem::exists(e.path() / "config.json", ignored)) out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void apply_overrides(json& j, const std::vector<std::string>& overrides) {
  for (const auto& o : overrides) {
    auto eq = o.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UsageError("--set '" + o + "' must look like key=value, e.g. hidden_size=512");
    std::string key = o.substr(0, eq), val = o.substr(eq + 1);
    json v = json::parse(val, nullptr, false);
    if (v.is_discarded()) v = json(val);
    j[key] = v;
    // The hybrid's sub-blocks inherit top-level keys; an override reaches
    // them too when they set the key themselves.
    for (const char* sub : {"attention", "mamba2"})
      if (j.contains(sub) && j[sub].is_object() && j[sub].contains(key)) j[sub][key] = v;
  }
}

namespace {

// Parses the overridden config and refuses an override of a key the parser
// never reads (a typo, or another family's field): nothing the engine
// computes would change.
ModelConfig parse_with_overrides(json j, const std::vector<std::string>& overrides, const std::string& origin,
                                 const std::string& spec) {
  apply_overrides(j, overrides);
  ConfigReads reads;
  ModelConfig c;
  try {
    c = parse_model_config(j, origin, &reads);
  } catch (const FormatError& e) {
    // A field an override set is the override's fault, not the file's.
    if (const auto* f = dynamic_cast<const FieldError*>(&e))
      for (auto o = overrides.rbegin(); o != overrides.rend(); ++o)  // the last of a key is the one applied
        if (o->substr(0, o->find('=')) == f->top) throw UsageError("--set '" + *o + "': " + f->what_of_field);
    if (overrides.empty()) throw;
    const std::string what = e.what();
    // Another field's check, which an override may have tripped (heads that
    // no longer divide, a pattern no longer as long as the layers).
    std::string given;
    for (const auto& o : overrides) given += (given.empty() ? "" : " ") + o;
    throw FormatError(what + " (with --set " + given + ")");
  }
  for (const auto& o : overrides) {
    const std::string key = o.substr(0, o.find('='));
    const std::string model = "model '" + spec + "' (" + c.model_type + ")";
    if (auto it = reads.overruled.find(key); it != reads.overruled.end())
      throw UsageError("--set '" + o + "': " + model + " takes " + it->second + " over " + key + "; set " + it->second +
                       " instead (or " + it->second + "=null to use " + key + ")");
    if (reads.keys.count(key)) continue;
    std::string msg = "--set '" + o + "': " + model + " does not read '" + key + "'";
    const std::string best = nearest_name(key, reads.keys);
    const std::string whole = key.substr(0, key.find('.'));
    if (key == "torch_dtype") msg += "; the run's number format is --dtype's";
    else if (whole != key && reads.keys.count(whole))
      msg += "; --set replaces a whole top-level field: " + whole + "={...} with every key it needs";
    else if (!best.empty()) msg += "; did you mean '" + best + "'?";
    else {
      std::string fields;
      for (const auto& k : reads.keys) fields += (fields.empty() ? "" : ", ") + k;
      msg += "; its fields: " + fields;
    }
    throw UsageError(msg);
  }
  return c;
}

}  // namespace

std::filesystem::path resolve_tokenizer(const std::string& spec) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path dir = spec;
  if (!fs::exists(spec, ec) && fs::path(spec).filename() == spec &&
      fs::exists(resources_dir() / "models" / spec / "config.json", ec))
    dir = resources_dir() / "models" / spec;
  const fs::path p = fs::is_directory(dir, ec) ? dir / "tokenizer.json" : dir;
  if (!fs::is_regular_file(p, ec))
    throw UsageError(p.string() + ": no such file (--tokenizer takes a tokenizer.json, its folder or a shipped model)");
  return p;
}

static json read_json_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  if (!in) throw FormatError(p.string() + ": cannot open");
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded()) throw FormatError(p.string() + ": not valid JSON");
  return j;
}

ModelConfig resolve_model(const std::string& spec, std::filesystem::path* dir,
                          const std::vector<std::string>& overrides) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // A folder: the path given, or a model shipped in resources/models/ by name.
  const fs::path shipped = resources_dir() / "models" / spec;
  const bool by_name = !fs::is_directory(spec, ec) && fs::path(spec).filename() == spec &&
                       fs::exists(shipped / "config.json", ec);
  if (by_name) return resolve_model(shipped.string(), dir, overrides);
  if (fs::is_directory(spec, ec)) {
    fs::path cfg = fs::path(spec) / "config.json";
    if (!fs::exists(cfg, ec)) throw FormatError(cfg.string() + ": missing (a model folder needs config.json)");
    ModelConfig c = parse_with_overrides(read_json_file(cfg), overrides, cfg.string(), spec);
    if (c.name.empty()) c.name = fs::path(spec).filename().string();
    if (dir) *dir = spec;
    return c;
  }
  fs::path preset = resources_dir() / "models" / (spec + ".json");
  if (!fs::exists(preset, ec)) {
    if (spec.find('/') != std::string::npos)
      throw UsageError("--model " + spec + ": no such folder (a model folder holds config.json)");
    const std::vector<std::string> presets = preset_names();
    if (const std::string near = nearest_name(spec, presets); !near.empty())
      throw UsageError("--model '" + spec + "' is not a preset; did you mean '" + near + "'?");
    std::string names;
    for (auto& n : presets) names += (names.empty() ? "" : ", ") + n;
    throw UsageError("--model '" + spec + "' is neither a preset nor a folder with config.json; presets: " + names);
  }
  ModelConfig c = parse_with_overrides(read_json_file(preset), overrides, preset.string(), spec);
  if (c.name.empty()) c.name = spec;
  if (dir) dir->clear();
  return c;
}

}  // namespace ss
