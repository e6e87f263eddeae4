#include "runtime/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/hash.h"

namespace ss {

void validate_sampling(const Sampling& s) {
  if (!std::isfinite(s.temperature) || s.temperature < 0)
    throw UsageError("--temperature must be 0 (greedy) or positive, e.g. 0.8");
  if (s.top_k < 0) throw UsageError("--top-k must be 0 (every token) or positive, e.g. 40");
  if (s.top_k > 0 && s.greedy())
    throw UsageError("--top-k " + std::to_string(s.top_k) + " samples among the top tokens; give a --temperature "
                     "above 0 as well (greedy decoding takes the top token)");
}

int32_t sample_token(std::span<const float> logits, const Sampling& s, uint64_t seed, uint64_t sequence,
                     uint64_t step) {
  const int64_t V = int64_t(logits.size());
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  auto higher = [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  };
  if (s.greedy()) return *std::min_element(ids.begin(), ids.end(), higher);
  int64_t k = s.top_k > 0 ? std::min<int64_t>(s.top_k, V) : V;
  if (k < V) std::nth_element(ids.begin(), ids.begin() + (k - 1), ids.end(), higher);
  ids.resize(size_t(k));
  std::sort(ids.begin(), ids.end(), higher);  // a fixed order to walk the cumulative sum in
  // softmax(l / T) in double, from the largest.
  const double top = double(logits[size_t(ids.front())]), inv_t = 1.0 / double(s.temperature);
  std::vector<double> w(static_cast<size_t>(k));
  double total = 0;
  for (int64_t i = 0; i < k; ++i) total += w[size_t(i)] = std::exp((double(logits[size_t(ids[size_t(i)])]) - top) * inv_t);
  // u in [0, 1) from 53 bits of the hash of (seed, sequence, step).
  const uint64_t h = splitmix64(splitmix64(splitmix64(seed) ^ sequence) ^ step);
  const double u = double(h >> 11) * 0x1p-53 * total;
  double acc = 0;
  for (int64_t i = 0; i < k; ++i)
    if ((acc += w[size_t(i)]) > u) return ids[size_t(i)];
  return ids.back();
}

}  // namespace ss
