#include "cpu/cpu_backend.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "cpu/kernels.h"

namespace ss {
namespace {

void free_aligned(void* p) { std::free(p); }

// Applies f(row pointer of dst, row pointer of src, cols) for 2-D views of any row stride.
template <class F>
void for_rows(const Tensor& t, F&& f) {
  if (t.ndim() == 2) {
#pragma omp parallel for schedule(static) if (t.numel() > (1 << 16))
    for (int64_t r = 0; r < t.rows(); ++r) f(r);
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

void* CpuBackend::allocate_data(int64_t bytes) {
  const size_t rounded = (size_t(bytes) + 63) & ~size_t(63);
  return std::aligned_alloc(64, rounded);
}
Buffer::FreeFn CpuBackend::free_fn() const { return &free_aligned; }

void CpuBackend::k_upload(const Tensor& dst, const void* src, DType src_dtype) {
  const int64_t n = dst.numel();
  float* d = dst.data<float>();
  if (dst.dtype() != DType::F32) throw std::logic_error("cpu tensors hold f32");
  switch (src_dtype) {
    case DType::F32: std::memcpy(d, src, size_t(n) * 4); break;
    case DType::BF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
      break;
    }
    case DType::F16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) d[i] = f16_to_f32(s[i]);
      break;
    }
    default: throw std::logic_error("upload: unsupported source dtype");
  }
}

void CpuBackend::k_download(const Tensor& src, float* dst) {
  std::memcpy(dst, src.data<float>(), size_t(src.numel()) * 4);
}

void CpuBackend::k_fill(const Tensor& dst, float value) {
  if (dst.is_contiguous()) {
    std::fill_n(dst.data<float>(), dst.numel(), value);
    return;
  }
  for_rows(dst, [&](int64_t r) { std::fill_n(dst.data<float>() + r * dst.ld(), dst.cols(), value); });
}

void CpuBackend::k_matmul(const Tensor& y, const Tensor& x, const Tensor& w, bool accumulate) {
  cpu::matmul(y, x, w, accumulate);
}

void CpuBackend::k_embedding(const Tensor& y, const Tensor& table, std::span<const int32_t> tokens) {
  for (size_t t = 0; t < tokens.size(); ++t)
    std::memcpy(y.data<float>() + int64_t(t) * y.ld(), table.data<float>() + tokens[t] * table.ld(),
                size_t(table.cols()) * 4);
}

void CpuBackend::k_rmsnorm(const Tensor& y, const Tensor& x, const Tensor& z, const Tensor& w, float eps,
                           int64_t group) {
  cpu::rmsnorm(y, x, z, w, eps, group);
}

void CpuBackend::k_rope(const Tensor& x, int n_heads, int head_dim, std::span<const int32_t> pos, float theta) {
  cpu::rope(x, n_heads, head_dim, pos, theta);
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
    float* yr = y.data<float>() + r * y.ld();
    const float* g = gate.data<float>() + r * gate.ld();
    const float* u = up.data<float>() + r * up.ld();
    for (int64_t c = 0; c < y.cols(); ++c) yr[c] = cpu::silu(g[c]) * u[c];
  });
}

void CpuBackend::k_add(const Tensor& y, const Tensor& a, const Tensor& b) {
  for_rows(y, [&](int64_t r) {
    float* yr = y.data<float>() + r * y.ld();
    const float* ar = a.data<float>() + r * a.ld();
    const float* br = b.data<float>() + r * b.ld();
    for (int64_t c = 0; c < y.cols(); ++c) yr[c] = ar[c] + br[c];
  });
}

void CpuBackend::k_copy(const Tensor& dst, const Tensor& src) {
  if (dst.is_contiguous() && src.is_contiguous()) {
    std::memcpy(dst.data<float>(), src.data<float>(), size_t(dst.nbytes()));
    return;
  }
  if (dst.ndim() != 2) throw std::logic_error("copy of strided views takes 2-D tensors");
  for_rows(dst, [&](int64_t r) {
    std::memcpy(dst.data<float>() + r * dst.ld(), src.data<float>() + r * src.ld(), size_t(dst.cols()) * 4);
  });
}

void CpuBackend::k_conv1d_causal(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b,
                                 const Tensor& state, bool silu) {
  cpu::conv1d_causal(y, x, w, b, state, silu);
}

void CpuBackend::k_ssd_scan(const SsdArgs& a) { cpu::ssd_scan(a); }
void CpuBackend::k_selective_scan(const SelectiveScanArgs& a) { cpu::selective_scan(a); }

void CpuBackend::k_ssd_state_correction(const SsdArgs& a) { cpu::ssd_state_correction(a); }

void CpuBackend::k_quantize(const Tensor& out, const Tensor& in, const QuantSpec& spec, uint64_t counter) {
  quantize_values(in.data<float>(), in.numel(), spec, counter, reinterpret_cast<uint8_t*>(out.data<float>()));
}
void CpuBackend::k_dequantize(const Tensor& out, const Tensor& in, const QuantSpec& spec, bool accumulate) {
  dequantize_values(reinterpret_cast<const uint8_t*>(in.data<float>()), out.numel(), spec, out.data<float>(),
                    accumulate);
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
  for (int64_t c = 0; c < C; ++c)
    for (int64_t n = 0; n < N; ++n) {
      const int64_t i = c * N + n;
      const float decay = std::exp(-std::exp(A_log.data<float>()[i]) * dt_sum.data<float>()[c]);
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
  const float* r = x.data<float>() + row * x.ld();
  int64_t best = 0;
  for (int64_t c = 1; c < x.cols(); ++c)
    if (r[c] > r[best]) best = c;
  return int32_t(best);
}

}  // namespace ss
