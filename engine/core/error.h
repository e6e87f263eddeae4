// Errors the engine reports instead of crashing. Library code throws these;
// the command line turns them into one `error` event and a non-zero exit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ss {

// A request the user can fix: bad shapes, bad flags, a malformed file.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A file that cannot be read as what it claims to be (names the file and tensor).
class FormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An allocation that would take a device over its capacity.
class OomError : public std::runtime_error {
 public:
  OomError(const std::string& what, std::string category, int64_t requested, int64_t in_use,
           int64_t capacity)
      : std::runtime_error(what),
        category(std::move(category)),
        requested(requested),
        in_use(in_use),
        capacity(capacity) {}
  std::string category;
  int64_t requested, in_use, capacity;
};

// Exit codes shared by every subcommand (documented in engine/README.md).
enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,   // an internal failure or a dead rank
  kExitUsage = 2,     // bad input: refused before anything ran
  kExitOom = 3,       // a device ran out of its capacity
};

// For "did you mean": the candidate nearest `word` in edit distance
// (Levenshtein), where it is near enough to be a slip of it (at most two
// edits, or a quarter of its length); "" where none is.
template <class Names>
std::string nearest_name(const std::string& word, const Names& candidates) {
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diag = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        const size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
        diag = up;
      }
    }
    return row[b.size()];
  };
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 4) + 1;
  for (const auto& c : candidates)
    if (const size_t d = distance(word, std::string(c)); d < best_d) best_d = d, best = c;
  return best;
}

}  // namespace ss
