#include "text/pretokenizer.h"

#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/unistr.h>

#include "core/error.h"
#include "text/unicode.h"

namespace ss::text {

using json = nlohmann::json;

struct PreTokenizer::Step {
  std::unique_ptr<icu::RegexPattern> pattern;  // split into matches and the text between them
  std::string where;                           // the file and field it came from, for errors
  bool prefix_space = false;                   // or: put a space before a piece that lacks one
};

void field_error(const std::string& origin, const std::string& field, const std::string& why) {
  throw FormatError(origin + ": field '" + field + "' " + why);
}

namespace {

std::string type_of(const json& j, const std::string& origin, const std::string& field) {
  if (!j.is_object()) field_error(origin, field, "must be an object");
  const auto t = j.find("type");
  if (t == j.end() || !t->is_string()) field_error(origin, field + ".type", "is missing");
  return t->get<std::string>();
}

bool flag(const json& j, const char* key, bool def, const std::string& origin, const std::string& field) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_boolean()) field_error(origin, field + "." + key, "must be true or false");
  return it->get<bool>();
}

std::shared_ptr<PreTokenizer::Step> regex_step(const std::string& pattern, bool literal, const std::string& origin,
                                               const std::string& field) {
  UErrorCode status = U_ZERO_ERROR;
  UParseError where{};
  auto step = std::make_shared<PreTokenizer::Step>();
  step->pattern.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(pattern),
                                                 literal ? UREGEX_LITERAL : 0, where, status));
  if (U_FAILURE(status) || !step->pattern)
    field_error(origin, field, "is a regex that does not compile (" + std::string(u_errorName(status)) + " at offset " +
                            std::to_string(where.offset) + ")");
  step->where = origin + ": field '" + field + "'";
  return step;
}

// The ByteLevel pre-tokenizer: an optional prefix space, then GPT-2's split
// unless use_regex is false.
void byte_level(const json& j, const std::string& origin, const std::string& field,
                std::vector<std::shared_ptr<const PreTokenizer::Step>>& steps) {
  if (flag(j, "add_prefix_space", false, origin, field)) {
    auto s = std::make_shared<PreTokenizer::Step>();
    s->prefix_space = true;
    steps.push_back(s);
  }
  if (flag(j, "use_regex", true, origin, field)) steps.push_back(regex_step(kGpt2Pattern, false, origin, field));
}

void split_step(const json& j, const std::string& origin, const std::string& field,
                std::vector<std::shared_ptr<const PreTokenizer::Step>>& steps) {
  const auto behavior = j.find("behavior");
  if (behavior == j.end() || !behavior->is_string() || *behavior != "Isolated")
    field_error(origin, field + ".behavior", "must be \"Isolated\" (the only Split behavior read)");
  if (flag(j, "invert", false, origin, field)) field_error(origin, field + ".invert", "is true; inverted splits are not read");
  const auto p = j.find("pattern");
  if (p == j.end() || !p->is_object()) field_error(origin, field + ".pattern", "must be {\"Regex\": ...} or {\"String\": ...}");
  if (const auto r = p->find("Regex"); r != p->end() && r->is_string())
    steps.push_back(regex_step(r->get<std::string>(), false, origin, field + ".pattern.Regex"));
  else if (const auto s = p->find("String"); s != p->end() && s->is_string())
    steps.push_back(regex_step(s->get<std::string>(), true, origin, field + ".pattern.String"));
  else
    field_error(origin, field + ".pattern", "must be {\"Regex\": ...} or {\"String\": ...}");
}

void pre_step(const json& j, const std::string& origin, const std::string& field,
              std::vector<std::shared_ptr<const PreTokenizer::Step>>& steps) {
  const std::string type = type_of(j, origin, field);
  if (type == "ByteLevel") {
    byte_level(j, origin, field, steps);
  } else if (type == "Split") {
    split_step(j, origin, field, steps);
  } else if (type == "Sequence") {
    const auto list = j.find("pretokenizers");
    if (list == j.end() || !list->is_array()) field_error(origin, field + ".pretokenizers", "must be a list");
    for (size_t i = 0; i < list->size(); ++i)
      pre_step((*list)[i], origin, field + ".pretokenizers[" + std::to_string(i) + "]", steps);
  } else {
    field_error(origin, field + ".type", "is \"" + type + "\"; only ByteLevel, Split and Sequence pre-tokenizers are read");
  }
}

// Where each UTF-16 unit of `u` starts in the UTF-8 it came from.
std::vector<int32_t> utf8_offsets(const icu::UnicodeString& u) {
  std::vector<int32_t> at(size_t(u.length()) + 1);
  int32_t byte = 0;
  for (int32_t k = 0; k < u.length();) {
    const UChar32 cp = u.char32At(k);
    const int32_t units = U16_LENGTH(cp);
    for (int32_t q = 0; q < units; ++q) at[size_t(k + q)] = byte;
    byte += cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    k += units;
  }
  at[size_t(u.length())] = byte;
  return at;
}

// Splits well-formed UTF-8 into the pattern's matches and the text between
// them. A file's regex that backtracks without end, or past ICU's stack, is
// the file's fault: a FormatError naming it (the limit is in ICU's match
// steps, on the order of seconds).
void regex_split(const PreTokenizer::Step& step, const std::string& text, std::vector<std::string>& out) {
  const icu::UnicodeString u = icu::UnicodeString::fromUTF8(text);
  const std::vector<int32_t> at = utf8_offsets(u);
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexMatcher> m(step.pattern->matcher(u, status));
  if (U_SUCCESS(status)) m->setTimeLimit(10000, status);
  const auto failed = [&] {
    throw FormatError(step.where + " is a regex ICU cannot match on this text (" + u_errorName(status) + ")");
  };
  if (U_FAILURE(status)) failed();
  int32_t done = 0;
  while (m->find(status) && U_SUCCESS(status)) {
    const int32_t s = m->start(status), e = m->end(status);
    if (e == s) continue;  // an empty match splits nothing
    if (s > done) out.push_back(text.substr(size_t(at[size_t(done)]), size_t(at[size_t(s)] - at[size_t(done)])));
    out.push_back(text.substr(size_t(at[size_t(s)]), size_t(at[size_t(e)] - at[size_t(s)])));
    done = e;
  }
  if (U_FAILURE(status)) failed();
  if (done < u.length()) out.push_back(text.substr(size_t(at[size_t(done)])));
}

std::string nfc(const std::string& text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status)) throw std::runtime_error("tokenizer: ICU NFC: " + std::string(u_errorName(status)));
  const icu::UnicodeString out = n->normalize(icu::UnicodeString::fromUTF8(text), status);
  if (U_FAILURE(status)) throw std::runtime_error("tokenizer: ICU NFC: " + std::string(u_errorName(status)));
  std::string s;
  return out.toUTF8String(s);
}

}  // namespace

PreTokenizer PreTokenizer::from_json(const json& normalizer, const json& pre, const std::string& origin) {
  PreTokenizer p;
  p.normalizer_ = normalizer;
  p.pre_tokenizer_ = pre;
  if (!normalizer.is_null()) {
    const std::string type = type_of(normalizer, origin, "normalizer");
    const auto list = normalizer.find("normalizers");
    const bool empty_sequence = type == "Sequence" && list != normalizer.end() && list->is_array() && list->empty();
    if (type == "NFC") p.nfc_ = true;
    else if (!empty_sequence)
      field_error(origin, "normalizer.type", "is \"" + type + "\"; only NFC (or none) is read");
  }
  if (pre.is_null()) field_error(origin, "pre_tokenizer", "is missing; only byte-level BPE tokenizers are read");
  pre_step(pre, origin, "pre_tokenizer", p.steps_);
  return p;
}

PreTokenizer PreTokenizer::gpt2() {
  const json pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  return from_json(nullptr, pre, "(built in)");
}

json PreTokenizer::normalizer_json() const { return normalizer_; }
bool PreTokenizer::inserts_spaces() const {
  for (const auto& s : steps_)
    if (s->prefix_space) return true;
  return false;
}
json PreTokenizer::pre_tokenizer_json() const { return pre_tokenizer_; }

void PreTokenizer::split(std::string_view text, std::vector<std::string>& pieces) const {
  // Well-formed runs go through the normalizer and the steps; every byte
  // outside them is a piece of its own.
  std::vector<std::string> cur, next;
  for (size_t i = 0; i < text.size();) {
    size_t j = i;
    while (j < text.size()) {
      const int n = utf8_sequence(text, j);
      if (n == 0) break;
      j += size_t(n);
    }
    if (j > i) {
      cur.assign(1, nfc_ ? nfc(std::string(text.substr(i, j - i))) : std::string(text.substr(i, j - i)));
      for (const auto& step : steps_) {
        next.clear();
        for (auto& piece : cur) {
          if (step->pattern) {
            regex_split(*step, piece, next);
          } else {
            // As HF does, to every piece so far; a run that follows a stray
            // byte is not the start of the text, so it gets none.
            const bool starts = i == 0 || &step != &steps_.front();
            if (starts && !piece.empty() && piece[0] != ' ') piece.insert(piece.begin(), ' ');
            next.push_back(std::move(piece));
          }
        }
        cur.swap(next);
      }
      for (auto& piece : cur) pieces.push_back(std::move(piece));
      i = j;
    } else {
      pieces.emplace_back(1, text[i++]);
    }
  }
}

}  // namespace ss::text
