// What the parts of `calibrate` (calibrate.cpp, calibrate_collectives.cpp,
// calibrate_rank.cpp) share: medians, the cache sizes, the sweep of a core's
// private caches, and the collective measurement calibrate_machine runs.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>
#include <vector>

#include "runtime/calibrate.h"
#include "sim/hardware.h"

namespace ss {

// The collectives calibrate times, each over message sizes (calibrate_collectives.cpp).
inline constexpr std::array<const char*, 6> kTimedCollectives = {"all_reduce", "all_gather", "reduce_scatter",
                                                                 "broadcast",  "all_to_all", "sendrecv"};

// The median (the mean of the middle two for an even count); 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Microseconds with 2 decimals, from seconds: how a profile stores a time.
inline double round_us(double seconds) {
  return std::round(seconds * 1e8) / 100;
}

// The last-level cache of this host, for sizing buffers that must not fit in it.
int64_t l3_bytes();

// In a model a small kernel (or a collective) follows a GEMM that has streamed
// its weights through the core's private caches. Before each timed call of the
// kernel grids and of the collectives, reading a buffer of twice the core's L2
// (untimed) does the same.
class CacheSweep {
 public:
  CacheSweep() {
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (l2 <= 0) l2 = 1 << 20;
    m_buf.assign(size_t(2 * l2 / 4), 1.0f);
  }
  void operator()() { read(m_buf.data(), m_buf.size()); }
  // Reads `n` floats from `p` (untimed), as a kernel that uses them does.
  void read(const float* p, size_t n) {
    float acc[8] = {};
    const size_t whole = n / 8 * 8;
    for (size_t i = 0; i < whole; i += 8)
      for (int j = 0; j < 8; ++j) acc[j] += p[i + size_t(j)];
    float sum = 0;
    for (float v : acc) sum += v;
    m_sink = sum;
  }

 private:
  std::vector<float> m_buf;
  volatile float m_sink = 0;
};

// The collectives between `ranks` ranks of this host, measured by
// collective_timing_rank in processes of their own (options.quick: 4 sizes,
// up to 20 calls each, else 6 sizes, up to 100; fewer for messages of 1 MiB
// and up; and each collective's options.message_sizes besides): the
// profile's link.collectives, each with its times
// over message sizes and alpha-beta fitted to them (empty when no measurement
// came back), and the same as the simulator reads them in `measured`.
nlohmann::json measure_collectives(std::ostream& log, int ranks, const CalibrateOptions& options, LinkProfile& measured);

}  // namespace ss
