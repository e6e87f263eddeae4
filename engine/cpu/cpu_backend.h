// The cpu backend: host memory (64-byte aligned), OpenBLAS GEMMs and the
// hand-written kernels of cpu/*.cpp. One MPI process per virtual device.
#pragma once

#include "core/backend.h"

namespace ss {

class CpuBackend final : public Backend {
 public:
  CpuBackend(Allocator& alloc, Recorder& rec) : Backend(alloc, rec) {}
  std::string_view kind() const override { return "cpu"; }
  std::string device_name() const override;

 protected:
  void* allocate_data(int64_t bytes) override;
  Buffer::FreeFn free_fn() const override;

  void k_upload(const Tensor& dst, const void* src, DType src_dtype) override;
  void k_download(const Tensor& src, float* dst) override;
  void k_fill(const Tensor& dst, float value) override;
  void k_matmul(const Tensor& y, const Tensor& x, const Tensor& w, bool accumulate) override;
  void k_matmul_group(std::span<const Tensor> ys, const Tensor& x, std::span<const Tensor> ws) override;
  void k_embedding(const Tensor& y, const Tensor& table, std::span<const int32_t> tokens) override;
  void k_rmsnorm(const Tensor& y, const Tensor& x, const Tensor& z, const Tensor& w, float eps,
                 int64_t group) override;
  void k_rope(const Tensor& x, int n_heads, int head_dim, std::span<const int32_t> pos,
              std::span<const double> inv_freq) override;
  void k_add_bias(const Tensor& y, const Tensor& b) override;
  void k_attention(const Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v, const AttentionArgs& a,
                   const Tensor& lse) override;
  void k_attention_merge(const Tensor& o, const Tensor& lse, const Tensor& o2, const Tensor& lse2, int n_heads,
                         int head_dim) override;
  void k_silu_mul(const Tensor& y, const Tensor& gate, const Tensor& up) override;
  void k_add(const Tensor& y, const Tensor& a, const Tensor& b) override;
  void k_copy(const Tensor& dst, const Tensor& src) override;
  void k_conv1d_causal(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& state,
                       bool silu) override;
  void k_ssd_scan(const SsdArgs& a) override;
  void k_selective_scan(const SelectiveScanArgs& a) override;
  int32_t k_argmax_row(const Tensor& x, int64_t row) override;
  void k_ssd_state_correction(const SsdArgs& a) override;
  void k_quantize(const Tensor& out, const Tensor& in, const QuantSpec& spec, uint64_t counter) override;
  void k_dequantize(const Tensor& out, const Tensor& in, const QuantSpec& spec, bool accumulate) override;
  void k_selective_state_correction(const SelectiveScanArgs& a) override;
  void k_ssd_state_advance(const Tensor& state, const Tensor& chunk_state, const Tensor& log_decay) override;
  void k_selective_state_advance(const Tensor& state, const Tensor& A_log, const Tensor& chunk_state,
                                 const Tensor& dt_sum) override;
  void k_gated_norm_sumsq(const Tensor& ss, const Tensor& x, const Tensor& z, int64_t local_group,
                          int64_t slot0) override;
  void k_gated_rmsnorm_apply(const Tensor& y, const Tensor& x, const Tensor& z, const Tensor& w, const Tensor& ss,
                             float eps, int64_t local_group, int64_t total_group, int64_t slot0) override;
  void k_matmul_dx(const Tensor& dx, const Tensor& dy, const Tensor& w, bool accumulate) override;
  void k_matmul_dw(const Tensor& dw, const Tensor& dy, const Tensor& x, bool accumulate) override;
  void k_embedding_backward(const Tensor& dtable, const Tensor& dy, std::span<const int32_t> tokens) override;
  void k_bias_backward(const Tensor& db, const Tensor& dy) override;
  void k_rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                          float eps, int64_t group) override;
  void k_silu_mul_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dy, const Tensor& gate,
                           const Tensor& up) override;
  void k_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                            const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                            const AttentionArgs& a) override;
  void k_cross_entropy(const Tensor& logits, const Tensor& loss, std::span<const int32_t> targets,
                       float scale) override;
  void k_sum_squares(const Tensor& out, const Tensor& t) override;
  void k_count_nonfinite(const Tensor& out, const Tensor& t) override;
  void k_conv1d_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dstate, const Tensor& dy,
                         const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& state, bool silu) override;
  void k_ssd_scan_backward(const SsdArgs& a, const Tensor& dy, const SsdGrads& g) override;
  void k_selective_scan_backward(const SelectiveScanArgs& a, const Tensor& dy, const SelectiveGrads& g) override;
  void k_gated_rmsnorm_backward(const Tensor& dx, const Tensor& dz, const Tensor& dw, const Tensor& dy,
                                const Tensor& x, const Tensor& z, const Tensor& w, float eps, int64_t group) override;
  void k_adamw(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
               const AdamWArgs& a) override;
};

}  // namespace ss
