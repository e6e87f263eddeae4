// Learns a byte-level BPE tokenizer from a corpus, as `tokenizer train` does:
// GPT-2's pre-tokenizer split, the 256 byte tokens, then the most frequent
// adjacent pair merged into a new token until the vocabulary is full.
#pragma once

#include <cstdint>
#include <functional>
#include <istream>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace ss::text {

struct BpeTrainOptions {
  int32_t vocab_size = 4096;   // special tokens + 256 bytes + merges
  int64_t min_frequency = 2;   // a pair seen fewer times is not merged
  // Special tokens take the first ids. The first is put before every encoded
  // text (a BOS; the one token that also separates the corpus's documents).
  std::vector<std::string> special_tokens = {"<|endoftext|>"};
};

// Reads the corpus line by line (each line's newline belongs to it). Ties
// between pairs of equal count go to the pair of smaller ids, so the result
// is the same on every machine.
Tokenizer train_bpe(std::istream& corpus, const BpeTrainOptions& options,
                    const std::function<void(int32_t merges_done, int32_t merges_wanted)>& progress = {});

}  // namespace ss::text
