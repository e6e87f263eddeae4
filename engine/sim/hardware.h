// Hardware profiles for the simulator (resources/hardware/*.json): a device's
// peak rates and memory, and the links a collective can cross (inside a node,
// between nodes). Every figure carries its source in the file.
//
// A profile written by `shardscope-engine calibrate` also carries measured
// kernel times (optional fields; datasheet profiles omit them and the cost
// model falls back to the roofline):
//   device.kernel_times.<op>  {"rows": [..], "cols": [..], "us": [[..] per row]}
//       the median span of <op> through the cpu backend at rows x cols;
//   device.gemm_times.shapes  [{"n": N, "k": K, "m": [..], "us": [..]}, ..]
//       the median span of y[M,N] = x[M,K] w[N,K]^T, w not in any cache;
//   device.attention_times    {"heads", "kv_heads", "head_dim", "tq": [..], "tk": [..], "us": [[..] per tq]}
//       the median attention span, Tq queries at the last Tq of Tk key positions;
//   device.contention          {"compute", "comm"} slowdowns of each stream beside the other,
//       "hold_us" how long either waits for the core the other holds;
//   device.core_share          {"kernel_us": [..], "share": [..]} the part of a core a rank gets
//       (more ranks than cores) over that much CPU time of kernels between collectives;
//   device.overlap_steps       {"kernel_us": [..], "share": [..], "wait_us": {"<op>": [..]}} the
//       same with a collective in flight beside the kernels, and how much longer than that
//       collective's own time a rank then waits for it;
//   node.link.collectives.<op> / network.collectives.<op>  {"latency_us", "bandwidth_gbps"}
//       alpha and beta of <op> fitted to its measured times over message sizes,
//       and optionally those times: "ranks", "bytes": [..], "us": [..], and "groups": [{"ranks",
//       "bytes", "us"}, ..] the same in groups of fewer ranks, every group at once.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"

namespace ss {

// A collective's measured times at `ranks` ranks: seconds per message of
// `bytes` (increasing).
struct CollectiveTimes {
  int ranks = 0;
  std::vector<double> bytes, seconds;
  // Log-log between the measured sizes, the last segment's slope beyond the
  // largest, the smallest size's time below it.
  double at(double message_bytes) const;
};

struct CollectiveFit {
  double latency = 0;    // seconds per step (alpha)
  double bandwidth = 0;  // bytes/s (beta)
  // The times the fit came from (optional), at the calibrated rank count,
  // then in groups of fewer ranks where calibrate measured those (every
  // group of the host at once, as a mesh's groups run). For a rank count
  // with times the cost model interpolates them instead: two figures fitted
  // over 64 B - 16 MiB miss the middle (a 1.5 MB broadcast on 4 ranks: 250
  // us fitted, 500 measured).
  std::vector<CollectiveTimes> times;
  const CollectiveTimes* times_for(int ranks) const {
    for (const CollectiveTimes& t : times)
      if (t.ranks == ranks && !t.seconds.empty()) return &t;
    return nullptr;
  }
};

struct LinkProfile {
  std::string name;
  double bandwidth = 0;  // bytes/s a rank achieves per direction in a ring
  double latency = 0;    // seconds per message (alpha)
  std::map<std::string, CollectiveFit> collectives;  // measured per collective (optional)
};

// Measured seconds on a grid of (x, y): bilinear between grid points (exact
// for t = a + b x + c y + d x y), the last segment's slope (never negative)
// beyond the largest x or y, the edge value below the smallest.
struct TimeGrid {
  std::vector<double> x, y;
  std::vector<std::vector<double>> seconds;  // [x index][y index]
  bool empty() const { return x.empty(); }
  double at(double xv, double yv) const;
};

// Measured seconds of one GEMM weight shape [n, k] for several row counts m:
// linear in m between the measured counts, the last segment's slope beyond,
// the first count's time below it (one measured count: proportional to m).
struct GemmShapeTimes {
  double n = 0, k = 0;
  std::vector<double> m, seconds;
  double at(double rows) const;
};

struct AttentionTimes {
  int heads = 0, kv_heads = 0, head_dim = 0;
  TimeGrid grid;  // x: queries, y: keys
  bool empty() const { return grid.empty(); }
};

struct HardwareProfile {
  std::string name, device_name, file;
  int64_t memory_bytes = 0;
  double fp32_flops = 0;    // vector FP32, FLOP/s
  double matmul_flops = 0;  // GEMM rate for the engine's fp32 GEMMs, FLOP/s
  // Dense tensor-core (matrix) rates per dtype, FLOP/s; 0 where the profile
  // gives none (fp8: parts without it), and then matmul_rate falls back.
  double bf16_matmul_flops = 0, fp16_matmul_flops = 0, fp8_matmul_flops = 0;
  // The GEMM rate for operands in `t`: bf16/fp16 at their own rate when the
  // profile has one, else the fp32 rate.
  double matmul_rate(DType t) const;
  double memory_bandwidth = 0;  // bytes/s
  double launch = 0;            // seconds per kernel
  // The engine's own work on a rank's thread before each kernel, which a
  // kernel's measured span leaves out (model code, tensors, the recorder):
  // calibrate measures it on cpu hosts from a real run (device.host_gap);
  // 0 where the profile gives none.
  double host_gap = 0;  // seconds
  // Achieved fractions (optional in the file): fused attention and SSD scans
  // of the matmul rate, elementwise kernels of the memory bandwidth.
  double attention_efficiency = 0.5, scan_efficiency = 0.5, elementwise_efficiency = 0.8;
  double gemv_efficiency = 0.8;  // of the memory bandwidth, for GEMMs with a few rows (decode)
  // Contention between a rank's two streams (optional, measured by calibrate
  // for ranks sharing a host's cores): while a collective is in flight a
  // kernel runs 1 + compute_contention times slower, and while kernels run a
  // collective 1 + comm_contention times slower. 0: the streams are independent.
  double compute_contention = 0, comm_contention = 0;
  // How long a collective posted while the rank's kernels run waits for the
  // core before its comm thread runs (and, the other way round, how long
  // kernels woken while the comm thread still has work wait): the scheduler's
  // slice, where the two threads share a core (calibrate, device.contention.
  // hold_us). Meanwhile the collective makes no progress and the kernels run
  // unslowed; past it, the slowdowns above. 0: the comm thread runs at once.
  double contention_hold = 0;
  // The part of a core each rank gets (calibrate, for more ranks than cores:
  // its kernel times are then CPU times), measured at a few kernel lengths
  // (CPU seconds, increasing); empty: a whole core. See core_share_at.
  std::vector<double> core_share_seconds, core_share;
  // The same while a collective the rank posted is in flight beside its
  // kernels (calibrate, more ranks than cores), and how much longer than the
  // collective's time alone (cost model) the rank then waits for it, both
  // over the CPU time of the kernels between its post and the wait: the
  // collective's comm threads get the cores only as the ranks' kernels leave
  // them (sim/sim_clock.h). Empty: not measured; the contention figures
  // above then stand for it.
  std::vector<double> overlap_seconds, overlap_share;
  std::map<std::string, std::vector<double>> overlap_wait;  // per collective, seconds
  // Measured kernel times (optional, see above).
  std::map<std::string, TimeGrid> kernel_times;  // op -> grid over (rows, cols)
  std::vector<GemmShapeTimes> gemm_times;
  AttentionTimes attention_times;
  int max_devices_per_node = 8;
  LinkProfile intra, inter;
  nlohmann::json source;  // the file, for the config event
};

// The part of a core a rank gets over a segment of `cpu_seconds` of kernels
// between two waits for a collective: log-linear between the measured lengths,
// the nearest one outside them, 1 when none was measured.
double core_share_at(const HardwareProfile& hw, double cpu_seconds);
// The wall time of such a segment: cpu_seconds / core_share_at(cpu_seconds).
// A kernel that extends a segment from s to s + c takes the difference.
double segment_wall(const HardwareProfile& hw, double cpu_seconds);
// The same with a collective in flight beside the kernels (overlap_share).
double overlap_segment_wall(const HardwareProfile& hw, double cpu_seconds);
// How much longer than its own time a rank waits for a collective `op`
// posted before `cpu_seconds` of its kernels (overlap_wait), log-linear as
// above; a collective not measured takes the broadcast's figures (a tree, as
// most collectives are on a few ranks); 0 when none was measured.
double overlap_wait_at(const HardwareProfile& hw, const std::string& op, double cpu_seconds);

// A profile name in resources/hardware or a path to a JSON file. Throws
// UsageError naming the field and the reason for a malformed profile.
HardwareProfile load_hardware(const std::string& spec);
HardwareProfile parse_hardware(const nlohmann::json& j, const std::string& origin);
std::vector<std::string> hardware_names();

}  // namespace ss
