// The span and memory recorder of one rank. Backends record a span per kernel
// or collective on the rank's compute or comm stream, tagged with the phase,
// layer and site the model code is in; the allocator's changes become memory
// samples. The runner drains both at step boundaries into the event stream.
#pragma once

#include <chrono>
#include <functional>
#include <mutex>
#include <cstdint>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "protocol/events.h"

namespace ss {

enum class StreamKind { Compute, Comm };

class Recorder {
 public:
  explicit Recorder(int rank = 0);

  int rank() const { return m_rank; }
  void set_rank(int rank) { m_rank = rank; }
  // Nanoseconds since the run's origin on the host's steady clock.
  int64_t now() const;
  void set_origin(std::chrono::steady_clock::time_point t) { m_origin = t; }
  // A virtual clock (the simulator's) instead of the host's.
  void set_clock(std::function<int64_t()> clock) { m_clock = std::move(clock); }
  std::chrono::steady_clock::time_point origin() const { return m_origin; }

  void set_phase(std::string phase) { m_phase = std::move(phase); }
  const std::string& phase() const { return m_phase; }
  void set_layer(int layer) { m_layer = layer; }
  int layer() const { return m_layer; }
  void set_site(std::string site) { m_site = std::move(site); }
  const std::string& site() const { return m_site; }

  void span(StreamKind stream, const char* op, int64_t t0, int64_t t1, double flops, double bytes,
            std::vector<int64_t> dims = {}, std::vector<int> peers = {});
  // Where in the model a span belongs: captured when work is issued, because
  // a comm op runs on its own thread while the compute thread moves on.
  struct Tag {
    int layer = -1;
    std::string site;
    std::string phase;
  };
  Tag tag() const { return {m_layer, m_site, m_phase}; }
  // span() with an explicit tag instead of the current layer, site and phase.
  void span_at(const Tag& tag, StreamKind stream, const char* op, int64_t t0, int64_t t1,
               double flops, double bytes, std::vector<int64_t> dims = {},
               std::vector<int> peers = {});
  void mem_sample(int64_t t, const MemState& m);
  // Turns sampling on and off (off while weights load, to keep streams small).
  void set_mem_sampling(bool on) { m_sample_mem = on; }
  // Turns span recording off (a run whose timeline nobody reads: a scaling sweep's batch search).
  void set_span_recording(bool on) { m_record_spans = on; }
  bool span_recording() const { return m_record_spans; }
  // Called by take_spans() first: a backend whose spans are measured after
  // the fact (cuda: events resolved in batches) records what it has.
  void set_flush(std::function<void()> flush) { m_flush = std::move(flush); }

  // Thread-safe: compute and comm streams record concurrently. Take the
  // records with take_*() at step boundaries.
  std::vector<proto::Span> take_spans();
  std::vector<proto::Mem> take_mem_samples();
  void clear();

 private:
  int m_rank;
  std::chrono::steady_clock::time_point m_origin;
  std::string m_phase = "load";
  std::string m_site;
  int m_layer = -1;
  bool m_sample_mem = true;
  bool m_record_spans = true;
  std::mutex m_mutex;
  std::function<int64_t()> m_clock;
  std::function<void()> m_flush;
  std::vector<proto::Span> m_spans;
  std::vector<proto::Mem> m_mem;
};

// Sets the layer and site label for the kernels issued in a scope.
class SiteScope {
 public:
  SiteScope(Recorder& rec, int layer, std::string site)
      : m_rec(rec), m_layer(rec.layer()), m_site(rec.site()) {
    rec.set_layer(layer);
    rec.set_site(std::move(site));
  }
  ~SiteScope() {
    m_rec.set_layer(m_layer);
    m_rec.set_site(std::move(m_site));
  }
  SiteScope(const SiteScope&) = delete;
  SiteScope& operator=(const SiteScope&) = delete;

 private:
  Recorder& m_rec;
  int m_layer;
  std::string m_site;
};

}  // namespace ss
