#include "core/tensor.h"

#include "core/error.h"

namespace ss {

Buffer::Buffer(Allocator& alloc, Category cat, int64_t bytes, std::string label, void* data,
               FreeFn free_fn)
    : m_alloc(alloc), m_cat(cat), m_bytes(bytes), m_label(std::move(label)), m_data(data),
      m_free(free_fn) {}

Buffer::~Buffer() {
  if (m_data && m_free) m_free(m_data);
  m_alloc.release(m_cat, m_bytes);
}

bool checked_numel(const Shape& s, int64_t* out) {
  int64_t n = 1;
  for (auto d : s)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return false;
  *out = n;
  return true;
}

int64_t numel(const Shape& s) {
  int64_t n = 0;
  if (!checked_numel(s, &n))
    throw UsageError("shape " + shape_str(s) + " has a negative size or more than 2^63 elements");
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

Tensor::Tensor(std::shared_ptr<Buffer> buf, const Shape& shape, DType dtype)
    : m_buf(std::move(buf)), m_ndim(int(shape.size())), m_dtype(dtype) {
  if (m_ndim < 1 || m_ndim > kMaxDims) throw std::logic_error("tensor rank must be 1..4");
  int64_t st = 1;
  for (int d = m_ndim - 1; d >= 0; --d) {
    m_shape[d] = shape[d];
    m_stride[d] = st;
    st *= shape[d];
  }
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int d = 0; d < m_ndim; ++d) n *= m_shape[d];
  return n;
}

bool Tensor::is_contiguous() const {
  int64_t st = 1;
  for (int d = m_ndim - 1; d >= 0; --d) {
    if (m_shape[d] != 1 && m_stride[d] != st) return false;
    st *= m_shape[d];
  }
  return true;
}

std::string Tensor::shape_str() const { return ss::shape_str(shape()); }

Tensor Tensor::slice(int dim, int64_t start, int64_t length) const {
  if (dim < 0) dim += m_ndim;
  if (dim < 0 || dim >= m_ndim || start < 0 || length < 0 || start + length > m_shape[dim])
    throw std::logic_error("slice [" + std::to_string(start) + ", +" + std::to_string(length) +
                           ") out of range for dim " + std::to_string(dim) + " of " + shape_str());
  Tensor t = *this;
  t.m_offset += start * m_stride[dim];
  t.m_shape[dim] = length;
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  if (!is_contiguous()) throw std::logic_error("reshape of a non-contiguous view " + shape_str());
  if (ss::numel(shape) != numel())
    throw std::logic_error("reshape " + shape_str() + " to " + ss::shape_str(shape));
  Tensor t(m_buf, shape, m_dtype);
  t.m_offset = m_offset;
  return t;
}

}  // namespace ss
