#include "rundata.h"

#include "protocol/analysis.h"

#include <set>

double peakBytes(const RankData& d, int category) {
  auto it = d.metrics.find(std::string("peak_") + ss::proto::kCategoryNames[category] + "_bytes");
  if (it != d.metrics.end()) return it->second;
  double peak = 0;
  for (auto& m : d.mem) peak = std::max(peak, double(m.bytes[size_t(category)]));
  return peak;
}

void RunData::clear() {
  const uint64_t revision = m_revision;  // only ever grows: a page that drew revision r must see a change
  *this = RunData();
  m_revision = revision + 1;
}

void RunData::add(const std::vector<ss::proto::Event>& events) { addAll(events); }
void RunData::add(std::vector<ss::proto::Event>&& events) { addAll(std::move(events)); }

template <class Events>
void RunData::addAll(Events&& events) {
  using namespace ss::proto;
  // A const vector is copied from, an rvalue one moved from.
  constexpr bool kMove = !std::is_const_v<std::remove_reference_t<Events>> && std::is_rvalue_reference_v<Events&&>;
  for (auto& e : events) {
    ++m_events;
    std::visit(
        [&](auto& ev) {
          using T = std::decay_t<decltype(ev)>;
          if constexpr (std::is_same_v<T, Config>) m_config = ev.config;
          else if constexpr (std::is_same_v<T, Device>) m_ranks[ev.rank].device = ev;
          else if constexpr (std::is_same_v<T, Span>) {
            m_end = std::max(m_end, ev.t1);
            if constexpr (kMove) m_ranks[ev.rank].spans.push_back(std::move(ev));
            else m_ranks[ev.rank].spans.push_back(ev);
          } else if constexpr (std::is_same_v<T, Mem>) {
            m_end = std::max(m_end, ev.t);
            if constexpr (kMove) m_ranks[ev.rank].mem.push_back(std::move(ev));
            else m_ranks[ev.rank].mem.push_back(ev);
          } else if constexpr (std::is_same_v<T, Placement>) m_ranks[ev.rank].placements.push_back(ev);
          else if constexpr (std::is_same_v<T, Tokens>) m_ranks[ev.rank].tokens = ev.ranges;
          else if constexpr (std::is_same_v<T, Metric>) {
            if (ev.rank >= 0) m_ranks[ev.rank].metrics[ev.name] = ev.value;
            else m_metrics[ev.name] = ev.value;
          } else if constexpr (std::is_same_v<T, Error>) m_errors.push_back(ev);
          else if constexpr (std::is_same_v<T, Accuracy>) m_accuracy.push_back(ev);
          else if constexpr (std::is_same_v<T, Generation>) {
            // A run's answer grows a record at a time: the latest of a configuration replaces the one before.
            if (!m_generations.empty() && m_generations.back().config == ev.config && m_generations.back().partial)
              m_generations.back() = ev;
            else m_generations.push_back(ev);
          } else if constexpr (std::is_same_v<T, Prompt>) m_prompt = ev;
          else if constexpr (std::is_same_v<T, Phase>) m_phases.push_back(ev);
          else if constexpr (std::is_same_v<T, TrainStep>) m_trainSteps.push_back(ev);
          else if constexpr (std::is_same_v<T, ScalePoint>) m_scalePoints.push_back(ev);
          else if constexpr (std::is_same_v<T, Done>) m_status = QString::fromStdString(ev.status);
        },
        e);
  }
  ++m_revision;
}

std::vector<int> RunData::layers() const {
  std::set<int> s;
  for (auto& [r, d] : m_ranks)
    for (auto& p : d.placements) s.insert(p.layer);
  return {s.begin(), s.end()};
}

const std::map<int, CommStats>& RunData::commStats() const {
  if (m_commRevision == m_revision) return m_comm;
  m_commRevision = m_revision;
  m_comm.clear();
  for (auto& [rank, d] : m_ranks) {
    std::vector<std::pair<int64_t, int64_t>> compute, comm;
    CommStats st;
    for (const auto& s : d.spans) {
      if (s.stream == "comm") {
        comm.emplace_back(s.t0, s.t1);
        st.bytes += s.bytes;
      } else {
        compute.emplace_back(s.t0, s.t1);
      }
    }
    st.commNs = ss::proto::union_ns(comm);
    st.hiddenNs = ss::proto::overlap_ns(std::move(compute), std::move(comm));
    m_comm[rank] = st;
  }
  return m_comm;
}
