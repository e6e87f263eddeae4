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

}  // namespace

double kernel_seconds(const HardwareProfile& hw, const std::string& op, double flops, double bytes,
                      const std::vector<int64_t>& dims) {
  double rate = hw.fp32_flops, bandwidth = hw.memory_bandwidth * hw.elementwise_efficiency;
  if (op == "gemm") {
    rate = hw.matmul_flops * gemm_efficiency(dims);
    // A GEMM of a few rows streams its weights at a fraction of the bandwidth.
    bandwidth = hw.memory_bandwidth * (!dims.empty() && dims[0] <= 8 ? hw.gemv_efficiency : 1.0);
  }
  // Blockwise attention and the SSD scan are GEMM-shaped but fused: a
  // fraction of the matmul rate (FlashAttention-2 reports 50-73% of peak on
  // GPUs; calibrate measures it on a CPU).
  else if (op == "attention") rate = hw.matmul_flops * hw.attention_efficiency;
  else if (op == "ssd_scan" || op == "ssd_state_correction") rate = hw.matmul_flops * hw.scan_efficiency;
  // The Mamba selective scan is a per-channel recurrence: a fraction of the vector rate.
  else if (op == "selective_scan" || op == "selective_state_correction") rate = hw.fp32_flops * 0.25;
  const double compute = flops > 0 ? flops / rate : 0.0;
  const double memory = bytes / bandwidth;
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
