#include "text/unicode.h"

namespace ss::text {
namespace {

// Bytes that stand for themselves: '!'..'~', '¡'..'¬', '®'..'ÿ'.
bool prints_as_itself(int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }

struct Alphabet {
  std::array<std::string, 256> symbol;
  std::array<int16_t, 0x100 + 68> byte_of;  // the 68 bytes that do not print as themselves follow U+00FF
  Alphabet() {
    byte_of.fill(-1);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const char32_t code = prints_as_itself(b) ? char32_t(b) : next++;
      append_utf8(symbol[b], code);
      byte_of[code] = int16_t(b);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet a;
  return a;
}

}  // namespace

const std::array<std::string, 256>& byte_symbols() { return alphabet().symbol; }

int symbol_byte(char32_t cp) {
  const auto& table = alphabet().byte_of;
  return cp < table.size() ? table[cp] : -1;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

int utf8_sequence(std::string_view s, size_t i, char32_t* cp) {
  const auto byte = [&](size_t k) { return k < s.size() ? uint8_t(s[k]) : uint8_t(0); };
  const uint8_t b0 = byte(i);
  if (i >= s.size()) return 0;
  if (b0 < 0x80) {
    if (cp) *cp = b0;
    return 1;
  }
  int n;
  char32_t v, min;
  if ((b0 & 0xE0) == 0xC0) n = 2, v = b0 & 0x1F, min = 0x80;
  else if ((b0 & 0xF0) == 0xE0) n = 3, v = b0 & 0x0F, min = 0x800;
  else if ((b0 & 0xF8) == 0xF0) n = 4, v = b0 & 0x07, min = 0x10000;
  else return 0;
  for (int k = 1; k < n; ++k) {
    const uint8_t c = byte(i + k);
    if (i + k >= s.size() || (c & 0xC0) != 0x80) return 0;
    v = (v << 6) | (c & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  if (cp) *cp = v;
  return n;
}

std::string symbols_to_bytes(std::string_view symbols) {
  std::string out;
  out.reserve(symbols.size());
  for (size_t i = 0; i < symbols.size();) {
    char32_t cp;
    const int n = utf8_sequence(symbols, i, &cp);
    if (n == 0) {  // not UTF-8: keep the byte
      out += symbols[i++];
      continue;
    }
    const int b = symbol_byte(cp);
    if (b >= 0) out += char(b);
    else out.append(symbols.substr(i, size_t(n)));
    i += size_t(n);
  }
  return out;
}

std::string bytes_to_symbols(std::string_view bytes) {
  const auto& sym = byte_symbols();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) out += sym[uint8_t(c)];
  return out;
}

}  // namespace ss::text
