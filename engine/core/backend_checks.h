// Shape checks and byte counts shared by the Backend's methods (backend.cpp,
// backend_train.cpp). Internal to core/.
#pragma once

#include <cstdint>
#include <span>
#include <vector>
#include <stdexcept>
#include <string>

#include "core/attention_run.h"
#include "core/tensor.h"

namespace ss::detail {

inline void require(bool ok, const char* op, const std::string& what) {
  if (!ok) throw std::logic_error(std::string(op) + ": " + what);
}
inline void require_2d(const Tensor& t, const char* op, const char* name) {
  require(t.defined() && t.ndim() == 2 && t.stride(1) == 1, op,
          std::string(name) + " must be a 2-D tensor with unit column stride");
}
inline double fbytes(const Tensor& t) { return t.defined() ? double(t.nbytes()) : 0.0; }

[[noreturn]] inline void no_kernel(const char* op) {
  throw std::logic_error(std::string("kernel ") + op + " is not available on this backend");
}

// Causally visible (query, key) pairs: keys at positions <= the query's,
// for any order of either list. Positions come in a few runs of consecutive
// values (a chunk, zigzag's two chunks, a gathered sequence), so the count is
// taken run against run in closed form; a list of many short runs falls back
// to sorting the keys. Exact: the same integer either way.
double visible_pairs(std::span<const int32_t> q_pos, std::span<const int32_t> k_pos);

// An attention call's query runs (core/attention_run.h). Empty past
// `limit` runs.
std::vector<AttentionRun> attention_runs(std::span<const int32_t> q_pos, std::span<const int32_t> k_pos,
                                         size_t limit = 64);

}  // namespace ss::detail
