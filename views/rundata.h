// RunData: everything a run's event stream said, indexed for the views.
// Fed batch by batch (live from EngineClient, or from a recorded file), it
// keeps per-rank spans, memory samples, placements and tokens, the run's
// config and metrics, and a revision number the pages poll to redraw at a
// bounded rate instead of once per event.
#pragma once

#include <QString>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "protocol/events.h"

struct RankData {
  ss::proto::Device device;
  std::vector<ss::proto::Span> spans;  // in arrival order
  std::vector<ss::proto::Mem> mem;     // in time order
  std::vector<ss::proto::Placement> placements;
  std::vector<std::pair<int64_t, int64_t>> tokens;
  std::map<std::string, double> metrics;  // per-rank metrics (peaks)
};

// Peak bytes of memory category `category` on one device: the engine's exact
// per-rank metric once the run has ended, else the highest sample so far.
double peakBytes(const RankData& d, int category);

// One device's communication: busy time (union of its comm spans), the part
// of it overlapped by its compute, and the bytes it put on the wire.
struct CommStats {
  double commNs = 0, hiddenNs = 0, bytes = 0;
  double hiddenFraction() const { return commNs > 0 ? hiddenNs / commNs : 0; }
};

class RunData {
 public:
  void clear();
  void add(const std::vector<ss::proto::Event>& events);
  // The same, taking the events over (no copy of spans and samples).
  void add(std::vector<ss::proto::Event>&& events);

  const nlohmann::json& config() const { return m_config; }
  const std::map<int, RankData>& ranks() const { return m_ranks; }
  const std::map<std::string, double>& metrics() const { return m_metrics; }
  const std::vector<ss::proto::Error>& errors() const { return m_errors; }
  const std::vector<ss::proto::Accuracy>& accuracy() const { return m_accuracy; }
  const std::vector<ss::proto::Generation>& generations() const { return m_generations; }
  const std::optional<ss::proto::Prompt>& prompt() const { return m_prompt; }
  // Where each phase (load, prefill, decode) began, on the run's clock.
  const std::vector<ss::proto::Phase>& phases() const { return m_phases; }
  // A training run's steps, in order.
  const std::vector<ss::proto::TrainStep>& trainSteps() const { return m_trainSteps; }
  // A scaling sweep's points, in the order they finished.
  const std::vector<ss::proto::ScalePoint>& scalePoints() const { return m_scalePoints; }
  QString status() const { return m_status; }
  int64_t end_time() const { return m_end; }  // the latest timestamp seen (ns)
  uint64_t revision() const { return m_revision; }
  int64_t events() const { return m_events; }
  // Layers that hold weights, in order (-1: embeddings and head).
  std::vector<int> layers() const;
  // Per rank, computed once per revision (the summary, the timeline and the
  // comparison all read it).
  const std::map<int, CommStats>& commStats() const;

 private:
  template <class Events>
  void addAll(Events&& events);
  nlohmann::json m_config = nlohmann::json::object();
  std::map<int, RankData> m_ranks;
  std::map<std::string, double> m_metrics;
  std::vector<ss::proto::Error> m_errors;
  std::vector<ss::proto::Accuracy> m_accuracy;
  std::vector<ss::proto::Generation> m_generations;
  std::optional<ss::proto::Prompt> m_prompt;
  std::vector<ss::proto::Phase> m_phases;
  std::vector<ss::proto::TrainStep> m_trainSteps;
  std::vector<ss::proto::ScalePoint> m_scalePoints;
  QString m_status;
  int64_t m_end = 0;
  uint64_t m_revision = 0;
  int64_t m_events = 0;
  mutable std::map<int, CommStats> m_comm;
  mutable uint64_t m_commRevision = ~0ull;
};
