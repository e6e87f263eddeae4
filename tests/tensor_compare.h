// Comparing whole models' tensors (a gradient --dump-grads wrote, a
// checkpoint's weights) tensor by tensor, for the suites that train.
#pragma once

#include <QString>

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "io/safetensors.h"

using Tensors = std::map<std::string, std::vector<float>>;

inline Tensors load_tensors(const QString& file) {
  Tensors out;
  const ss::SafetensorsIndex idx = ss::SafetensorsIndex::open_file(file.toStdString());
  for (auto& [name, e] : idx.entries()) {
    const std::vector<uint8_t> bytes = idx.read(name);
    std::vector<float> v(size_t(ss::numel(e.shape)));
    ss::widen(bytes.data(), e.dtype, int64_t(v.size()), v.data());
    out[name] = std::move(v);
  }
  return out;
}

inline double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  if (a.size() != ref.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// The worst tensor of `got` against `want` (every name of want must be there).
inline std::pair<double, std::string> worst(const Tensors& got, const Tensors& want) {
  std::pair<double, std::string> w{0.0, ""};
  for (auto& [name, ref] : want) {
    auto it = got.find(name);
    const double e = it == got.end() ? INFINITY : rel_l2(it->second, ref);
    if (e > w.first || it == got.end()) w = {e, name};
  }
  return w;
}
