#include "runtime/prompt.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"

namespace ss {

std::optional<text::Tokenizer> model_tokenizer(const std::filesystem::path& dir) {
  if (dir.empty()) return std::nullopt;
  const std::filesystem::path file = dir / "tokenizer.json";
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return std::nullopt;
  return text::Tokenizer::load(file.string());
}

std::optional<text::Tokenizer> optional_tokenizer(const std::filesystem::path& dir) {
  try {
    return model_tokenizer(dir);
  } catch (const std::exception& e) {  // FormatError, or a file that cannot be read
    std::fprintf(stderr, "shardscope-engine: note: no text for this run: %s\n", e.what());
    return std::nullopt;
  }
}

void encode_prompt(RunOptions& o) {
  // --window: the batch is the number of windows (validate refuses what is not whole windows).
  const auto windows = [&o] {
    if (o.window > 0 && o.batch == 1 && int64_t(o.tokens.size()) >= 2 * o.window)
      o.batch = int(std::min<int64_t>(int64_t(o.tokens.size()) / o.window, 1 << 20));
  };
  if (!o.prompt) return windows();
  if (!o.tokens.empty() || o.prompt_len > 0)
    throw UsageError("--prompt, --tokens and --prompt-len each give the prompt: use one");
  std::filesystem::path dir;
  const ModelConfig cfg = resolve_model(o.model, &dir, o.overrides);
  const std::optional<text::Tokenizer> tok = model_tokenizer(dir);
  if (!tok)
    throw UsageError("--prompt needs a model folder with a tokenizer.json; " +
                     (dir.empty() ? "'" + o.model + "' is a preset of synthetic weights"
                                  : dir.string() + " has none") +
                     " (give --tokens instead)");
  const std::vector<int32_t> ids = tok->encode(*o.prompt);
  if (ids.size() == tok->prefix().size() + tok->suffix().size())
    throw UsageError("--prompt: the text encodes to no tokens; give some text");
  for (const int32_t id : ids)
    if (id >= cfg.vocab)
      throw UsageError("--prompt: the tokenizer gives id " + std::to_string(id) + ", past the model's vocabulary of " +
                       std::to_string(cfg.vocab) + " (tokenizer.json and config.json do not match)");
  o.tokens = ids;
  if (o.window > 0) {  // text scored in windows: as many whole windows as it fills
    if (int64_t(ids.size()) < o.window)
      throw UsageError("--prompt encodes to " + std::to_string(ids.size()) + " tokens, fewer than one --window of " +
                       std::to_string(o.window));
    o.tokens.resize(size_t(int64_t(ids.size()) / o.window * o.window));
    if (o.tokens.size() < ids.size()) o.prompt = tok->decode(o.tokens, true);  // the text of what is scored
  }
  windows();
}

void describe_tokens(proto::Generation& g, const text::Tokenizer& tok) {
  const std::vector<int32_t> ids(g.tokens.begin(), g.tokens.end());
  g.text = tok.decode(ids);
  g.pieces.clear();
  for (const int32_t id : ids) g.pieces.push_back(tok.decode(std::span<const int32_t>(&id, 1)));
}

}  // namespace ss
