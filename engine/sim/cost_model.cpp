#include "sim/cost_model.h"

#include <algorithm>
#include <cmath>

namespace ss {
namespace {

// GEMM efficiency falls off for small dimensions. N and K each contribute
// d / (d + 32) and M contributes M / (M + 8): a 4096-cubed GEMM runs at ~99%
// of peak, a 64-wide one at ~60%. A decode GEMM (M = 1) is bound by reading
// the weights, which the roofline's memory term already charges.
double gemm_efficiency(const std::vector<int64_t>& d) {
  if (d.size() < 3) return 1.0;
  const double m = double(d[0]), n = double(d[1]), k = double(d[2]);
  return std::max(m / (m + 8.0) * n / (n + 32.0) * k / (k + 32.0), 1e-3);
}

// A measured GEMM: the shape's own times when it was measured; otherwise the
// nearest measured shapes (up to four, by distance in log2 N and log2 K,
// weighted by the inverse square distance), each scaled by N*K over its own.
double gemm_measured(const std::vector<GemmShapeTimes>& shapes, double M, double N, double K) {
  std::vector<std::pair<double, const GemmShapeTimes*>> near;
  for (const auto& s : shapes) {
    if (s.n == N && s.k == K) return s.at(M);
    const double dn = std::log2(N / s.n), dk = std::log2(K / s.k);
    near.emplace_back(dn * dn + dk * dk, &s);
  }
  std::sort(near.begin(), near.end(), [](auto& a, auto& b) { return a.first < b.first; });
  near.resize(std::min<size_t>(near.size(), 4));
  double sum = 0, wsum = 0;
  for (auto& [d2, s] : near) {
    const double w = 1.0 / d2;
    sum += w * s->at(M) * (N * K) / (s->n * s->k);
    wsum += w;
  }
  return sum / wsum;
}

// Visible (query, key) pairs of the measured attention: Tq queries at the
// last Tq of Tk key positions (all keys visible to each when Tq > Tk).
double attention_pairs(double tq, double tk) { return tq <= tk ? tq * tk - tq * (tq - 1) / 2 : tq * tk; }

}  // namespace

double kernel_seconds(const HardwareProfile& hw, const std::string& op, double flops, double bytes,
                      const std::vector<int64_t>& dims, DType dtype, std::span<const AttentionRun> runs) {
  // Measured times (a calibrated profile): the kernel's own spans at these
  // sizes, which hold its per-call overhead and its achieved rates. They were
  // measured in fp32; other dtypes take the roofline at their own rates.
  const bool measured = dtype == DType::F32;
  if (measured && op == "gemm" && !hw.gemm_times.empty() && dims.size() == 3) {
    if (dims[0] == 0 || dims[1] == 0 || dims[2] == 0) return hw.launch;
    return gemm_measured(hw.gemm_times, double(dims[0]), double(dims[1]), double(dims[2]));
  }
  if (measured && op == "attention" && !hw.attention_times.empty() && dims.size() == 4 && flops > 0) {
    // Scaled by FLOPs from the measured heads and mask to this call's.
    const AttentionTimes& a = hw.attention_times;
    auto block = [&](double tq, double tk, double block_flops) {
      return a.grid.at(tq, tk) * block_flops / (attention_pairs(tq, tk) * a.heads * 4.0 * a.head_dim);
    };
    double pairs = 0;
    for (const AttentionRun& r : runs) pairs += r.pairs;
    if (runs.empty() || !(pairs > 0)) return block(double(dims[0]), double(dims[1]), flops);
    double t = 0;
    for (const AttentionRun& r : runs)
      if (r.pairs > 0) t += block(double(r.queries), double(r.keys), flops * r.pairs / pairs);
    return t;
  }
  if (auto it = hw.kernel_times.find(op); measured && it != hw.kernel_times.end() && !dims.empty() && dims.size() <= 2) {
    // Rows and columns as the span's dims give them (a 1-D op is one row).
    const double rows = dims.size() == 2 ? double(dims[0]) : 1.0, cols = double(dims.back());
    return it->second.at(rows, cols);
  }

  double rate = hw.fp32_flops, bandwidth = hw.memory_bandwidth * hw.elementwise_efficiency;
  const double matmul = hw.matmul_rate(dtype);
  if (op == "gemm") {
    rate = matmul * gemm_efficiency(dims);
    // A GEMM of a few rows streams its weights at a fraction of the bandwidth.
    bandwidth = hw.memory_bandwidth * (!dims.empty() && dims[0] <= 8 ? hw.gemv_efficiency : 1.0);
  }
  // Blockwise attention and the SSD scan are GEMM-shaped but fused: a
  // fraction of the matmul rate (FlashAttention-2 reports 50-73% of peak on
  // GPUs; calibrate measures it on a CPU).
  else if (op == "attention" || op == "attention_backward") rate = matmul * hw.attention_efficiency;
  else if (op == "ssd_scan" || op == "ssd_state_correction" || op == "ssd_scan_backward")
    rate = matmul * hw.scan_efficiency;
  // The Mamba selective scan is a per-channel recurrence: a fraction of the vector rate.
  else if (op == "selective_scan" || op == "selective_state_correction" || op == "selective_scan_backward")
    rate = hw.fp32_flops * 0.25;
  const double compute = flops > 0 ? flops / rate : 0.0;
  const double memory = bytes / bandwidth;
  return std::max(compute, memory) + hw.launch;
}

CollectiveCost collective_seconds(const LinkProfile& l, const std::string& op, double S, int n) {
  if (n <= 1) return {0.0, "local"};
  // Alpha and beta measured for this collective when the profile has them.
  double a = l.latency, b = l.bandwidth;
  if (auto it = l.collectives.find(op); it != l.collectives.end()) {
    if (const CollectiveTimes* t = it->second.times_for(n)) return {t->at(S), "measured"};
    a = it->second.latency;
    b = it->second.bandwidth;
  }
  const double steps = double(n - 1), lg = std::ceil(std::log2(double(n)));
  auto best = [](CollectiveCost x, CollectiveCost y) { return x.seconds <= y.seconds ? x : y; };
  if (op == "all_reduce")
    return best({2 * steps * a + 2 * steps / n * S / b, "ring"}, {2 * lg * (a + S / b), "tree"});
  if (op == "all_gather" || op == "reduce_scatter") return {steps * a + steps / n * S / b, "ring"};
  if (op == "all_to_all") return {steps * a + steps / n * S / b, "direct"};
  if (op == "broadcast") return best({steps * a + S / b, "ring"}, {lg * (a + S / b), "tree"});
  if (op == "barrier") return {2 * lg * a, "tree"};
  return {a + S / b, "direct"};  // sendrecv, send, recv
}

}  // namespace ss
