// What the fuzz targets share: a scratch folder of this process for the
// files a target must write (the readers under test open paths), and the
// rule for exceptions. A reader may refuse its input with one of the
// engine's own errors (UsageError, FormatError, OomError) -- that is the
// clear message a user gets. Anything else escaping it (a std::out_of_range,
// a json type_error, std::bad_alloc) would reach the user as an "internal"
// error, so the target aborts and libFuzzer keeps the input.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace ss::fuzz {

inline const std::filesystem::path& scratch_dir() {
  // Never destroyed, so the exit handler that removes the folder can still name it.
  static const std::filesystem::path* dir = [] {
    auto* d = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                        ("shardscope-fuzz-" + std::to_string(getpid())));
    std::filesystem::create_directories(*d);
    return d;
  }();
  static const bool cleanup = std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(*dir, ec);
  }) == 0;
  (void)cleanup;
  return *dir;
}

inline void write_file(const std::filesystem::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

// Runs `body`; the engine's own errors are a clean refusal, anything else aborts.
template <class F>
void expect_clean(const char* what, F&& body) {
  try {
    body();
  } catch (const UsageError&) {
  } catch (const FormatError&) {
  } catch (const OomError&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: an exception that is not the engine's own error escaped: %s\n", what, e.what());
    std::abort();
  }
}

// Splits the input at '\n' into fields (the last one may be empty).
inline std::vector<std::string> fields(const uint8_t* data, size_t size) {
  std::vector<std::string> out(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') out.emplace_back();
    else out.back().push_back(char(data[i]));
  }
  return out;
}

}  // namespace ss::fuzz
