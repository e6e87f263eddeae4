// `eval`: how well a model folder predicts a text. The text is encoded by the
// folder's tokenizer (documents separated by blank lines, each after a BOS)
// and cut into windows of --seq-len tokens; each window is one teacher-forced
// forward on one device, and every position but a window's first is scored
// by the log-probability the model gives the token that follows. Beside it,
// the same positions scored by a unigram model of the same tokenizer, fitted
// to --unigram-from (add-one smoothing): the bar a model that learnt nothing
// about context would reach.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace ss {

struct EvalOptions {
  std::string model;                 // a model folder with config.json, weights and tokenizer.json
  std::string text;                  // the text to score
  std::string unigram_from;          // text to fit the unigram baseline to (empty: none)
  int64_t seq_len = 256;
  int64_t max_tokens = 0;            // score at most this many positions (0: all)
  DType dtype = DType::F32;
  int threads = 0;
};

struct EvalResult {
  int64_t positions = 0;             // tokens scored
  double nll = 0;                    // mean negative log-likelihood, nats
  double perplexity = 0;             // exp(nll)
  double top1 = 0;                   // share of positions whose argmax is the next token
  double unigram_nll = 0, unigram_perplexity = 0;  // 0 without --unigram-from
};

EvalResult evaluate(const EvalOptions& o);
int eval_command(const EvalOptions& o, std::ostream& out);

}  // namespace ss
