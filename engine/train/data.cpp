#include "train/data.h"

#include <fstream>
#include <iterator>
#include <numeric>

#include "core/error.h"
#include "core/hash.h"
#include "text/corpus.h"
#include "text/tokenizer.h"

namespace ss {
namespace {

class Fixed final : public Corpus {
 public:
  explicit Fixed(std::vector<int32_t> t) : m_tokens(std::move(t)) {}
  std::vector<int32_t> sequence(int64_t, int64_t len) const override {
    return std::vector<int32_t>(m_tokens.begin(), m_tokens.begin() + std::min<int64_t>(len, int64_t(m_tokens.size())));
  }
  std::string describe() const override { return "tokens (" + std::to_string(m_tokens.size()) + ")"; }

 private:
  std::vector<int32_t> m_tokens;
};

class Synthetic final : public Corpus {
 public:
  Synthetic(uint64_t seed, int64_t vocab) : m_seed(seed) {
    uint64_t x = splitmix64(seed ^ 0x5eed);
    for (int p = 0; p < kPhrases; ++p) {
      x = splitmix64(x);
      const int len = 4 + int(x % 9);
      std::vector<int32_t> phrase;
      for (int i = 0; i < len; ++i) phrase.push_back(int32_t((x = splitmix64(x)) % uint64_t(vocab)));
      m_phrases.push_back(std::move(phrase));
    }
  }
  std::vector<int32_t> sequence(int64_t index, int64_t len) const override {
    std::vector<int32_t> out;
    uint64_t x = splitmix64(m_seed * 0x100000001b3ull + uint64_t(index));
    // Start inside a phrase, then whole phrases in a drawn order.
    const auto& first = m_phrases[size_t((x = splitmix64(x)) % kPhrases)];
    for (size_t i = size_t((x = splitmix64(x)) % first.size()); i < first.size(); ++i) out.push_back(first[i]);
    while (int64_t(out.size()) < len) {
      const auto& p = m_phrases[size_t((x = splitmix64(x)) % kPhrases)];
      out.insert(out.end(), p.begin(), p.end());
    }
    out.resize(size_t(len));
    return out;
  }
  std::string describe() const override { return "synthetic phrases (seed " + std::to_string(m_seed) + ")"; }

 private:
  static constexpr int kPhrases = 8;
  uint64_t m_seed;
  std::vector<std::vector<int32_t>> m_phrases;
};

class Bytes final : public Corpus {
 public:
  Bytes(std::string path, std::vector<uint8_t> data) : m_path(std::move(path)), m_data(std::move(data)) {}
  std::vector<int32_t> sequence(int64_t index, int64_t len) const override {
    std::vector<int32_t> out(static_cast<size_t>(len));
    const uint64_t n = m_data.size(), start = uint64_t(index) * uint64_t(len) % n;
    for (int64_t i = 0; i < len; ++i) out[size_t(i)] = m_data[size_t((start + uint64_t(i)) % n)];
    return out;
  }
  std::string describe() const override { return m_path + " (" + std::to_string(m_data.size()) + " bytes)"; }

 private:
  std::string m_path;
  std::vector<uint8_t> m_data;
};

// Token ids of a text, read in windows of the sequence length taken in a
// fixed shuffled order (the corpus's documents come grouped by genre; in
// file order the last steps would see one genre only). Each pass over the
// windows shifts their boundaries, so later epochs see other contexts.
class Text final : public Corpus {
 public:
  Text(std::string describe, std::vector<int32_t> ids) : m_describe(std::move(describe)), m_ids(std::move(ids)) {}
  std::vector<int32_t> sequence(int64_t index, int64_t len) const override {
    const uint64_t n = m_ids.size(), L = uint64_t(len);
    const uint64_t windows = std::max<uint64_t>(1, n / L);
    const uint64_t epoch = uint64_t(index) / windows, w = uint64_t(index) % windows;
    // w -> (a w + b) mod windows is a bijection when a is coprime to windows.
    uint64_t a = 0x9E3779B97F4A7C15ull % windows;
    while (windows > 1 && std::gcd(a, windows) != 1) ++a;
    const uint64_t slot = windows > 1 ? (a * w + epoch * 7919) % windows : 0;
    const uint64_t start = (slot * L + epoch * 997) % n;
    std::vector<int32_t> out(static_cast<size_t>(len));
    for (uint64_t i = 0; i < L; ++i) out[size_t(i)] = m_ids[size_t((start + i) % n)];
    return out;
  }
  std::string describe() const override { return m_describe; }

 private:
  std::string m_describe;
  std::vector<int32_t> m_ids;
};

}  // namespace

std::unique_ptr<Corpus> text_corpus(const std::string& path, const std::string& tokenizer_path, int64_t vocab) {
  const text::Tokenizer tok = text::Tokenizer::load(tokenizer_path);
  if (tok.vocab_size() > vocab)
    throw UsageError("--tokenizer " + tokenizer_path + " has " + std::to_string(tok.vocab_size()) +
                     " tokens, more than the model's vocabulary of " + std::to_string(vocab) +
                     "; set vocab_size to at least that");
  int64_t documents = 0;
  std::vector<int32_t> ids = text::encode_documents(text::read_text(path, "--data"), tok, &documents);
  if (ids.size() < 2) throw UsageError("--data " + path + " encodes to fewer than 2 tokens");
  return std::make_unique<Text>(path + " (" + std::to_string(documents) + " documents, " + std::to_string(ids.size()) +
                                    " tokens of " + tokenizer_path + ")",
                                std::move(ids));
}

std::unique_ptr<Corpus> fixed_corpus(std::vector<int32_t> tokens) { return std::make_unique<Fixed>(std::move(tokens)); }

std::unique_ptr<Corpus> synthetic_corpus(uint64_t seed, int64_t vocab) {
  return std::make_unique<Synthetic>(seed, vocab);
}

std::unique_ptr<Corpus> file_corpus(const std::string& path, int64_t vocab) {
  if (vocab < 256)
    throw UsageError("--data " + path + " reads bytes as tokens, which needs a vocabulary of at least 256; this model's is " +
                     std::to_string(vocab));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("--data " + path + ": cannot open the file");
  std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (data.size() < 2) throw UsageError("--data " + path + " holds fewer than 2 bytes");
  return std::make_unique<Bytes>(path, std::move(data));
}

}  // namespace ss
