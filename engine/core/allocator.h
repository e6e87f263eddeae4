// Per-device memory accounting. Every buffer of every backend is charged here
// under one category; the allocator keeps the running total and the peak and
// refuses (OomError) a request that would exceed the device's capacity. The
// sim backend charges the same requests without allocating data, which is why
// simulated and measured memory agree byte for byte.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string_view>

#include "core/dtype.h"

namespace ss {

struct MemState {
  std::array<int64_t, kCategoryCount> bytes{};       // in use now, per category
  std::array<int64_t, kCategoryCount> peak_bytes{};  // highest seen, per category
  int64_t total = 0;
  int64_t peak_total = 0;  // highest simultaneous total
  std::array<int64_t, kCategoryCount> at_peak{};     // per category, when the total was highest
};

class Allocator {
 public:
  // capacity <= 0 means unlimited.
  explicit Allocator(int64_t capacity = 0) : m_capacity(capacity) {}

  // Charges `bytes` under `cat`; throws OomError (naming label and category)
  // when the device would go over capacity. Nothing is charged on failure.
  void charge(Category cat, int64_t bytes, std::string_view label);
  void release(Category cat, int64_t bytes);

  const MemState& state() const { return m_state; }
  int64_t capacity() const { return m_capacity; }
  void set_capacity(int64_t c) { m_capacity = c; }

  // Called after every change, e.g. to record a memory sample.
  void set_listener(std::function<void(const MemState&)> fn) { m_listener = std::move(fn); }

 private:
  int64_t m_capacity;
  MemState m_state;
  std::function<void(const MemState&)> m_listener;
};

// Parses "2GiB", "512MiB", "1.5GB", "1000000" into bytes; throws UsageError.
int64_t parse_bytes(std::string_view text);
std::string format_bytes(int64_t bytes);

}  // namespace ss
