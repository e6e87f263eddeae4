// UTF-8 and the byte-level alphabet that GPT-2-style BPE tokenizers share.
//
// A byte-level tokenizer works on bytes, but its vocabulary is written as
// text: each of the 256 bytes stands for one printable code point (the
// printable Latin-1 bytes for themselves, every other byte for U+0100 + n in
// byte order), so "Ġthe" is the token for the bytes " the". These helpers map
// between the two and find where text is (and is not) valid UTF-8, so that
// any byte string, invalid sequences included, encodes and decodes back.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace ss::text {

// The UTF-8 of the code point that stands for byte b.
const std::array<std::string, 256>& byte_symbols();

// The byte a code point stands for, or -1 when it stands for none.
int symbol_byte(char32_t cp);

// The bytes a byte-level symbol string stands for: "Ġthe" -> " the". Code
// points that stand for no byte are copied through as UTF-8.
std::string symbols_to_bytes(std::string_view symbols);

// The symbol string of a byte string: " the" -> "Ġthe".
std::string bytes_to_symbols(std::string_view bytes);

void append_utf8(std::string& out, char32_t cp);

// The length (1-4) of the well-formed UTF-8 sequence starting at s[i], or 0
// when the bytes there are not one (overlong forms, surrogates and code
// points past U+10FFFF are not well formed). Writes its code point to *cp.
int utf8_sequence(std::string_view s, size_t i, char32_t* cp = nullptr);

}  // namespace ss::text
