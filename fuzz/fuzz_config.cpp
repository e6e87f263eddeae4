// config.json to ModelConfig: the Hugging Face keys of every family the
// engine knows, then the model that config describes, built on the meta
// backend (every weight's shape and byte count, nothing allocated), and
// its parameter count.
#include "core/allocator.h"
#include "fuzz_support.h"
#include "model/config.h"
#include "model/model.h"
#include "sim/meta_backend.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;  // not JSON: the loaders say so before parsing a config
  ss::fuzz::expect_clean("config", [&] {
    ss::ModelConfig cfg = ss::parse_model_config(j, "config.json");
    (void)cfg.to_json();
    // Deep models are legal and only slow: keep each input's time bounded.
    if (cfg.n_layers > 64) return;
    ss::Allocator none;
    ss::Recorder quiet;
    ss::MetaBackend meta(none, quiet);
    ss::Model model(cfg, meta);
    (void)model.parameter_count();
  });
  return 0;
}
