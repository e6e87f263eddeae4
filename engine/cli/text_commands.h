// The text subcommands: `tokenizer train|encode|decode`, `corpus` and `eval`.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <ostream>
#include <string>

#include "runtime/evaluate.h"
#include "text/bpe_train.h"

namespace ss {

struct TextCommands {
  CLI::App *train = nullptr, *encode = nullptr, *decode = nullptr, *corpus = nullptr, *eval = nullptr;
  EvalOptions eval_options;
  std::string eval_dtype = "fp32";
  text::BpeTrainOptions options;
  std::string corpus_file, out, tokenizer, text, ids, brown_dir, corpus_out;
  bool pieces = false;
};

void add_text_commands(CLI::App& app, TextCommands& t);

// Runs the one that was chosen; nullopt when none was.
std::optional<int> run_text_command(const TextCommands& t, std::ostream& out, std::ostream& log);

}  // namespace ss
