#include "runtime/evaluate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <nlohmann/json.hpp>

#include "core/allocator.h"
#include "core/error.h"
#include "core/trace.h"
#include "cpu/cpu_backend.h"
#include "cpu/kernels.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "runtime/prompt.h"
#include "text/corpus.h"

namespace ss {


EvalResult evaluate(const EvalOptions& o) {
  if (o.seq_len < 2) throw UsageError("--seq-len must be at least 2");
  if (o.max_tokens < 0) throw UsageError("--max-tokens must be >= 0");
  std::filesystem::path dir;
  ModelConfig cfg = resolve_model(o.model, &dir, {});
  if (dir.empty()) throw UsageError("--model " + o.model + " is a preset of synthetic weights; eval needs a model folder");
  const std::optional<text::Tokenizer> tok = model_tokenizer(dir);
  if (!tok) throw UsageError("--model " + dir.string() + " has no tokenizer.json to encode the text with");
  if (tok->vocab_size() > cfg.vocab)
    throw UsageError(dir.string() + ": tokenizer.json has " + std::to_string(tok->vocab_size()) +
                     " tokens, more than the model's vocabulary of " + std::to_string(cfg.vocab));
  cfg.dtype = cfg.kv_dtype = o.dtype;
  const std::vector<int32_t> ids = text::encode_documents(text::read_text(o.text, "--text"), *tok);
  if (ids.size() < 2) throw UsageError("--text " + o.text + " encodes to fewer than 2 tokens");

  EvalResult r;
  if (!o.unigram_from.empty()) {  // add-one smoothed counts of the fitting text
    const std::vector<int32_t> fit = text::encode_documents(text::read_text(o.unigram_from, "--unigram-from"), *tok);
    std::vector<double> count(size_t(cfg.vocab), 1.0);
    for (const int32_t id : fit) count[size_t(id)] += 1;
    const double total = std::accumulate(count.begin(), count.end(), 0.0);
    std::vector<double>& nll_of = count;  // -log p(token)
    for (auto& c : nll_of) c = -std::log(c / total);
    int64_t scored = 0;
    for (int64_t w = 0; w + 1 < int64_t(ids.size()); w += o.seq_len) {
      const int64_t n = std::min<int64_t>(o.seq_len, int64_t(ids.size()) - w);
      for (int64_t i = 1; i < n && (o.max_tokens == 0 || scored < o.max_tokens); ++i, ++scored)
        r.unigram_nll += nll_of[size_t(ids[size_t(w + i)])];
    }
    r.unigram_nll /= double(std::max<int64_t>(scored, 1));
    r.unigram_perplexity = std::exp(r.unigram_nll);
  }

  if (o.threads > 0) cpu::set_threads(o.threads);
  Allocator alloc;
  Recorder rec;
  rec.set_span_recording(false);
  rec.set_mem_sampling(false);
  CpuBackend be(alloc, rec);
  Model model(cfg, be);
  CheckpointSource src(dir, model.weights());
  model.load(src);
  double nll = 0;
  int64_t scored = 0, hits = 0;
  std::vector<float> logits;
  // Windows of seq_len tokens; position i of a window predicts token i + 1 of
  // it (the first token of each window is context only).
  for (int64_t w = 0; w + 1 < int64_t(ids.size()) && (o.max_tokens == 0 || scored < o.max_tokens); w += o.seq_len) {
    const int64_t n = std::min<int64_t>(o.seq_len, int64_t(ids.size()) - w);
    std::vector<int32_t> tokens(ids.begin() + w, ids.begin() + w + n), pos(static_cast<size_t>(n));
    std::iota(pos.begin(), pos.end(), 0);
    Cache cache = model.make_cache(n);
    const Tensor out = model.forward(tokens, pos, cache, true);
    logits.resize(size_t(out.numel()));
    be.download(out, logits.data());
    const int64_t V = cfg.vocab;
    for (int64_t i = 0; i + 1 < n && (o.max_tokens == 0 || scored < o.max_tokens); ++i, ++scored) {
      const float* row = logits.data() + i * V;
      const int32_t next = tokens[size_t(i + 1)];
      double mx = row[0];
      int64_t arg = 0;
      for (int64_t v = 1; v < V; ++v)
        if (row[v] > mx) mx = row[v], arg = v;
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
      nll += mx + std::log(sum) - row[next];
      hits += arg == next;
    }
  }
  r.positions = scored;
  r.nll = nll / double(std::max<int64_t>(scored, 1));
  r.perplexity = std::exp(r.nll);
  r.top1 = double(hits) / double(std::max<int64_t>(scored, 1));
  return r;
}

int eval_command(const EvalOptions& o, std::ostream& out) {
  const EvalResult r = evaluate(o);
  nlohmann::json j = {{"model", o.model},   {"text", o.text},           {"positions", r.positions},
                      {"nll", r.nll},       {"perplexity", r.perplexity}, {"top1", r.top1},
                      {"seq_len", o.seq_len}};
  if (!o.unigram_from.empty()) {
    j["unigram_nll"] = r.unigram_nll;
    j["unigram_perplexity"] = r.unigram_perplexity;
    j["unigram_from"] = o.unigram_from;
  }
  out << j.dump() << "\n";
  return 0;
}

}  // namespace ss
