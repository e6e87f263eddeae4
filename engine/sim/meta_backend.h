// A backend of meta tensors: shapes, dtypes and exact memory accounting, no
// data and no kernels. Each op still records a span (of zero length here; the
// simulator's cost model gives it a duration). Used to describe a model
// without materialising it, and as the base of the sim backend.
#pragma once

#include "core/backend.h"

namespace ss {

class MetaBackend : public Backend {
 public:
  using Backend::Backend;
  std::string_view kind() const override { return "meta"; }
  std::string device_name() const override { return "meta device (no data)"; }
  bool has_data() const override { return false; }

 protected:
  void execute(const char* op, double flops, double bytes, std::vector<int64_t> dims,
               const std::function<void()>&, DType) override {
    const int64_t t = recorder().now();
    recorder().span(StreamKind::Compute, op, t, t, flops, bytes, std::move(dims));
  }
  void* allocate_data(int64_t) override { return nullptr; }
  Buffer::FreeFn free_fn() const override { return nullptr; }
};

}  // namespace ss
