// Shape checks and byte counts shared by the Backend's methods (backend.cpp,
// backend_train.cpp). Internal to core/.
#pragma once

#include <stdexcept>
#include <string>

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

}  // namespace ss::detail
