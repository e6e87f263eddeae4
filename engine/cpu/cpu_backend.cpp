#include "cpu/cpu_backend.h"

#include <immintrin.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "comm/quantize.h"
#include "cpu/host_blocks.h"
#include "cpu/kernels.h"

namespace ss {
namespace {

// Applies f(row pointer of dst, row pointer of src, cols) for 2-D views of any row stride.
template <class F>
void for_rows(const Tensor& t, F&& f) {
  if (t.ndim() == 2) {
    cpu::parallel_for(t.rows(), t.numel() > (1 << 16), f);
  } else {
    throw std::logic_error("elementwise kernels take 2-D tensors, got " + t.shape_str());
  }
}

}  // namespace

std::string CpuBackend::device_name() const {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) return line.substr(p + 2);
    }
  return "host CPU";
}

void* CpuBackend::allocate_data(int64_t bytes) { return cpu::host_alloc(bytes); }
Buffer::FreeFn CpuBackend::free_fn() const { return &cpu::host_free; }

// Host values of `src_dtype` into the tensor's dtype: a plain copy when they
// match (a bf16 checkpoint loads without being widened), otherwise widened to
// fp32 and rounded once to nearest even.
void CpuBackend::k_upload(const Tensor& dst, const void* src, DType src_dtype) {
  const int64_t n = dst.numel();
  if (src_dtype == dst.dtype()) {
    std::memcpy(dst.raw(), src, size_t(dst.nbytes()));
    return;
  }
  if (!is_float(src_dtype) || !is_float(dst.dtype())) throw std::logic_error("upload: no conversion between i32 and floats");
  constexpr int64_t kBlock = 4096;
  float buf[kBlock];
  const int64_t ss = dtype_size(src_dtype), ds = dtype_size(dst.dtype());
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t m = std::min(kBlock, n - i);
    widen(static_cast<const char*>(src) + i * ss, src_dtype, m, buf);
    narrow(buf, m, dst.dtype(), static_cast<char*>(dst.raw()) + i * ds);
  }
}

void CpuBackend::k_download(const Tensor& src, float* dst) { widen(src.raw(), src.dtype(), src.numel(), dst); }

void CpuBackend::k_fill(const Tensor& dst, float value) {
  if (dst.dtype() == DType::F32) {
    if (dst.is_contiguous()) {
      std::fill_n(dst.data<float>(), dst.numel(), value);
      return;
    }
    for_rows(dst, [&](int64_t r) { std::fill_n(dst.data<float>() + r * dst.ld(), dst.cols(), value); });
    return;
  }
  uint16_t bits;
  narrow(&value, 1, dst.dtype(), &bits);
  if (dst.is_contiguous()) {
    std::fill_n(static_cast<uint16_t*>(dst.raw()), dst.numel(), bits);
    return;
  }
  for_rows(dst, [&](int64_t r) { std::fill_n(static_cast<uint16_t*>(dst.row_ptr(r)), dst.cols(), bits); });
}

void CpuBackend::k_matmul(const Tensor& y, const Tensor& x, const Tensor& w, bool accumulate) {
  cpu::matmul(y, x, w, accumulate);
}

void CpuBackend::k_matmul_group(std::span<const Tensor> ys, const Tensor& x, std::span<const Tensor> ws) {
  cpu::matmul_group(ys, x, ws);
}

void CpuBackend::k_embedding(const Tensor& y, const Tensor& table, std::span<const int32_t> tokens) {
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (y.dtype() == table.dtype()) {
      std::memcpy(y.row_ptr(int64_t(t)), table.row_ptr(tokens[t]), size_t(table.cols() * dtype_size(y.dtype())));
      continue;
    }
    float* buf = cpu::scratch(0, table.cols());
    widen(table.row_ptr(tokens[t]), table.dtype(), table.cols(), buf);
    narrow(buf, table.cols(), y.dtype(), y.row_ptr(int64_t(t)));
  }
}

void CpuBackend::k_rmsnorm(const Tensor& y, const Tensor& x, const Tensor& z, const Tensor& w, float eps,
                           int64_t group) {
  cpu::rmsnorm(y, x, z, w, eps, group);
}

void CpuBackend::k_rope(const Tensor& x, int n_heads, int head_dim, std::span<const int32_t> pos,
                        std::span<const double> inv_freq) {
  cpu::rope(x, n_heads, head_dim, pos, inv_freq);
}

void CpuBackend::k_attention(const Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v,
                             const AttentionArgs& a, const Tensor& lse) {
  cpu::attention(o, q, k, v, a, lse);
}

void CpuBackend::k_attention_merge(const Tensor& o, const Tensor& lse, const Tensor& o2, const Tensor& lse2,
                                   int n_heads, int head_dim) {
  cpu::attention_merge(o, lse, o2, lse2, n_heads, head_dim);
}

void CpuBackend::k_silu_mul(const Tensor& y, const Tensor& gate, const Tensor& up) {
  for_rows(y, [&](int64_t r) {
    const float* g = cpu::row_f32(gate, r, 0);
    const float* u = cpu::row_f32(up, r, 1);
    float* yr = cpu::row_out(y, r, 3);
    cpu::silu_times(g, u, yr, y.cols());
    cpu::store_row(y, r, yr);
  });
}

void CpuBackend::k_add(const Tensor& y, const Tensor& a, const Tensor& b) {
  for_rows(y, [&](int64_t r) {
    const float* ar = cpu::row_f32(a, r, 0);
    const float* br = cpu::row_f32(b, r, 1);
    float* yr = cpu::row_out(y, r, 3);
    for (int64_t c = 0; c < y.cols(); ++c) yr[c] = ar[c] + br[c];
    cpu::store_row(y, r, yr);
  });
}

void CpuBackend::k_add_bias(const Tensor& y, const Tensor& b) {
  std::vector<float> bias(size_t(b.numel()));
  k_download(b, bias.data());
  for_rows(y, [&](int64_t r) {
    const float* yin = cpu::row_f32(y, r, 0);
    float* yr = cpu::row_out(y, r, 3);
    for (int64_t c = 0; c < y.cols(); ++c) yr[c] = yin[c] + bias[size_t(c)];
    cpu::store_row(y, r, yr);
  });
}

// A copy between tensors of one dtype moves bytes; between dtypes it converts
// (rounding once to nearest even when narrowing).
void CpuBackend::k_copy(const Tensor& dst, const Tensor& src) {
  const bool same = dst.dtype() == src.dtype();
  if (dst.is_contiguous() && src.is_contiguous()) {
    if (same) {
      std::memcpy(dst.raw(), src.raw(), size_t(dst.nbytes()));
      return;
    }
    constexpr int64_t kBlock = 4096;  // staged a block at a time
    float buf[kBlock];
    const int64_t n = src.numel(), ss = dtype_size(src.dtype()), ds = dtype_size(dst.dtype());
    for (int64_t i = 0; i < n; i += kBlock) {
      const int64_t m = std::min(kBlock, n - i);
      widen(static_cast<const char*>(src.raw()) + i * ss, src.dtype(), m, buf);
      narrow(buf, m, dst.dtype(), static_cast<char*>(dst.raw()) + i * ds);
    }
    return;
  }
  if (dst.ndim() != 2) throw std::logic_error("copy of strided views takes 2-D tensors");
  for_rows(dst, [&](int64_t r) {
    if (same) {
      std::memcpy(dst.row_ptr(r), src.row_ptr(r), size_t(dst.cols() * dtype_size(dst.dtype())));
      return;
    }
    const float* v = cpu::row_f32(src, r, 0);
    narrow(v, dst.cols(), dst.dtype(), dst.row_ptr(r));
  });
}

void CpuBackend::k_conv1d_causal(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b,
                                 const Tensor& state, bool silu) {
  cpu::conv1d_causal(y, x, w, b, state, silu);
}

void CpuBackend::k_ssd_scan(const SsdArgs& a) { cpu::ssd_scan(a); }
void CpuBackend::k_selective_scan(const SelectiveScanArgs& a) { cpu::selective_scan(a); }

void CpuBackend::k_ssd_state_correction(const SsdArgs& a) { cpu::ssd_state_correction(a); }

// `in` (quantize) and `out` (dequantize) may be in any float dtype; the codec
// works on fp32 values. The carrier's bytes are whatever its dtype.
void CpuBackend::k_quantize(const Tensor& out, const Tensor& in, const QuantSpec& spec, uint64_t counter) {
  const cpu::F32Rows x(in);
  quantize_values(x.p, in.numel(), spec, counter, static_cast<uint8_t*>(out.raw()));
}
void CpuBackend::k_dequantize(const Tensor& out, const Tensor& in, const QuantSpec& spec, bool accumulate) {
  cpu::F32Out y(out, accumulate);
  dequantize_values(static_cast<const uint8_t*>(in.raw()), out.numel(), spec, y.p, accumulate);
  y.commit();
}
void CpuBackend::k_selective_state_correction(const SelectiveScanArgs& a) { cpu::selective_state_correction(a); }

void CpuBackend::k_ssd_state_advance(const Tensor& state, const Tensor& chunk_state, const Tensor& log_decay) {
  const int64_t H = state.size(0), per = state.numel() / H;
  for (int64_t h = 0; h < H; ++h) {
    const float d = std::exp(log_decay.data<float>()[h]);
    float* s = state.data<float>() + h * per;
    const float* c = chunk_state.data<float>() + h * per;
    for (int64_t i = 0; i < per; ++i) s[i] = d * s[i] + c[i];
  }
}

void CpuBackend::k_selective_state_advance(const Tensor& state, const Tensor& A_log, const Tensor& chunk_state,
                                           const Tensor& dt_sum) {
  const int64_t C = state.size(0), N = state.numel() / C;
  const cpu::F32Rows Alog(A_log.reshape({A_log.numel()}));
  for (int64_t c = 0; c < C; ++c)
    for (int64_t n = 0; n < N; ++n) {
      const int64_t i = c * N + n;
      const float decay = std::exp(-std::exp(Alog[i]) * dt_sum.data<float>()[c]);
      state.data<float>()[i] = decay * state.data<float>()[i] + chunk_state.data<float>()[i];
    }
}

void CpuBackend::k_gated_norm_sumsq(const Tensor& ss, const Tensor& x, const Tensor& z, int64_t local_group,
                                    int64_t slot0) {
  cpu::gated_norm_sumsq(ss, x, z, local_group, slot0);
}

void CpuBackend::k_gated_rmsnorm_apply(const Tensor& y, const Tensor& x, const Tensor& z, const Tensor& w,
                                       const Tensor& ss, float eps, int64_t local_group, int64_t total_group,
                                       int64_t slot0) {
  cpu::gated_rmsnorm_apply(y, x, z, w, ss, eps, local_group, total_group, slot0);
}

int32_t CpuBackend::k_argmax_row(const Tensor& x, int64_t row) {
  // The largest value (a vectorised pass), then the first column holding it.
  const float* r = cpu::row_f32(x, row, 0);
  const int64_t n = x.cols();
  __m256 m0 = _mm256_set1_ps(r[0]), m1 = m0, m2 = m0, m3 = m0;
  int64_t c = 0;
  for (; c + 32 <= n; c += 32) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(r + c));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(r + c + 8));
    m2 = _mm256_max_ps(m2, _mm256_loadu_ps(r + c + 16));
    m3 = _mm256_max_ps(m3, _mm256_loadu_ps(r + c + 24));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
  float top = r[0];
  for (float v : lanes) top = std::max(top, v);
  for (; c < n; ++c) top = std::max(top, r[c]);
  const __m256 t8 = _mm256_set1_ps(top);
  for (c = 0; c + 8 <= n; c += 8)
    if (const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(r + c), t8, _CMP_EQ_OQ)))
      return int32_t(c + __builtin_ctz(unsigned(hit)));
  for (; c < n; ++c)
    if (r[c] == top) return int32_t(c);
  return 0;  // NaN logits
}

// Training kernels (cpu/train_kernels.cpp, cpu/attention_backward.cpp, cpu/gemm.cpp).
void CpuBackend::k_matmul_dx(const Tensor& dx, const Tensor& dy, const Tensor& w, bool acc) {
  cpu::matmul_dx(dx, dy, w, acc);
}
void CpuBackend::k_matmul_dw(const Tensor& dw, const Tensor& dy, const Tensor& x, bool acc) {
  cpu::matmul_dw(dw, dy, x, acc);
}
void CpuBackend::k_bias_backward(const Tensor& db, const Tensor& dy) { cpu::bias_backward(db, dy); }
void CpuBackend::k_embedding_backward(const Tensor& dtable, const Tensor& dy, std::span<const int32_t> tokens) {
  cpu::embedding_backward(dtable, dy, tokens);
}
void CpuBackend::k_rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                                    const Tensor& w, float eps, int64_t group) {
  cpu::rmsnorm_backward(dx, dw, dy, x, w, eps, group);
}
void CpuBackend::k_silu_mul_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dy, const Tensor& gate,
                                     const Tensor& up) {
  cpu::silu_mul_backward(dgate, dup, dy, gate, up);
}
void CpuBackend::k_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                                      const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                      const Tensor& lse, const AttentionArgs& a) {
  cpu::attention_backward(dq, dk, dv, dout, q, k, v, o, lse, a);
}
void CpuBackend::k_cross_entropy(const Tensor& logits, const Tensor& loss, std::span<const int32_t> targets,
                                 float scale) {
  cpu::cross_entropy(logits, loss, targets, scale);
}
void CpuBackend::k_sum_squares(const Tensor& out, const Tensor& t) { cpu::sum_squares(out, t); }
void CpuBackend::k_count_nonfinite(const Tensor& out, const Tensor& t) { cpu::count_nonfinite(out, t); }
void CpuBackend::k_conv1d_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dstate,
                                   const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& b,
                                   const Tensor& state, bool silu) {
  cpu::conv1d_backward(dx, dw, db, dstate, dy, x, w, b, state, silu);
}
void CpuBackend::k_ssd_scan_backward(const SsdArgs& a, const Tensor& dy, const SsdGrads& g) {
  cpu::ssd_scan_backward(a, dy, g);
}
void CpuBackend::k_selective_scan_backward(const SelectiveScanArgs& a, const Tensor& dy, const SelectiveGrads& g) {
  cpu::selective_scan_backward(a, dy, g);
}
void CpuBackend::k_gated_rmsnorm_backward(const Tensor& dx, const Tensor& dz, const Tensor& dw, const Tensor& dy,
                                          const Tensor& x, const Tensor& z, const Tensor& w, float eps,
                                          int64_t group) {
  cpu::gated_rmsnorm_backward(dx, dz, dw, dy, x, z, w, eps, group);
}
void CpuBackend::k_adamw(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m,
                         const Tensor& v, const AdamWArgs& a) {
  cpu::adamw(param, master, grad, m, v, a);
}

}  // namespace ss
