// Byte-level BPE, read from and written as a Hugging Face tokenizer.json, so
// that the tokenizer of a downloaded Llama 3 or Qwen2 folder works unchanged
// and the one `tokenizer train` writes loads in `transformers` too.
//
// What is read: model.type "BPE" with its vocab and merges (either the
// "a b" string form or the [a, b] pair form), ignore_merges, the added
// tokens (matched in the text before anything else), a normalizer of none or
// NFC, the pre-tokenizers of pretokenizer.h, a ByteLevel decoder, and a
// TemplateProcessing post-processor for the tokens put before and after a
// sequence (BOS). Anything else is refused, naming the file and the field.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/pretokenizer.h"

namespace ss::text {

class Tokenizer {
 public:
  static Tokenizer load(const std::string& path);
  static Tokenizer from_json(const nlohmann::json& j, const std::string& origin);
  nlohmann::ordered_json to_json() const;
  void save(const std::string& path) const;  // written beside, then renamed over

  // Token ids of `text`; with add_special, the post-processor's tokens around it.
  std::vector<int32_t> encode(std::string_view text, bool add_special = true) const;
  // The bytes the tokens stand for. An id the tokenizer has no token for is U+FFFD.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  int32_t vocab_size() const { return int32_t(tokens_.size()); }  // largest id + 1
  std::optional<int32_t> id_of(std::string_view token) const;     // by its vocab spelling
  const std::string& token(int32_t id) const { return tokens_.at(size_t(id)); }
  const std::vector<int32_t>& prefix() const { return prefix_; }  // e.g. BOS
  const std::vector<int32_t>& suffix() const { return suffix_; }
  int64_t merge_count() const { return int64_t(merges_.size()); }
  bool inserts_spaces() const { return pre_.inserts_spaces(); }

 private:
  struct Added {
    int32_t id;
    std::string content;
    bool special;
  };
  void encode_segment(std::string_view text, std::vector<int32_t>& out) const;
  void encode_piece(const std::string& bytes, std::vector<int32_t>& out) const;

  PreTokenizer pre_;
  std::vector<std::string> tokens_;  // by id: a vocab spelling, an added token's content, or "" for a gap
  std::vector<uint8_t> added_;       // by id: 1 added, 2 added and special
  std::vector<uint8_t> in_vocab_;    // by id: 1 where model.vocab has it
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<std::pair<int32_t, int32_t>> merges_;  // by rank
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merge_of_;  // (left, right) -> (rank, merged)
  std::array<int32_t, 256> byte_id_{};
  std::vector<Added> added_tokens_;
  std::array<std::vector<int32_t>, 256> added_by_first_byte_;  // indices into added_tokens_, longest first
  std::vector<int32_t> prefix_, suffix_;
  bool ignore_merges_ = false;
  nlohmann::json post_processor_, decoder_;
};

}  // namespace ss::text
