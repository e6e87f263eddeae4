#include "sim/cost_model.h"

#include <algorithm>
#include <cmath>

namespace ss {
namespace {

// GEMM efficiency falls off for small dimensions: each of M, N, K contributes
// d / (d + 32), so a 4096-cubed GEMM runs at ~98% of peak and a decode GEMM
// (M = 1) at ~3%, where it is bound by reading the weights anyway.
double gemm_efficiency(const std::vector<int64_t>& d) {
  if (d.size() < 3) return 1.0;
  double e = 1.0;
  for (int i = 0; i < 3; ++i) e *= double(d[size_t(i)]) / (double(d[size_t(i)]) + 32.0);
  return std::max(e, 1e-3);
}

}  // namespace

double kernel_seconds(const HardwareProfile& hw, const std::string& op, double flops, double bytes,
                      const std::vector<int64_t>& dims) {
  double rate = hw.fp32_flops;
  if (op == "gemm") rate = hw.matmul_flops * gemm_efficiency(dims);
  // Blockwise attention and the SSD scan are GEMM-shaped but fused: assume
  // half of the matmul rate (FlashAttention-2 reports 50-73% of peak).
  else if (op == "attention" || op == "ssd_scan" || op == "ssd_state_correction") rate = hw.matmul_flops * 0.5;
  // The Mamba selective scan is a per-channel recurrence: a fraction of the vector rate.
  else if (op == "selective_scan" || op == "selective_state_correction") rate = hw.fp32_flops * 0.25;
  const double compute = flops > 0 ? flops / rate : 0.0;
  const double memory = bytes / hw.memory_bandwidth;
  return std::max(compute, memory) + hw.launch;
}

CollectiveCost collective_seconds(const LinkProfile& l, const std::string& op, double S, int n) {
  if (n <= 1) return {0.0, "local"};
  const double a = l.latency, b = l.bandwidth, steps = double(n - 1), lg = std::ceil(std::log2(double(n)));
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
