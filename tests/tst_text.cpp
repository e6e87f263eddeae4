// The tokenizer and the corpus (engine/text/): byte-level BPE read from
// tokenizer.json files in the layouts GPT-2, Llama 3 and Qwen2 folders use,
// merges worked out by hand, a trainer checked against a naive one that
// recounts every pair at every step, round trips of arbitrary bytes, and the
// one-line refusals of files it cannot follow.
#include <QtTest>

#include <algorithm>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "text/bpe_train.h"
#include "text/corpus.h"
#include "text/pretokenizer.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

using json = nlohmann::json;
using ss::text::Tokenizer;

namespace {

const std::string kFixtures = std::string(SHARDSCOPE_TESTS_DIR) + "/fixtures/tokenizers/";

// Llama 3's split, as its tokenizer.json spells it; Qwen2's differs in \p{N}.
const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::vector<std::string> pieces(const ss::text::PreTokenizer& p, const std::string& text) {
  std::vector<std::string> out;
  p.split(text, out);
  return out;
}

json read_json(const std::string& path) { return json::parse(std::ifstream(path)); }

// A few thousand words of English-like text from a fixed seed: words of
// skewed frequency, punctuation, digits and line breaks.
std::string sample_text(int words, uint32_t seed) {
  static const char* const vocab[] = {"the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as",
                                      "was", "with", "be", "by", "on", "not", "he", "this", "are", "or", "his",
                                      "from", "at", "which", "but", "have", "an", "had", "they", "you", "were",
                                      "lower", "lowest", "newer", "newest", "wider", "widest", "tokenizer", "merge"};
  std::mt19937 rng(seed);
  std::string s;
  for (int i = 0; i < words; ++i) {
    const int n = int(sizeof vocab / sizeof *vocab);
    const int k = std::min(n - 1, int(std::exponential_distribution<double>(0.15)(rng)));
    if (i && rng() % 12 == 0) s += rng() % 2 ? ", " : ". ";
    else if (i) s += ' ';
    std::string w = vocab[k];
    if (rng() % 20 == 0) w[0] = char(std::toupper(w[0]));
    s += w;
    if (rng() % 40 == 0) s += " " + std::to_string(rng() % 20000);
    if (rng() % 30 == 0) s += "\n";
  }
  return s + "\n";
}

// The reference trainer: at every step, count every adjacent pair of every
// piece from scratch and merge the most frequent (ties: smaller ids).
std::vector<std::string> naive_merges(const std::string& corpus, int vocab_size, int specials) {
  const auto pre = ss::text::PreTokenizer::gpt2();
  std::map<std::string, int64_t> words;
  std::istringstream in(corpus);
  std::string line;
  while (std::getline(in, line)) {
    if (!in.eof()) line += '\n';
    for (auto& p : pieces(pre, line)) ++words[p];
  }
  std::vector<std::pair<std::vector<int>, int64_t>> seqs;
  for (const auto& [w, c] : words) {
    std::vector<int> ids;
    for (const char ch : w) ids.push_back(specials + uint8_t(ch));
    seqs.push_back({ids, c});
  }
  std::vector<std::string> spelling(static_cast<size_t>(specials));
  for (int b = 0; b < 256; ++b) spelling.push_back(ss::text::byte_symbols()[size_t(b)]);
  std::vector<std::string> merges;
  while (int(spelling.size()) < vocab_size) {
    std::map<std::pair<int, int>, int64_t> count;
    for (const auto& [ids, c] : seqs)
      for (size_t k = 0; k + 1 < ids.size(); ++k) count[{ids[k], ids[k + 1]}] += c;
    std::pair<int, int> best{-1, -1};
    int64_t best_count = 0;
    for (const auto& [p, c] : count)  // map order: smaller ids first, so ties keep the first
      if (c > best_count) best = p, best_count = c;
    if (best_count < 2) break;
    const std::string joined = spelling[size_t(best.first)] + spelling[size_t(best.second)];
    int m = int(std::find(spelling.begin(), spelling.end(), joined) - spelling.begin());
    if (m == int(spelling.size())) spelling.push_back(joined);
    merges.push_back(spelling[size_t(best.first)] + " " + spelling[size_t(best.second)]);
    for (auto& [ids, c] : seqs) {
      std::vector<int> out;
      for (size_t k = 0; k < ids.size(); ++k) {
        if (k + 1 < ids.size() && ids[k] == best.first && ids[k + 1] == best.second) out.push_back(m), ++k;
        else out.push_back(ids[k]);
      }
      ids = out;
    }
  }
  return merges;
}

Tokenizer train(const std::string& corpus, int vocab_size) {
  std::istringstream in(corpus);
  ss::text::BpeTrainOptions o;
  o.vocab_size = vocab_size;
  return ss::text::train_bpe(in, o);
}

// What a FormatError says when `j` is read.
QString refusal(const json& j) {
  try {
    Tokenizer::from_json(j, "dir/tokenizer.json");
  } catch (const ss::FormatError& e) {
    return QString::fromStdString(e.what());
  }
  return {};
}

}  // namespace

class TestText : public QObject {
  Q_OBJECT

 private slots:
  void byteAlphabet() {
    const auto& sym = ss::text::byte_symbols();
    std::vector<std::string> all(sym.begin(), sym.end());
    std::sort(all.begin(), all.end());
    QVERIFY(std::adjacent_find(all.begin(), all.end()) == all.end());  // 256 distinct symbols
    QCOMPARE(sym[' '], std::string("\xC4\xA0"));   // U+0120, "Ġ"
    QCOMPARE(sym['\n'], std::string("\xC4\x8A"));  // U+010A, "Ċ"
    QCOMPARE(sym['A'], std::string("A"));
    QCOMPARE(sym[0xAD], std::string("\xC5\x83"));  // the soft hyphen does not print: U+0143
    for (int b = 0; b < 256; ++b) {
      char32_t cp = 0;
      QCOMPARE(ss::text::utf8_sequence(sym[size_t(b)], 0, &cp), int(sym[size_t(b)].size()));
      QCOMPARE(ss::text::symbol_byte(cp), b);
    }
    QCOMPARE(ss::text::bytes_to_symbols(" the"), std::string("\xC4\xA0the"));
    QCOMPARE(ss::text::symbols_to_bytes("\xC4\xA0the\xC4\x8A"), std::string(" the\n"));
  }

  void utf8WellFormed() {
    QCOMPARE(ss::text::utf8_sequence("\xE2\x82\xAC", 0), 3);        // €
    QCOMPARE(ss::text::utf8_sequence("\xF0\x9F\x98\x80", 0), 4);    // an emoji
    QCOMPARE(ss::text::utf8_sequence("\xC0\xAF", 0), 0);            // overlong '/'
    QCOMPARE(ss::text::utf8_sequence("\xED\xA0\x80", 0), 0);        // a surrogate
    QCOMPARE(ss::text::utf8_sequence("\xF4\x90\x80\x80", 0), 0);    // past U+10FFFF
    QCOMPARE(ss::text::utf8_sequence("\xE2\x82", 0), 0);            // cut short
    QCOMPARE(ss::text::utf8_sequence("\x80", 0), 0);                // a lone continuation
  }

  // GPT-2's split, worked through by hand: a run of spaces gives all but its
  // last to the whitespace rule, which leaves that one to the next word.
  void gpt2Split() {
    const auto pre = ss::text::PreTokenizer::gpt2();
    const std::vector<std::string> want = {"Hello", " world", "'s", " 123", " ", " test", "\n", " caf\xC3\xA9", "!!"};
    QCOMPARE(pieces(pre, "Hello world's 123  test\n caf\xC3\xA9!!"), want);
    // A stray byte is a piece of its own; the text on either side splits as usual.
    const std::vector<std::string> stray = {"ab", "\xFF", " cd"};
    QCOMPARE(pieces(pre, "ab\xFF cd"), stray);
  }

  void llama3AndQwen2Splits() {
    const json split3 = {{"type", "Sequence"},
                         {"pretokenizers",
                          {{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Pattern}}}, {"behavior", "Isolated"},
                            {"invert", false}},
                           {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                            {"use_regex", false}}}}};
    const auto llama = ss::text::PreTokenizer::from_json(nullptr, split3, "t.json");
    // (?i:...) takes "'LL" as a contraction; digits go three at a time.
    const std::vector<std::string> want3 = {"I", "'m", " ", "123", "45", " ok", "\n\n", "WE", "'LL"};
    QCOMPARE(pieces(llama, "I'm 12345 ok\n\nWE'LL"), want3);
    json split2 = split3;
    split2["pretokenizers"][0]["pattern"]["Regex"] = kQwen2Pattern;
    const auto qwen = ss::text::PreTokenizer::from_json({{"type", "NFC"}}, split2, "t.json");
    const std::vector<std::string> want2 = {"1", "2", "3", " caf\xC3\xA9"};
    // NFC composes e + U+0301 into U+00E9 before the split.
    QCOMPARE(pieces(qwen, "123 cafe\xCC\x81"), want2);
  }

  // The fixture's seven merges, applied by hand (tests/fixtures/tokenizers/README.md).
  void fixtureHandMerges() {
    const Tokenizer t = Tokenizer::load(kFixtures + "gpt2-mini.json");
    QCOMPARE(t.vocab_size(), 264);
    QCOMPARE(t.merge_count(), int64_t(7));
    QVERIFY(t.prefix().empty());
    const std::vector<int32_t> the = {258};  // Ġ t -> Ġt, h e -> he, Ġt he -> Ġthe
    QCOMPARE(t.encode(" the"), the);
    const std::vector<int32_t> hello = {257, 'l', 260};  // h e (rank 1) before e l (rank 3): he l lo
    QCOMPARE(t.encode("hello"), hello);
    const std::vector<int32_t> mixed = {'t', 257, 263, 256, 'o', '.'};  // the added token splits the text
    QCOMPARE(t.encode("the<|endoftext|> to."), mixed);
    QCOMPARE(t.decode(mixed), std::string("the<|endoftext|> to."));
    QCOMPARE(t.decode(mixed, true), std::string("the to."));
    const std::vector<int32_t> unknown = {'a', 9999};
    QCOMPARE(t.decode(unknown), std::string("a\xEF\xBF\xBD"));
  }

  // The worked example of BPE: five words, where ties go to the pair of smaller ids.
  void trainerHandMerges() {
    const Tokenizer t = train("low low low low low lower lower newest newest newest newest newest newest "
                              "widest widest widest\n", 262);
    const json j = json::parse(t.to_json().dump());
    const std::vector<std::string> want = {"e s", "es t", "l o", "lo w", "\xC4\xA0 n"};
    QCOMPARE(j["model"]["merges"].get<std::vector<std::string>>(), want);
    QCOMPARE(j["added_tokens"][0]["content"].get<std::string>(), std::string("<|endoftext|>"));
    const std::vector<int32_t> bos = {0};
    QCOMPARE(t.prefix(), bos);
  }

  void trainerEqualsNaive() {
    const std::string corpus = sample_text(3000, 7);
    const Tokenizer t = train(corpus, 600);
    const json j = json::parse(t.to_json().dump());
    const auto got = j["model"]["merges"].get<std::vector<std::string>>();
    const auto want = naive_merges(corpus, 600, 1);
    QVERIFY(got.size() > 100);
    QCOMPARE(got, want);
  }

  // What the trainer writes reads back as the same tokenizer.
  void savedFileReadsBack() {
    const Tokenizer t = train(sample_text(2000, 3), 500);
    QTemporaryDir dir;
    const std::string path = dir.filePath("tokenizer.json").toStdString();
    t.save(path);
    const Tokenizer u = Tokenizer::load(path);
    const std::string text = sample_text(300, 11);
    QCOMPARE(u.encode(text), t.encode(text));
    QCOMPARE(u.vocab_size(), t.vocab_size());
    QVERIFY(!QFile::exists(QString::fromStdString(path + ".partial")));
  }

  // Any bytes at all come back as they went in: invalid UTF-8, control
  // characters, NUL, emoji, combining marks, long runs of one byte.
  void roundTripAnyBytes() {
    const Tokenizer trained = train(sample_text(3000, 5), 800);
    const Tokenizer fixture = Tokenizer::load(kFixtures + "gpt2-mini.json");
    std::mt19937 rng(1);
    std::vector<std::string> texts = {"", " ", "\n\n\n", std::string(5000, ' '), std::string("\0\x01\x7F", 3),
                                      "\xFF\xFE\xC0\xAF\xED\xA0\x80", "e\xCC\x81 \xF0\x9F\x98\x80 \xE2\x82\xAC" "12,345.",
                                      std::string(3000, 'a')};
    for (int i = 0; i < 200; ++i) {
      std::string s;
      const int n = int(rng() % 64);
      for (int k = 0; k < n; ++k) {
        const uint32_t r = rng() % 4;
        if (r == 0) s += char(rng() % 256);
        else if (r == 1) s += " the";
        else if (r == 2) s += "\xC3\xA9";
        else s += char('a' + rng() % 26);
      }
      texts.push_back(s);
    }
    for (const std::string& s : texts) {
      for (const Tokenizer* t : {&trained, &fixture}) {
        const auto ids = t->encode(s);
        QCOMPARE(t->decode(ids, true), s);
        QCOMPARE(t->decode(t->encode(s, false)), s);
      }
    }
    QCOMPARE(trained.encode("").size(), size_t(1));  // only the BOS
  }

  // A file in Llama 3's layout (fixtures/tokenizers/llama3-mini.json): a
  // Split + ByteLevel sequence, merges as pairs, ignore_merges, and a BOS
  // from a TemplateProcessing inside a Sequence.
  void llama3Layout() {
    json j = read_json(kFixtures + "llama3-mini.json");
    QCOMPARE(j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"].get<std::string>(), std::string(kLlama3Pattern));
    const Tokenizer t = Tokenizer::from_json(j, "llama3/tokenizer.json");
    QCOMPARE(t.vocab_size(), 302);
    // Llama's split: "xyz", " xyzq", " the". The first is in the vocabulary
    // whole, though no merge makes it; the second has no merges and stays
    // bytes; the merges make the third 258.
    QCOMPARE(t.encode("xyz xyzq the"), std::vector<int32_t>({300, 270, ' ', 'x', 'y', 'z', 'q', 258}));
    j["model"]["ignore_merges"] = false;
    const Tokenizer u = Tokenizer::from_json(j, "llama3/tokenizer.json");
    QCOMPARE(u.encode("xyz", false), std::vector<int32_t>({'x', 'y', 'z'}));
    QCOMPARE(t.decode(t.encode("xyz xyzq the"), true), std::string("xyz xyzq the"));
  }

  // Each refusal names the file and the field, on one line.
  void refusesWhatItCannotRead_data() {
    QTest::addColumn<QString>("edit");
    QTest::addColumn<QString>("says");
    QTest::newRow("unigram") << "model.type=Unigram" << "field 'model.type' is \"Unigram\"; only byte-level BPE";
    QTest::newRow("no merges") << "model.merges=" << "field 'model.merges' is missing";
    QTest::newRow("no vocab") << "model.vocab=" << "field 'model.vocab' is missing";
    QTest::newRow("no model") << "model=" << "field 'model' is missing";
    QTest::newRow("bad merge") << "model.merges[0]=Ġt" << "field 'model.merges[0]' must be two tokens";
    QTest::newRow("unknown merge") << "model.merges[0]=q z" << "makes \"qz\", which is not in model.vocab";
    QTest::newRow("metaspace") << "pre_tokenizer.type=Metaspace" << "field 'pre_tokenizer.type' is \"Metaspace\"";
    QTest::newRow("wordpiece decoder") << "decoder.type=WordPiece" << "field 'decoder.type' is \"WordPiece\"";
    QTest::newRow("lowercase") << "normalizer.type=Lowercase" << "field 'normalizer.type' is \"Lowercase\"";
    QTest::newRow("byte fallback") << "model.byte_fallback=true" << "field 'model.byte_fallback' is true";
    QTest::newRow("added token on a byte's id") << "added_tokens[0].id=65" << "field 'added_tokens[0].id' is 65";
    QTest::newRow("added token spelled as a vocab token")
        << "added_tokens[0].content=he" << "field 'added_tokens[0].content' \"he\" is id 257 already";
    QTest::newRow("a regex that does not compile") << "pre_tokenizer.split=(" << "is a regex that does not compile";
  }
  void refusesWhatItCannotRead() {
    QFETCH(QString, edit);
    QFETCH(QString, says);
    json j = read_json(kFixtures + "gpt2-mini.json");
    const QString path = edit.section('=', 0, 0), value = edit.section('=', 1);
    if (path == "model.type") j["model"]["type"] = value.toStdString();
    else if (path == "model.merges") j["model"].erase("merges");
    else if (path == "model.vocab") j["model"].erase("vocab");
    else if (path == "model") j.erase("model");
    else if (path == "model.merges[0]") j["model"]["merges"][0] = value.toStdString();
    else if (path == "pre_tokenizer.type") j["pre_tokenizer"] = {{"type", value.toStdString()}};
    else if (path == "decoder.type") j["decoder"] = {{"type", value.toStdString()}};
    else if (path == "normalizer.type") j["normalizer"] = {{"type", value.toStdString()}};
    else if (path == "model.byte_fallback") j["model"]["byte_fallback"] = true;
    else if (path == "added_tokens[0].id") j["added_tokens"][0]["id"] = value.toInt();
    else if (path == "added_tokens[0].content") j["added_tokens"][0]["content"] = value.toStdString();
    else if (path == "pre_tokenizer.split")
      j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", value.toStdString()}}}, {"behavior", "Isolated"}};
    const QString msg = refusal(j);
    QVERIFY2(msg.startsWith("dir/tokenizer.json: "), qPrintable(msg));
    QVERIFY2(msg.contains(says), qPrintable(msg));
    QVERIFY(!msg.contains('\n'));
  }

  void refusesMalformedFiles() {
    QTemporaryDir dir;
    const std::string path = dir.filePath("tokenizer.json").toStdString();
    std::ofstream(path) << "{\"model\": {\"type\": \"BPE\", ";
    try {
      Tokenizer::load(path);
      QFAIL("a truncated file was read");
    } catch (const ss::FormatError& e) {
      QVERIFY2(QString(e.what()).startsWith(QString::fromStdString(path + ": not valid JSON")), e.what());
    }
    // A vocabulary without every byte is not byte-level.
    json j = read_json(kFixtures + "gpt2-mini.json");
    j["model"]["vocab"].erase("A");
    QVERIFY(refusal(j).contains("lacks the byte-level token for byte 0x41"));
  }

  void trainerRefusesBadSpecialTokens() {
    for (const std::vector<std::string>& specials :
         {std::vector<std::string>{"<s>", "<s>"}, {"!"}, {"\xFF"}, {""}}) {
      ss::text::BpeTrainOptions o;
      o.vocab_size = 300;
      o.special_tokens = specials;
      std::istringstream in("some text\n");
      QVERIFY_THROWS_EXCEPTION(ss::UsageError, ss::text::train_bpe(in, o));
    }
  }

  void brownPlainText() {
    const std::string tagged =
        "\n\n\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' ,/, and/cc 1/2/cd of/in it/pps ./.\n\n"
        "\n\n\tHe/pps asked/vbd (/( twice/rb )/) ;/. `/` fine/jj '/' ?/.\n";
    QCOMPARE(ss::text::brown_plain_text(tagged),
             std::string("The jury said \"no evidence\", and 1/2 of it.\nHe asked (twice); 'fine'?\n"));
    const std::vector<std::string> cm = {"cm01", "cm02", "cm03", "cm04", "cm05", "cm06"};
    QVERIFY(ss::text::brown_held_out("cm06", cm));
    QVERIFY(!ss::text::brown_held_out("cm05", cm));
    const std::vector<std::string> ca(44, "ca");
    QVERIFY(ss::text::brown_held_out("ca20", ca));
    QVERIFY(!ss::text::brown_held_out("ca21", ca));
  }
};

QTEST_GUILESS_MAIN(TestText)
#include "tst_text.moc"
