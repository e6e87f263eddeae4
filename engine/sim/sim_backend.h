// The sim backend: meta tensors through the same model, strategy and
// allocator code as cpu; every kernel advances this rank's compute clock by
// the cost model instead of running. Time is virtual: nanoseconds since the
// simulated run began.
#pragma once

#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include "sim/cost_model.h"
#include "sim/meta_backend.h"

namespace ss {

// A rank's two virtual streams. Where the profile has contention figures
// (the streams share cores, as a cpu rank's comm thread shares them with its
// kernels), each stream also keeps when it was busy, and work on one stream
// runs slower where it overlaps the other's busy intervals.
struct SimClock {
  double compute_ns = 0;
  double comm_ns = 0;

  using Intervals = std::vector<std::pair<double, double>>;  // [start, end) in ns, ordered, disjoint
  Intervals comm_busy, compute_busy;
  std::multiset<double> pending;  // arrival times of collectives not yet waited for
  // CPU seconds of kernels since this rank last stopped to wait for a
  // collective: where ranks share cores, a segment of work between two waits
  // takes segment_wall() of its length (sim/hardware.h).
  double segment_cpu = 0;

  // When `work_ns` of progress begun at `t0` ends, if it runs 1 + slowdown
  // times slower inside `busy`.
  static double stretched_end(double t0, double work_ns, const Intervals& busy, double slowdown) {
    double t = t0, left = work_ns;
    for (const auto& [a, b] : busy) {
      if (b <= t) continue;
      if (a > t) {
        const double free = std::min(a - t, left);
        t += free;
        left -= free;
        if (left <= 0) return t;
      }
      const double room = (b - t) / (1 + slowdown);  // progress possible inside [t, b)
      if (left <= room) return t + left * (1 + slowdown);
      t = b;
      left -= room;
    }
    return t + left;
  }
  // Adds [a, b), merged with the intervals it touches.
  static void add_busy(Intervals& busy, double a, double b) {
    if (!(b > a)) return;
    auto it = std::lower_bound(busy.begin(), busy.end(), std::make_pair(a, a));
    if (it != busy.begin() && std::prev(it)->second >= a) --it;
    auto last = it;
    while (last != busy.end() && last->first <= b) {
      a = std::min(a, last->first);
      b = std::max(b, last->second);
      ++last;
    }
    it = busy.erase(it, last);
    busy.insert(it, {a, b});
  }
  // Drops what no later stretch can reach: comm intervals behind the compute
  // clock, compute intervals behind the oldest collective still in flight.
  void prune() {
    auto drop = [](Intervals& busy, double before) {
      auto it = busy.begin();
      while (it != busy.end() && it->second <= before) ++it;
      busy.erase(busy.begin(), it);
    };
    drop(comm_busy, compute_ns);
    drop(compute_busy, pending.empty() ? compute_ns : *pending.begin());
  }
};

class SimBackend final : public MetaBackend {
 public:
  SimBackend(Allocator& alloc, Recorder& rec, const HardwareProfile& hw, SimClock& clock)
      : MetaBackend(alloc, rec), m_hw(hw), m_clock(clock) {}
  std::string_view kind() const override { return "sim"; }
  std::string device_name() const override { return m_hw.device_name + " (simulated)"; }

 protected:
  void execute(const char* op, double flops, double bytes, std::vector<int64_t> dims,
               const std::function<void()>&, DType dtype) override {
    const double cpu = kernel_seconds(m_hw, op, flops, bytes, dims, dtype), s0 = m_clock.segment_cpu;
    m_clock.segment_cpu += cpu;
    const double wall =
        m_hw.core_share.empty() ? cpu : std::max(cpu, segment_wall(m_hw, s0 + cpu) - segment_wall(m_hw, s0));
    const double t0 = m_clock.compute_ns, work = wall * 1e9;
    if (m_hw.compute_contention > 0 || m_hw.comm_contention > 0) {
      m_clock.prune();
      m_clock.compute_ns = SimClock::stretched_end(t0, work, m_clock.comm_busy, m_hw.compute_contention);
      if (m_hw.comm_contention > 0) SimClock::add_busy(m_clock.compute_busy, t0, m_clock.compute_ns);
    } else {
      m_clock.compute_ns += work;
    }
    recorder().span(StreamKind::Compute, op, int64_t(t0), int64_t(m_clock.compute_ns), flops, bytes, std::move(dims));
  }

 private:
  const HardwareProfile& m_hw;
  SimClock& m_clock;
};

}  // namespace ss
