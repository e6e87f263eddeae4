// The sim backend: meta tensors through the same model, strategy and
// allocator code as cpu; every kernel advances this rank's compute clock by
// the cost model instead of running. Time is virtual: nanoseconds since the
// simulated run began.
#pragma once

#include <vector>

#include "sim/cost_model.h"
#include "sim/meta_backend.h"
#include "sim/sim_clock.h"

namespace ss {

class SimBackend final : public MetaBackend {
 public:
  SimBackend(Allocator& alloc, Recorder& rec, const HardwareProfile& hw, SimClock& clock)
      : MetaBackend(alloc, rec), m_hw(hw), m_clock(clock) {}
  std::string_view kind() const override { return "sim"; }
  std::string device_name() const override { return m_hw.device_name + " (simulated)"; }

 protected:
  void execute(const char* op, double flops, double bytes, std::vector<int64_t> dims,
               const std::function<void()>&, DType dtype) override {
    // The engine's own work before the kernel (hardware.h) takes the core
    // as the kernel does; the kernel's span starts after it.
    const double cpu = m_hw.host_gap + kernel_seconds(m_hw, op, flops, bytes, dims, dtype, attention_runs());
    const double s0 = m_clock.segment_cpu;
    m_clock.segment_cpu += cpu;
    m_clock.cpu_total += cpu;
    // More ranks than cores: the part of a core a rank gets depends on
    // whether a collective it posted is in flight beside (sim/sim_clock.h).
    auto wall_of = m_clock.oversubscribed && m_clock.in_flight() > 0 ? overlap_segment_wall : segment_wall;
    const double wall = m_hw.core_share.empty() && !m_clock.oversubscribed
                            ? cpu
                            : std::max(cpu, wall_of(m_hw, s0 + cpu) - wall_of(m_hw, s0));
    const double t0 = m_clock.compute_ns + (cpu > 0 ? wall * 1e9 * m_hw.host_gap / cpu : 0.0);
    m_clock.kernel(wall * 1e9);
    recorder().span(StreamKind::Compute, op, int64_t(t0), int64_t(m_clock.compute_ns), flops, bytes, std::move(dims));
  }

 private:
  const HardwareProfile& m_hw;
  SimClock& m_clock;
};

}  // namespace ss
