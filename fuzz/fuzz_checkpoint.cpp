// A model folder as `run --model DIR` loads it: a fixed config.json of a
// micro Llama and a fuzzed model.safetensors. The checkpoint source checks
// every weight's presence and shape, then the model's weights are filled
// from it on the cpu backend (bytes of the file's dtype, rounded or copied).
#include "core/allocator.h"
#include "cpu/cpu_backend.h"
#include "fuzz_support.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/model.h"

namespace {

const char* kConfig =
    R"({"model_type": "llama", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path dir = [] {
    auto d = ss::fuzz::scratch_dir() / "model";
    std::filesystem::create_directories(d);
    ss::fuzz::write_file(d / "config.json", kConfig);
    return d;
  }();
  static const ss::ModelConfig cfg = ss::parse_model_config(nlohmann::json::parse(kConfig), "micro-llama");
  ss::fuzz::write_file(dir / "model.safetensors", std::string_view(reinterpret_cast<const char*>(data), size));
  ss::fuzz::expect_clean("checkpoint", [&] {
    ss::Allocator alloc(int64_t(1) << 26);
    ss::Recorder rec;
    ss::CpuBackend be(alloc, rec);
    ss::Model model(cfg, be);
    ss::CheckpointSource src(dir, model.weights());
    model.load(src);
  });
  return 0;
}
