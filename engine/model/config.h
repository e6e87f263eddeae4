// Model configuration, read from a Hugging Face config.json (llama, qwen2,
// mamba, falcon_mamba, mamba2) or from a preset in resources/models/ written in the
// same format (plus "shardscope_hybrid" for the Zamba-like hybrid).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"

namespace ss {

enum class Family { Llama, Mamba, Mamba2, Hybrid };
enum class LayerKind { Attention, Mamba, Mamba2 };  // Attention = attention + gated MLP block

struct ModelConfig {
  std::string name;        // preset name or folder name
  std::string model_type;  // as in config.json
  Family family = Family::Llama;
  int64_t vocab = 0, d_model = 0;
  int n_layers = 0;
  bool tie_embeddings = false;
  float norm_eps = 1e-5f;

  // attention + MLP (Llama and the hybrid's attention layers)
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int64_t ffn_dim = 0;
  float rope_theta = 10000.0f;
  // config.json's rope_scaling: none, "linear" (positions / factor) or
  // "llama3" (Llama 3.1's per-frequency blend of scaled and unscaled).
  struct RopeScaling {
    enum class Kind { None, Linear, Llama3 } kind = Kind::None;
    double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_positions = 8192.0;
  } rope_scaling;
  // Projection biases: q/k/v (Qwen2, Llama's attention_bias), o_proj
  // (Llama's attention_bias), gate/up/down (Llama's mlp_bias).
  bool qkv_bias = false, o_bias = false, mlp_bias = false;

  // Mamba / Mamba2 mixers
  int64_t d_inner = 0;
  int d_state = 0, d_conv = 4;
  bool conv_bias = true;
  int dt_rank = 0;              // Mamba (v1)
  bool bcdt_rms = false;        // Falcon-Mamba: RMS-normalise dt, B, C
  float mixer_rms_eps = 1e-6f;  // Falcon-Mamba
  int ssm_heads = 0, ssm_head_dim = 0, n_groups = 1, chunk = 256;  // Mamba2
  float dt_min = 0.0f, dt_max = INFINITY;                            // Mamba2 time_step_limit

  // Number formats of the run (set from the run plan, not read from
  // config.json): weights, activations and communicated tensors in `dtype`,
  // the KV cache in `kv_dtype`; SSM states, softmax and norm statistics and
  // the logits stay fp32 (engine/README.md, "Number formats").
  DType dtype = DType::F32, kv_dtype = DType::F32;
  // The residual stream in fp32 whatever the dtype: mamba_ssm's (and HF's)
  // residual_in_fp32, true by default for Mamba, Falcon-Mamba and Mamba2;
  // Llama and the hybrid keep it in the compute dtype, as HF does.
  bool residual_in_fp32 = false;
  DType residual_dtype() const { return residual_in_fp32 ? DType::F32 : dtype; }

  std::string layer_pattern;  // one letter per layer: A attention, M Mamba2, S Mamba (v1)
  nlohmann::json source;      // the config.json object it was read from (with overrides)

  LayerKind layer_kind(int i) const;
  // The rotary inverse frequencies, head_dim / 2 of them (theta^(-2i/d), then rope_scaling).
  std::vector<double> rope_inv_freq() const;
  int64_t conv_dim() const;   // channels through conv1d
  int64_t in_proj_dim() const;
  std::string family_name() const;
  nlohmann::json to_json() const;  // the effective configuration, for the config event
};

// What parsing a config looked at: every key it looked up (whether the
// config had it or not), and the keys it passed over for another (n_layer
// where num_hidden_layers is given: overruled[loser] = winner).
struct ConfigReads {
  std::set<std::string> keys;
  std::map<std::string, std::string> overruled;
};

// Parses a config.json object; `origin` names the file in error messages.
// Throws FormatError/UsageError with one line naming the file and the field.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& origin, ConfigReads* reads = nullptr);

// Where resources live: $SHARDSCOPE_RESOURCES, next to the executable
// (../share/shardscope when installed), or the source tree.
std::filesystem::path resources_dir();
// The models of resources/models/: presets (NAME.json, synthetic weights)
// and shipped model folders (NAME/ with config.json, weights, tokenizer).
std::vector<std::string> preset_names();

// Resolves --model: a preset name, a shipped model folder's name, or a
// folder with config.json, with `overrides` applied; an override of a key
// the model's parser never reads is refused (UsageError, with the nearest
// field it does read). Sets `dir` to the checkpoint folder (empty for
// presets, which use synthetic weights).
ModelConfig resolve_model(const std::string& spec, std::filesystem::path* dir,
                          const std::vector<std::string>& overrides = {});

// --tokenizer's file: a tokenizer.json, a folder holding one, or a shipped
// model's by name. Throws UsageError naming what is missing.
std::filesystem::path resolve_tokenizer(const std::string& spec);

// Applies "key=value" overrides (e.g. from --set hidden_size=512) before parsing.
void apply_overrides(nlohmann::json& j, const std::vector<std::string>& overrides);

}  // namespace ss
