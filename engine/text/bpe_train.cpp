#include "text/bpe_train.h"

#include <algorithm>
#include <queue>
#include <unordered_map>

#include "core/error.h"
#include "text/unicode.h"

namespace ss::text {

namespace {

using Pair = uint64_t;  // (left id << 32) | right id
Pair pair_of(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

struct Word {
  std::vector<int32_t> ids;
  int64_t count = 0;
};

// The corpus's distinct pre-tokenizer pieces with their counts, as byte ids.
std::vector<Word> count_words(std::istream& corpus, int32_t first_byte_id) {
  const PreTokenizer pre = PreTokenizer::gpt2();
  std::unordered_map<std::string, int64_t> counts;
  std::vector<std::string> pieces;
  std::string line;
  while (std::getline(corpus, line)) {
    if (!corpus.eof()) line += '\n';
    pieces.clear();
    pre.split(line, pieces);
    for (auto& p : pieces) ++counts[std::move(p)];
  }
  std::vector<std::pair<std::string, int64_t>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end());  // the same order on every machine
  std::vector<Word> words;
  words.reserve(sorted.size());
  for (const auto& [text, count] : sorted) {
    Word w;
    w.count = count;
    for (const char c : text) w.ids.push_back(first_byte_id + uint8_t(c));
    words.push_back(std::move(w));
  }
  return words;
}

}  // namespace

Tokenizer train_bpe(std::istream& corpus, const BpeTrainOptions& o,
                    const std::function<void(int32_t, int32_t)>& progress) {
  const int32_t specials = int32_t(o.special_tokens.size());
  const int32_t base = specials + 256;
  if (o.vocab_size < base)
    throw UsageError("--vocab-size must be at least " + std::to_string(base) + " (the special tokens and 256 bytes)");
  if (o.vocab_size > (1 << 20)) throw UsageError("--vocab-size must be at most 1048576");
  for (size_t i = 0; i < o.special_tokens.size(); ++i) {
    const std::string& s = o.special_tokens[i];
    if (s.empty()) throw UsageError("a special token must not be empty");
    for (size_t at = 0; at < s.size();) {
      const int n = utf8_sequence(s, at);
      if (n == 0) throw UsageError("special token '" + s + "' is not UTF-8");
      at += size_t(n);
    }
    if (std::find(o.special_tokens.begin(), o.special_tokens.begin() + long(i), s) != o.special_tokens.begin() + long(i))
      throw UsageError("special token '" + s + "' is given twice");
    if (std::find(byte_symbols().begin(), byte_symbols().end(), s) != byte_symbols().end())
      throw UsageError("special token '" + s + "' is a byte's own token; give a longer one, e.g. <|" + s + "|>");
  }

  std::vector<Word> words = count_words(corpus, specials);
  std::vector<std::string> spelling;  // by id, as byte symbols
  for (const auto& s : o.special_tokens) spelling.push_back(s);
  for (int b = 0; b < 256; ++b) spelling.push_back(byte_symbols()[size_t(b)]);

  std::unordered_map<Pair, int64_t> count;
  std::unordered_map<Pair, std::vector<int32_t>> where;  // words that held the pair (may repeat or be stale)
  for (int32_t w = 0; w < int32_t(words.size()); ++w) {
    const auto& ids = words[size_t(w)].ids;
    for (size_t k = 0; k + 1 < ids.size(); ++k) {
      const Pair p = pair_of(ids[k], ids[k + 1]);
      count[p] += words[size_t(w)].count;
      where[p].push_back(w);
    }
  }
  // The best pair: highest count, then smallest ids. Entries go stale as
  // counts change; a popped entry counts only if it still matches.
  using Entry = std::pair<int64_t, Pair>;
  const auto worse = [](const Entry& a, const Entry& b) { return a.first != b.first ? a.first < b.first : a.second > b.second; };
  std::priority_queue<Entry, std::vector<Entry>, decltype(worse)> heap(worse);
  for (const auto& [p, c] : count) heap.push({c, p});

  std::vector<std::pair<int32_t, int32_t>> merges;
  std::unordered_map<std::string, int32_t> id_of;  // two merges may spell one token ("ab"+"c", "a"+"bc")
  for (int32_t id = 0; id < int32_t(spelling.size()); ++id) id_of.emplace(spelling[size_t(id)], id);
  const int32_t wanted = o.vocab_size - base;
  std::vector<int32_t> last_seen(words.size(), -1);
  std::unordered_map<Pair, int64_t> delta;
  while (int32_t(spelling.size()) < o.vocab_size && !heap.empty()) {
    const auto [c, p] = heap.top();
    heap.pop();
    const auto it = count.find(p);
    if (it == count.end() || it->second != c) continue;  // stale
    if (c < o.min_frequency) break;
    const int32_t a = int32_t(p >> 32), b = int32_t(p & 0xFFFFFFFFu);
    const std::string joined = spelling[size_t(a)] + spelling[size_t(b)];
    const auto [known, fresh] = id_of.emplace(joined, int32_t(spelling.size()));
    if (known->second < specials) {  // the corpus spells a special token: never merge into it
      count.erase(p);
      continue;
    }
    const int32_t m = known->second;
    if (fresh) spelling.push_back(joined);
    merges.emplace_back(a, b);
    delta.clear();
    const int32_t stamp = int32_t(merges.size());
    for (const int32_t w : where[p]) {
      if (last_seen[size_t(w)] == stamp) continue;
      last_seen[size_t(w)] = stamp;
      Word& word = words[size_t(w)];
      auto& ids = word.ids;
      bool has = false;
      for (size_t k = 0; k + 1 < ids.size(); ++k) has |= ids[k] == a && ids[k + 1] == b;
      if (!has) continue;
      for (size_t k = 0; k + 1 < ids.size(); ++k) delta[pair_of(ids[k], ids[k + 1])] -= word.count;
      std::vector<int32_t> merged;
      merged.reserve(ids.size());
      for (size_t k = 0; k < ids.size(); ++k) {
        if (k + 1 < ids.size() && ids[k] == a && ids[k + 1] == b) merged.push_back(m), ++k;
        else merged.push_back(ids[k]);
      }
      ids.swap(merged);
      for (size_t k = 0; k + 1 < ids.size(); ++k) {
        const Pair q = pair_of(ids[k], ids[k + 1]);
        delta[q] += word.count;
        if (ids[k] == m || ids[k + 1] == m) where[q].push_back(w);
      }
    }
    where.erase(p);
    for (const auto& [q, d] : delta) {
      if (d == 0) continue;
      int64_t& n = count[q];
      n += d;
      if (n <= 0) count.erase(q);
      else heap.push({n, q});
    }
    const int32_t done = int32_t(spelling.size()) - base;
    if (progress && fresh && (done % 256 == 0 || done == wanted)) progress(done, wanted);
  }

  // Written as tokenizer.json, then read back, so what is returned is what a file holds.
  nlohmann::json added = nlohmann::json::array();
  for (int32_t i = 0; i < specials; ++i)
    added.push_back({{"id", i}, {"content", o.special_tokens[size_t(i)]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  nlohmann::json vocab = nlohmann::json::object();
  for (int32_t id = 0; id < int32_t(spelling.size()); ++id) vocab[spelling[size_t(id)]] = id;
  nlohmann::json merge_list = nlohmann::json::array();
  for (const auto& [l, r] : merges) merge_list.push_back(spelling[size_t(l)] + " " + spelling[size_t(r)]);
  nlohmann::json post = nullptr;
  if (specials > 0) {
    const std::string& bos = o.special_tokens[0];
    post = {{"type", "TemplateProcessing"},
            {"single", {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
            {"pair",
             {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
              {{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
              {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
            {"special_tokens", {{bos, {{"id", bos}, {"ids", {0}}, {"tokens", {bos}}}}}}};
  }
  const nlohmann::json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", PreTokenizer::gpt2().pre_tokenizer_json()},
      {"post_processor", post},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", vocab}, {"merges", merge_list}}}};
  return Tokenizer::from_json(j, "(trained)");
}

}  // namespace ss::text
