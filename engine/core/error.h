// Errors the engine reports instead of crashing. Library code throws these;
// the command line turns them into one `error` event and a non-zero exit.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

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

}  // namespace ss
