// tokenizer.json to a Tokenizer, then text through it: a file is read or
// refused with a FormatError naming the field; a file that reads encodes
// any bytes (the input itself), and what it decodes back encodes to the same
// again. The input's bytes also go through the built-in GPT-2 split and a
// fixed byte-level vocabulary, and must come back unchanged, so odd UTF-8
// reaches the encoder whatever JSON the input holds.
#include "fuzz_support.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace {

const ss::text::Tokenizer& bytes_only() {
  static const ss::text::Tokenizer t = [] {
    nlohmann::json vocab = nlohmann::json::object();
    // The 256 byte tokens and one merge, "Ġ t".
    for (int b = 0; b < 256; ++b) vocab[ss::text::bytes_to_symbols(std::string(1, char(b)))] = b;
    vocab[ss::text::bytes_to_symbols(" t")] = 256;
    const nlohmann::json j = {
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {ss::text::bytes_to_symbols(" ") + " t"}}}},
        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
        {"decoder", {{"type", "ByteLevel"}}},
        {"added_tokens", {{{"id", 257}, {"content", "<|endoftext|>"}, {"special", true}}}}};
    return ss::text::Tokenizer::from_json(j, "(fuzz)");
  }();
  return t;
}

void round_trip(const ss::text::Tokenizer& t, std::string_view text) {
  const std::vector<int32_t> ids = t.encode(text, false);
  if (t.decode(ids) != text) std::abort();  // lossless, special tokens included
}

// A file may normalize (NFC), so what comes back is the text as the
// tokenizer sees it: encoding that again changes nothing.
void stable(const ss::text::Tokenizer& t, std::string_view text) {
  const std::string once = t.decode(t.encode(text, false));
  if (t.decode(t.encode(once, false)) != once) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ss::fuzz::expect_clean("tokenizer", [&] { round_trip(bytes_only(), text); });
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  ss::fuzz::expect_clean("tokenizer", [&] {
    const ss::text::Tokenizer t = ss::text::Tokenizer::from_json(j, "tokenizer.json");
    (void)t.to_json();
    // A file that reads must encode arbitrary text, its own bytes here; what
    // it decodes encodes the same again, unless it puts spaces in.
    if (size < 4096) {
      if (t.inserts_spaces()) (void)t.decode(t.encode(text, false));
      else stable(t, text);
    }
  });
  return 0;
}
