// Where training sequences come from. Sequence n of a corpus is a pure
// function of n, so every strategy and every rank count sees the same global
// batch: step s, micro-batch k, sequence j of the step's B_global takes
// sequence ((s - 1) K + k) B_global + j.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ss {

class Corpus {
 public:
  virtual ~Corpus() = default;
  // `len` token ids (inputs are the first len - 1, targets the last len - 1).
  virtual std::vector<int32_t> sequence(int64_t index, int64_t len) const = 0;
  virtual std::string describe() const = 0;
};

// `--tokens`: the one sequence given, every time.
std::unique_ptr<Corpus> fixed_corpus(std::vector<int32_t> tokens);
// `--data synthetic`: a repetitive corpus a small model can learn. Eight
// phrases of 4 to 12 tokens (drawn from `seed` over the vocabulary) follow
// each other in an order drawn per sequence: inside a phrase the next token
// is certain, at a phrase boundary it is one of eight, so a model that has
// learnt the phrases approaches ln(8) / (mean phrase length) nats a token.
std::unique_ptr<Corpus> synthetic_corpus(uint64_t seed, int64_t vocab);
// `--data FILE`: the file's bytes as token ids (a byte-level vocabulary:
// needs vocab >= 256); sequence n starts at byte n·len modulo the file size.
std::unique_ptr<Corpus> file_corpus(const std::string& path, int64_t vocab);
// `--data FILE --tokenizer tokenizer.json`: UTF-8 text, documents separated
// by blank lines, encoded with a BOS before each; sequences are windows of
// the ids in a fixed shuffled order (see data.cpp).
std::unique_ptr<Corpus> text_corpus(const std::string& path, const std::string& tokenizer_path, int64_t vocab);

}  // namespace ss
