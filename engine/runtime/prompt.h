// Text in and out of a run: --prompt encoded by the model folder's
// tokenizer.json, and ids decoded back for the `prompt` and `generation`
// records. A model without a tokenizer (a preset of synthetic weights) runs
// on ids only.
#pragma once

#include <filesystem>
#include <optional>

#include "runtime/run.h"
#include "text/tokenizer.h"

namespace ss {

// The tokenizer.json beside a model folder's config.json, or none. Throws
// the reader's FormatError for a file it cannot follow.
std::optional<text::Tokenizer> model_tokenizer(const std::filesystem::path& dir);
// The same where text is optional (the records' decoded text): a file it
// cannot follow (a SentencePiece-style Llama 2 folder, say) is left out, with
// one line on stderr saying why, and the run goes on with ids.
std::optional<text::Tokenizer> optional_tokenizer(const std::filesystem::path& dir);

// --prompt: sets o.tokens to the text's ids (with the tokenizer's BOS), or
// refuses with one line: a model without a tokenizer, --prompt given with
// --tokens or --prompt-len, text that encodes to no tokens, or ids past the
// model's vocabulary. With --window, sets the batch to the windows' count.
void encode_prompt(RunOptions& o);

// Sets a generation's text and each token's piece from its ids.
void describe_tokens(proto::Generation& g, const text::Tokenizer& tok);

}  // namespace ss
