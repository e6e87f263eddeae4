#include "model/weights.h"

#include <cmath>
#include <vector>

#include "core/hash.h"

namespace ss {
namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Uniform in [0, 1) from 24 random bits.
float unit(uint64_t key, int64_t index) { return float(splitmix64(key ^ splitmix64(uint64_t(index))) >> 40) * 0x1p-24f; }

}  // namespace

SyntheticDraw::SyntheticDraw(const WeightSpec& w, uint64_t seed) : m_w(w), m_key(splitmix64(seed) ^ fnv1a(w.name)) {}

float SyntheticDraw::operator()(int64_t index) const {
  const WeightSpec& w = m_w;
  const float u = unit(m_key, index);    // [0, 1)
  const float sym = 2.0f * u - 1.0f;     // [-1, 1), std 1/sqrt(3)
  const float sqrt3 = 1.7320508f;
  const int64_t cols = w.shape.back();
  switch (w.init) {
    case Init::Linear: return sym * sqrt3 * w.scale / std::sqrt(float(cols));
    case Init::Embedding: return sym * sqrt3 * w.scale;
    case Init::NormWeight: return 1.0f + 0.1f * sym;
    case Init::ConvWeight: return sym * sqrt3 / std::sqrt(float(cols));
    case Init::ConvBias: return 0.1f * sym;
    case Init::Bias: return 0.3f * sqrt3 * sym * w.scale;
    case Init::ALogHeads: return std::log(1.0f + 15.0f * u);
    case Init::ALogS4D: return std::log(float(index % cols + 1));
    case Init::DtBias: {
      const float dt = std::exp(std::log(1e-3f) + u * (std::log(1e-1f) - std::log(1e-3f)));
      return dt + std::log(-std::expm1(-dt));  // softplus^-1(dt)
    }
    case Init::DSkip: return 1.0f + 0.1f * sym;
  }
  return 0.0f;
}

Shape WeightSpec::local_shape() const {
  Shape s = shape;
  if (!slice.mirrored()) s[size_t(slice.axis)] = slice.extent();
  return s;
}

// Values are drawn and uploaded a block at a time, so the host staging stays
// small next to the tensor (the peak resident set is the accounted bytes
// plus a fixed overhead, also for a 32000-row embedding).
void SyntheticSource::fill(Backend& be, const WeightSpec& w, const Tensor& dst) {
  if (!be.has_data()) return;
  constexpr int64_t kBlock = int64_t(1) << 18;
  const Tensor flat = dst.reshape({dst.numel()});
  const int64_t n = dst.numel();
  std::vector<float> host(size_t(std::min(n, kBlock)));
  const SyntheticDraw draw(w, m_seed);
  if (w.slice.mirrored()) {
    for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
      const int64_t m = std::min(kBlock, n - i0);
#pragma omp parallel for schedule(static) if (m > (1 << 16))
      for (int64_t i = 0; i < m; ++i) host[size_t(i)] = draw(i0 + i);
      be.upload(flat.slice(0, i0, m), host.data(), DType::F32);
    }
    return;
  }
  int64_t base = 0;  // local index of host[0]
  for_each_slice_element(w.shape, w.slice, [&](int64_t l, int64_t g) {
    host[size_t(l - base)] = draw(g);
    if (l - base + 1 == int64_t(host.size()) || l + 1 == n) {
      be.upload(flat.slice(0, base, l - base + 1), host.data(), DType::F32);
      base = l + 1;
    }
  });
}

}  // namespace ss
