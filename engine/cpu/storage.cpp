// Scratch rows and fp32 views of tensors stored in bf16 or f16 (kernels.h).
#include "cpu/kernels.h"

namespace ss::cpu {

float* scratch(int slot, int64_t n) {
  thread_local std::vector<float> rows[8];
  auto& v = rows[slot];
  if (int64_t(v.size()) < n) v.resize(size_t(n));
  return v.data();
}

namespace {
int64_t rows_of(const Tensor& t) {
  return t.ndim() == 1 ? 1 : t.rows();
}
int64_t cols_of(const Tensor& t) {
  return t.ndim() == 1 ? t.numel() : t.cols();
}
int64_t ld_of(const Tensor& t) {
  return t.ndim() == 1 ? t.numel() : t.ld();
}
}  // namespace

F32Rows::F32Rows(const Tensor& t) {
  if (!t.defined()) return;
  if (t.ndim() > 2 && !t.is_contiguous())
    throw std::logic_error("F32Rows takes 2-D or contiguous tensors");
  const Tensor v = t.ndim() > 2 ? t.reshape({t.numel()}) : t;
  if (v.dtype() == DType::F32) {
    p = v.data<float>();
    ld = ld_of(v);
    return;
  }
  const int64_t R = rows_of(v), C = cols_of(v);
  own.resize(size_t(R * C));
  for (int64_t r = 0; r < R; ++r)
    widen(v.ndim() == 1 ? v.raw() : v.row_ptr(r), v.dtype(), C, own.data() + r * C);
  p = own.data();
  ld = C;
}

F32Out::F32Out(const Tensor& tensor, bool read)
    : t(tensor.ndim() > 2 ? tensor.reshape({tensor.numel()}) : tensor) {
  if (!t.defined()) return;  // an optional output that is not asked for
  if (t.dtype() == DType::F32) {
    p = t.data<float>();
    ld = ld_of(t);
    return;
  }
  const int64_t R = rows_of(t), C = cols_of(t);
  own.assign(size_t(R * C), 0.0f);
  if (read)
    for (int64_t r = 0; r < R; ++r)
      widen(t.ndim() == 1 ? t.raw() : t.row_ptr(r), t.dtype(), C, own.data() + r * C);
  p = own.data();
  ld = C;
}

void F32Out::commit() {
  if (!t.defined() || t.dtype() == DType::F32) return;
  const int64_t R = rows_of(t), C = cols_of(t);
  for (int64_t r = 0; r < R; ++r)
    narrow(own.data() + r * C, C, t.dtype(), t.ndim() == 1 ? t.raw() : t.row_ptr(r));
}

}  // namespace ss::cpu
