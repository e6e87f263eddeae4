// Comma-separated token ids on the command line (--tokens, --ids).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"

namespace ss {

inline std::vector<int32_t> parse_token_ids(const std::string& s, const std::string& flag) {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    const std::string tok = s.substr(i, j - i);
    try {
      size_t used = 0;
      const long long v = std::stoll(tok, &used);
      if (used != tok.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(tok);
      out.push_back(int32_t(v));
    } catch (...) {
      throw UsageError(flag + ": '" + tok + "' is not a token id; write e.g. " + flag + " 1,2,3");
    }
    i = j + 1;
  }
  return out;
}

}  // namespace ss
