// Tensors: a shape, strides and a dtype over a shared, accounted buffer.
// Views (slices, reshapes) share the buffer; the bytes are released to the
// allocator when the last view goes away. A meta tensor (sim backend) has the
// same shape and accounting but no data. Only kernels read data pointers.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"

namespace ss {

// One accounted allocation. `data` is null for meta buffers.
class Buffer {
 public:
  using FreeFn = void (*)(void*);
  Buffer(Allocator& alloc, Category cat, int64_t bytes, std::string label, void* data,
         FreeFn free_fn);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return m_data; }
  int64_t bytes() const { return m_bytes; }
  Category category() const { return m_cat; }
  const std::string& label() const { return m_label; }

 private:
  Allocator& m_alloc;
  Category m_cat;
  int64_t m_bytes;
  std::string m_label;
  void* m_data;
  FreeFn m_free;
};

inline constexpr int kMaxDims = 4;
using Shape = std::vector<int64_t>;

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Buffer> buf, const Shape& shape, DType dtype);

  bool defined() const { return m_buf != nullptr; }
  int ndim() const { return m_ndim; }
  int64_t size(int d) const { return m_shape[d < 0 ? d + m_ndim : d]; }
  int64_t stride(int d) const { return m_stride[d < 0 ? d + m_ndim : d]; }
  Shape shape() const { return Shape(m_shape.begin(), m_shape.begin() + m_ndim); }
  DType dtype() const { return m_dtype; }
  int64_t numel() const;
  int64_t nbytes() const { return numel() * dtype_size(m_dtype); }
  bool is_contiguous() const;
  bool has_data() const { return m_buf && m_buf->data(); }
  const std::shared_ptr<Buffer>& buffer() const { return m_buf; }
  std::string shape_str() const;

  // For 2-D tensors: rows, columns and the row stride (leading dimension).
  int64_t rows() const { return m_shape[0]; }
  int64_t cols() const { return m_shape[1]; }
  int64_t ld() const { return m_stride[0]; }

  // Views sharing the buffer.
  Tensor slice(int dim, int64_t start, int64_t length) const;
  Tensor reshape(const Shape& shape) const;  // contiguous tensors only

  // Raw access, for kernels only (model and strategy code never calls this).
  // data<T>() counts the view's offset in elements of T (T must match the
  // dtype's width); raw() and row_ptr() work for any dtype.
  template <class T>
  T* data() const {
    return m_buf && m_buf->data() ? static_cast<T*>(m_buf->data()) + m_offset : nullptr;
  }
  void* raw() const {
    return m_buf && m_buf->data() ? static_cast<char*>(m_buf->data()) + m_offset * dtype_size(m_dtype) : nullptr;
  }
  void* row_ptr(int64_t r) const { return static_cast<char*>(raw()) + r * m_stride[0] * dtype_size(m_dtype); }

 private:
  std::shared_ptr<Buffer> m_buf;
  int64_t m_offset = 0;  // in elements
  std::array<int64_t, kMaxDims> m_shape{};
  std::array<int64_t, kMaxDims> m_stride{};
  int m_ndim = 0;
  DType m_dtype = DType::F32;
};

std::string shape_str(const Shape& s);
// Elements of a shape; throws UsageError for a negative size or more than
// 2^63 elements (shapes come from files and flags).
int64_t numel(const Shape& s);
// The same without throwing: false on a negative size or an overflow.
bool checked_numel(const Shape& s, int64_t* out);

}  // namespace ss
