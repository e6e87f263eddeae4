#include "runtime/prompt.h"

#include <algorithm>

#include "core/error.h"

namespace ss {

std::optional<text::Tokenizer> model_tokenizer(const std::filesystem::path& dir) {
  if (dir.empty()) return std::nullopt;
  const std::filesystem::path file = dir / "tokenizer.json";
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return std::nullopt;
  return text::Tokenizer::load(file.string());
}

void encode_prompt(RunOptions& o) {
  if (o.window > 0 && !o.tokens.empty() && o.batch == 1) o.batch = int(int64_t(o.tokens.size()) / std::max<int64_t>(o.window, 1));
  if (!o.prompt) return;
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
  if (o.window > 0 && o.batch == 1) o.batch = int(int64_t(ids.size()) / o.window);
}

void describe_tokens(proto::Generation& g, const text::Tokenizer& tok) {
  const std::vector<int32_t> ids(g.tokens.begin(), g.tokens.end());
  g.text = tok.decode(ids);
  g.pieces.clear();
  for (const int32_t id : ids) g.pieces.push_back(tok.decode(std::span<const int32_t>(&id, 1)));
}

}  // namespace ss
