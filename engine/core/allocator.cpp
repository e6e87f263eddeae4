#include "core/allocator.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>

#include "core/error.h"

namespace ss {

void Allocator::charge(Category cat, int64_t bytes, std::string_view label) {
  if (m_capacity > 0 && m_state.total + bytes > m_capacity) {
    std::string msg = "out of memory: " + std::string(label) + " needs " + format_bytes(bytes) +
                      " of " + std::string(category_name(cat)) + " with " +
                      format_bytes(m_state.total) + " of " + format_bytes(m_capacity) +
                      " in use; this allocation alone needs a device of more than " +
                      format_bytes(m_state.total + bytes) +
                      " (--capacity; `scale` shows what the whole run needs), or shard over more devices";
    throw OomError(msg, std::string(category_name(cat)), bytes, m_state.total, m_capacity);
  }
  auto& b = m_state.bytes[int(cat)];
  b += bytes;
  m_state.total += bytes;
  if (b > m_state.peak_bytes[int(cat)]) m_state.peak_bytes[int(cat)] = b;
  if (m_state.total > m_state.peak_total) {
    m_state.peak_total = m_state.total;
    m_state.at_peak = m_state.bytes;
  }
  if (m_listener) m_listener(m_state);
}

void Allocator::release(Category cat, int64_t bytes) {
  m_state.bytes[int(cat)] -= bytes;
  m_state.total -= bytes;
  if (m_listener) m_listener(m_state);
}

int64_t parse_bytes(std::string_view text) {
  std::string s(text);
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(s, &pos);
  } catch (...) {
    throw UsageError("cannot read '" + s + "' as a size; write e.g. 2GiB, 512MiB or 1000000");
  }
  std::string unit;
  for (size_t i = pos; i < s.size(); ++i)
    if (!std::isspace(static_cast<unsigned char>(s[i]))) unit += char(std::tolower(s[i]));
  double mult = 1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kib") mult = 1024.0;
  else if (unit == "m" || unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib") mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb") mult = 1e3;
  else if (unit == "mb") mult = 1e6;
  else if (unit == "gb") mult = 1e9;
  else if (unit == "tb") mult = 1e12;
  else throw UsageError("unknown size unit '" + unit + "' in '" + s + "'; use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB");
  if (!(value >= 0) || !std::isfinite(value * mult))
    throw UsageError("size '" + s + "' must be a non-negative number");
  return int64_t(std::llround(value * mult));
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (std::fabs(v) >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace ss
