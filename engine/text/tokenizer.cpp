#include "text/tokenizer.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <queue>
#include <sstream>

#include "core/error.h"
#include "text/unicode.h"

namespace ss::text {

using json = nlohmann::json;

namespace {

// Ids past this are refused: a vocabulary is a few hundred thousand tokens,
// and the table by id must stay small whatever a file says.
constexpr int64_t kMaxId = int64_t(1) << 24;

// j[key], or null when j has no such member.
const json& member(const json& j, const char* key) {
  static const json null;
  const auto it = j.find(key);
  return it == j.end() ? null : *it;
}

int32_t token_id(const json& v, const std::string& origin, const std::string& field) {
  if (!v.is_number_integer()) field_error(origin, field, "must be an integer id");
  const int64_t id = v.get<int64_t>();
  if (id < 0 || id >= kMaxId) field_error(origin, field, "is " + std::to_string(id) + ", outside 0 .. 2^24");
  return int32_t(id);
}

// The tokens a TemplateProcessing puts before and after the sequence "A".
void template_tokens(const json& p, const std::string& origin, const std::string& field, std::vector<int32_t>& prefix,
                     std::vector<int32_t>& suffix) {
  const json& single = member(p, "single");
  if (!single.is_array()) field_error(origin, field + ".single", "must be a list");
  const json& specials = member(p, "special_tokens");
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string at = field + ".single[" + std::to_string(i) + "]";
    const json& item = single[i];
    if (item.is_object() && item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    if (!item.is_object() || !item.contains("SpecialToken") || !item["SpecialToken"].is_object() ||
        !item["SpecialToken"].contains("id") || !item["SpecialToken"]["id"].is_string())
      field_error(origin, at, "must be {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": ...}");
    const std::string name = item["SpecialToken"]["id"].get<std::string>();
    if (!specials.is_object() || !specials.contains(name) || !specials[name].is_object() ||
        !specials[name].contains("ids") || !specials[name]["ids"].is_array())
      field_error(origin, field + ".special_tokens", "has no ids for \"" + name + "\"");
    for (const json& id : specials[name]["ids"])
      (seen_sequence ? suffix : prefix).push_back(token_id(id, origin, field + ".special_tokens." + name + ".ids"));
  }
  if (!seen_sequence) field_error(origin, field + ".single", "has no {\"Sequence\": {\"id\": \"A\"}}");
}

void post_processor(const json& p, const std::string& origin, const std::string& field, std::vector<int32_t>& prefix,
                    std::vector<int32_t>& suffix) {
  if (p.is_null()) return;
  if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) field_error(origin, field + ".type", "is missing");
  const std::string type = p["type"].get<std::string>();
  if (type == "ByteLevel") return;  // offsets only
  if (type == "TemplateProcessing") return template_tokens(p, origin, field, prefix, suffix);
  if (type == "Sequence") {
    const json& list = member(p, "processors");
    if (!list.is_array()) field_error(origin, field + ".processors", "must be a list");
    for (size_t i = 0; i < list.size(); ++i)
      post_processor(list[i], origin, field + ".processors[" + std::to_string(i) + "]", prefix, suffix);
    return;
  }
  field_error(origin, field + ".type", "is \"" + type + "\"; only TemplateProcessing, ByteLevel and Sequence are read");
}

void check_decoder(const json& d, const std::string& origin) {
  if (d.is_null()) return;
  if (!d.is_object() || !d.contains("type") || !d["type"].is_string()) field_error(origin, "decoder.type", "is missing");
  const std::string type = d["type"].get<std::string>();
  if (type != "ByteLevel")
    field_error(origin, "decoder.type", "is \"" + type + "\"; only the ByteLevel decoder of byte-level BPE is read");
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(path + ": cannot be read");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    throw FormatError(path + ": not valid JSON (at byte " + std::to_string(e.byte) + ")");
  } catch (const json::exception& e) {  // e.g. a number past double's range
    throw FormatError(path + ": not JSON this reads (" + std::string(e.what()) + ")");
  }
  return from_json(j, path);
}

Tokenizer Tokenizer::from_json(const json& j, const std::string& origin) {
  if (!j.is_object()) throw FormatError(origin + ": not a tokenizer.json (its top level is not an object)");
  Tokenizer t;
  const json& model = member(j, "model");
  if (!model.is_object()) field_error(origin, "model", "is missing");
  const json& type = member(model, "type");
  if (!type.is_string()) field_error(origin, "model.type", "is missing");
  if (type != "BPE")
    field_error(origin, "model.type", "is \"" + type.get<std::string>() + "\"; only byte-level BPE tokenizers are read");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json& v = member(model, key);
    if (!v.is_null() && !(v.is_string() && v.get<std::string>().empty()))
      field_error(origin, std::string("model.") + key, "is set; byte-level BPE has none");
  }
  if (const json& v = member(model, "byte_fallback"); v.is_boolean() && v.get<bool>())
    field_error(origin, "model.byte_fallback", "is true; that is SentencePiece-style BPE, not byte-level");
  if (const json& v = member(model, "ignore_merges"); !v.is_null()) {
    if (!v.is_boolean()) field_error(origin, "model.ignore_merges", "must be true or false");
    t.ignore_merges_ = v.get<bool>();
  }

  t.pre_ = PreTokenizer::from_json(member(j, "normalizer"), member(j, "pre_tokenizer"),
                                   origin);
  t.decoder_ = member(j, "decoder");
  check_decoder(t.decoder_, origin);

  // The vocabulary, then the added tokens, into one table by id.
  const json& vocab = member(model, "vocab");
  if (!vocab.is_object()) field_error(origin, "model.vocab", vocab.is_null() ? "is missing" : "must be an object");
  const auto put = [&](int32_t id, const std::string& text, const std::string& field) {
    if (size_t(id) >= t.tokens_.size())
      t.tokens_.resize(size_t(id) + 1), t.added_.resize(size_t(id) + 1), t.in_vocab_.resize(size_t(id) + 1);
    if (!t.tokens_[size_t(id)].empty() && t.tokens_[size_t(id)] != text)
      field_error(origin, field, "gives id " + std::to_string(id) + " to a second token");
    t.tokens_[size_t(id)] = text;
  };
  for (const auto& [text, v] : vocab.items()) {
    if (text.empty()) field_error(origin, "model.vocab", "has an empty token");
    const int32_t id = token_id(v, origin, "model.vocab." + text);
    put(id, text, "model.vocab");
    t.in_vocab_[size_t(id)] = 1;
    t.ids_.emplace(text, id);
  }
  const auto& sym = byte_symbols();
  for (int b = 0; b < 256; ++b) {
    const auto it = t.ids_.find(sym[size_t(b)]);
    if (it == t.ids_.end()) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      field_error(origin, "model.vocab", std::string("lacks the byte-level token for byte ") + hex + " (\"" + sym[size_t(b)] +
                                      "\"); not a byte-level BPE vocabulary");
    }
    t.byte_id_[size_t(b)] = it->second;
  }

  const json& added = member(j, "added_tokens");
  if (!added.is_null() && !added.is_array()) field_error(origin, "added_tokens", "must be a list");
  if (added.is_array()) {
    for (size_t i = 0; i < added.size(); ++i) {
      const std::string at = "added_tokens[" + std::to_string(i) + "]";
      const json& a = added[i];
      if (!a.is_object() || !a.contains("content") || !a["content"].is_string() || a["content"].get<std::string>().empty())
        field_error(origin, at + ".content", "must be a non-empty string");
      const int32_t id = token_id(a.contains("id") ? a["id"] : json(), origin, at + ".id");
      const std::string content = a["content"].get<std::string>();
      const bool special = a.contains("special") && a["special"].is_boolean() && a["special"].get<bool>();
      // An added token is the vocabulary's own (same id, same spelling) or new to it on both counts.
      if (size_t(id) < t.tokens_.size() && !t.tokens_[size_t(id)].empty() && t.tokens_[size_t(id)] != content)
        field_error(origin, at + ".id", "is " + std::to_string(id) + ", which is \"" + t.tokens_[size_t(id)] + "\" already");
      if (const auto known = t.ids_.find(content); known != t.ids_.end() && known->second != id)
        field_error(origin, at + ".content", "\"" + content + "\" is id " + std::to_string(known->second) + " already");
      put(id, content, at + ".id");
      t.added_[size_t(id)] = special ? 2 : 1;
      t.ids_[content] = id;
      t.added_tokens_.push_back({id, content, special});
    }
  }
  for (size_t k = 0; k < t.added_tokens_.size(); ++k)
    t.added_by_first_byte_[uint8_t(t.added_tokens_[k].content[0])].push_back(int32_t(k));
  for (auto& list : t.added_by_first_byte_)
    std::stable_sort(list.begin(), list.end(), [&](int32_t a, int32_t b) {
      return t.added_tokens_[size_t(a)].content.size() > t.added_tokens_[size_t(b)].content.size();
    });

  // Merges, by rank: "left right" or [left, right], each pair and its union in the vocabulary.
  const json& merges = member(model, "merges");
  if (!merges.is_array()) field_error(origin, "model.merges", merges.is_null() ? "is missing" : "must be a list");
  t.merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string at = "model.merges[" + std::to_string(r) + "]";
    const json& m = merges[r];
    std::string left, right;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 == s.size() || s.find(' ', space + 1) != std::string::npos)
        field_error(origin, at, "must be two tokens separated by one space");
      left = s.substr(0, space), right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>(), right = m[1].get<std::string>();
    } else {
      field_error(origin, at, "must be \"left right\" or [\"left\", \"right\"]");
    }
    const auto l = t.ids_.find(left), rr = t.ids_.find(right), u = t.ids_.find(left + right);
    if (l == t.ids_.end() || rr == t.ids_.end())
      field_error(origin, at, "names \"" + (l == t.ids_.end() ? left : right) + "\", which is not in model.vocab");
    if (u == t.ids_.end()) field_error(origin, at, "makes \"" + left + right + "\", which is not in model.vocab");
    const uint64_t key = (uint64_t(uint32_t(l->second)) << 32) | uint32_t(rr->second);
    if (t.merge_of_.emplace(key, std::make_pair(int32_t(r), u->second)).second)
      t.merges_.emplace_back(l->second, rr->second);
  }

  t.post_processor_ = member(j, "post_processor");
  post_processor(t.post_processor_, origin, "post_processor", t.prefix_, t.suffix_);
  for (const auto* ids : {&t.prefix_, &t.suffix_})
    for (const int32_t id : *ids)
      if (size_t(id) >= t.tokens_.size() || t.tokens_[size_t(id)].empty())
        field_error(origin, "post_processor", "puts id " + std::to_string(id) + ", which has no token, around the text");
  return t;
}

nlohmann::ordered_json Tokenizer::to_json() const {
  using ojson = nlohmann::ordered_json;
  ojson added = ojson::array();
  for (const Added& a : added_tokens_)
    added.push_back({{"id", a.id}, {"content", a.content}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", a.special}});
  ojson vocab = ojson::object();
  for (size_t id = 0; id < tokens_.size(); ++id)
    if (in_vocab_[id]) vocab[tokens_[id]] = int32_t(id);
  ojson merges = ojson::array();
  for (const auto& [l, r] : merges_) merges.push_back(tokens_[size_t(l)] + " " + tokens_[size_t(r)]);
  ojson j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = added;
  j["normalizer"] = ojson::parse(pre_.normalizer_json().dump());
  j["pre_tokenizer"] = ojson::parse(pre_.pre_tokenizer_json().dump());
  j["post_processor"] = ojson::parse(post_processor_.dump());
  j["decoder"] = ojson::parse(decoder_.dump());
  j["model"] = {{"type", "BPE"},          {"dropout", nullptr},      {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
                {"byte_fallback", false}, {"ignore_merges", ignore_merges_}, {"vocab", vocab},
                {"merges", merges}};
  return j;
}

void Tokenizer::save(const std::string& path) const {
  const std::string tmp = path + ".partial";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << to_json().dump(1) << "\n";
    if (!out.flush()) throw UsageError(path + ": cannot be written");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throw UsageError(path + ": cannot be written");
  }
}

std::optional<int32_t> Tokenizer::id_of(std::string_view token) const {
  const auto it = ids_.find(std::string(token));
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  std::vector<int32_t> out;
  if (add_special) out = prefix_;
  // Added tokens first: the longest that starts at each position, the text between them through BPE.
  size_t seg = 0;
  for (size_t i = 0; i < text.size();) {
    const Added* hit = nullptr;
    for (const int32_t k : added_by_first_byte_[uint8_t(text[i])]) {
      const Added& a = added_tokens_[size_t(k)];
      if (text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    encode_segment(text.substr(seg, i - seg), out);
    out.push_back(hit->id);
    i += hit->content.size();
    seg = i;
  }
  encode_segment(text.substr(seg), out);
  if (add_special) out.insert(out.end(), suffix_.begin(), suffix_.end());
  return out;
}

void Tokenizer::encode_segment(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::vector<std::string> pieces;
  pre_.split(text, pieces);
  for (const std::string& p : pieces) encode_piece(p, out);
}

// Merges the piece's bytes, lowest rank first and leftmost among equals, as
// HF does: a list of symbols, and a heap of the pairs that could merge.
void Tokenizer::encode_piece(const std::string& bytes, std::vector<int32_t>& out) const {
  if (bytes.empty()) return;
  if (ignore_merges_) {
    if (const auto it = ids_.find(bytes_to_symbols(bytes)); it != ids_.end() && !added_[size_t(it->second)]) {
      out.push_back(it->second);
      return;
    }
  }
  const int n = int(bytes.size());
  const size_t len = bytes.size();
  std::vector<int32_t> id(len), prev(len), next(len);  // a symbol's token (-1: merged away) and its neighbours
  for (int k = 0; k < n; ++k) {
    id[size_t(k)] = byte_id_[uint8_t(bytes[size_t(k)])];
    prev[size_t(k)] = k - 1;
    next[size_t(k)] = k + 1 < n ? k + 1 : -1;
  }
  struct Candidate {
    int32_t rank, pos, left, right;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto offer = [&](int a) {
    const int b = next[size_t(a)];
    if (a < 0 || b < 0) return;
    const uint64_t key = (uint64_t(uint32_t(id[size_t(a)])) << 32) | uint32_t(id[size_t(b)]);
    if (const auto it = merge_of_.find(key); it != merge_of_.end())
      heap.push({it->second.first, a, id[size_t(a)], id[size_t(b)]});
  };
  for (int k = 0; k + 1 < n; ++k) offer(k);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int b = next[size_t(c.pos)];
    if (id[size_t(c.pos)] != c.left || b < 0 || id[size_t(b)] != c.right) continue;  // stale
    const uint64_t key = (uint64_t(uint32_t(c.left)) << 32) | uint32_t(c.right);
    id[size_t(c.pos)] = merge_of_.at(key).second;
    id[size_t(b)] = -1;  // gone
    next[size_t(c.pos)] = next[size_t(b)];
    if (next[size_t(b)] >= 0) prev[size_t(next[size_t(b)])] = c.pos;
    if (prev[size_t(c.pos)] >= 0) offer(prev[size_t(c.pos)]);
    offer(c.pos);
  }
  for (int k = 0; k >= 0; k = next[size_t(k)]) out.push_back(id[size_t(k)]);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (const int32_t id : ids) {
    if (id < 0 || size_t(id) >= tokens_.size() || tokens_[size_t(id)].empty()) {
      out += "\xEF\xBF\xBD";
      continue;
    }
    if (added_[size_t(id)]) {
      if (!(skip_special && added_[size_t(id)] == 2)) out += tokens_[size_t(id)];
      continue;
    }
    out += symbols_to_bytes(tokens_[size_t(id)]);
  }
  return out;
}

}  // namespace ss::text
