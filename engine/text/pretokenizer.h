// How a tokenizer.json cuts text into pieces before BPE merges them: its
// "normalizer" (none or NFC) and its "pre_tokenizer" (GPT-2's ByteLevel
// split, or a Sequence of regex Splits and a ByteLevel without its own
// split, as Llama 3 and Qwen2 folders carry). The regexes are the file's own,
// compiled with ICU, so \p{L}, \p{N} and (?!\S) mean what they mean there.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ss::text {

// Throws the FormatError a tokenizer.json field gets: "ORIGIN: field 'FIELD' WHY".
[[noreturn]] void field_error(const std::string& origin, const std::string& field, const std::string& why);

// GPT-2's split, the one a ByteLevel pre-tokenizer with use_regex applies.
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class PreTokenizer {
 public:
  // Reads the two fields of tokenizer.json; anything this cannot follow exactly
  // is refused with a FormatError naming `origin` and the field.
  static PreTokenizer from_json(const nlohmann::json& normalizer, const nlohmann::json& pre_tokenizer,
                                const std::string& origin);
  // ByteLevel with GPT-2's split and no prefix space: what the trainer writes.
  static PreTokenizer gpt2();

  // Appends the pieces of `text` to `pieces`. Their concatenation is the
  // normalized text; a byte that is not part of well-formed UTF-8 is a piece
  // of its own, so nothing is dropped or replaced.
  void split(std::string_view text, std::vector<std::string>& pieces) const;

  nlohmann::json normalizer_json() const;
  nlohmann::json pre_tokenizer_json() const;
  // Whether it puts spaces into the text (ByteLevel's add_prefix_space):
  // then decoding gives back more than was encoded.
  bool inserts_spaces() const;

  struct Step;  // a regex split or a prefix space

 private:
  std::vector<std::shared_ptr<const Step>> steps_;
  bool nfc_ = false;
  nlohmann::json normalizer_, pre_tokenizer_;
};

}  // namespace ss::text
