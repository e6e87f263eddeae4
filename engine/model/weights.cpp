#include "model/weights.h"

#include <cmath>
#include <vector>

namespace ss {
namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) from 24 random bits.
float unit(uint64_t key, int64_t index) { return float(splitmix64(key ^ splitmix64(uint64_t(index))) >> 40) * 0x1p-24f; }

}  // namespace

float synthetic_value(const WeightSpec& w, uint64_t seed, int64_t index) {
  const uint64_t key = splitmix64(seed) ^ fnv1a(w.name);
  const float u = unit(key, index);      // [0, 1)
  const float sym = 2.0f * u - 1.0f;     // [-1, 1), std 1/sqrt(3)
  const float sqrt3 = 1.7320508f;
  const int64_t cols = w.shape.back();
  switch (w.init) {
    case Init::Linear: return sym * sqrt3 * w.scale / std::sqrt(float(cols));
    case Init::Embedding: return sym * sqrt3 * w.scale;
    case Init::NormWeight: return 1.0f + 0.1f * sym;
    case Init::ConvWeight: return sym * sqrt3 / std::sqrt(float(cols));
    case Init::ConvBias: return 0.1f * sym;
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

void SyntheticSource::fill(Backend& be, const WeightSpec& w, const Tensor& dst) {
  if (!be.has_data()) return;
  std::vector<float> host(static_cast<size_t>(dst.numel()));
  if (w.slice.mirrored()) {
    const int64_t n = int64_t(host.size());
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) host[size_t(i)] = synthetic_value(w, m_seed, i);
  } else {
    for_each_slice_element(w.shape, w.slice,
                           [&](int64_t l, int64_t g) { host[size_t(l)] = synthetic_value(w, m_seed, g); });
  }
  be.upload(dst, host.data(), DType::F32);
}

}  // namespace ss
