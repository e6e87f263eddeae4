#include "sim/sim_clock.h"

#include <algorithm>

#include "sim/hardware.h"

namespace ss {

double SimClock::stretched_end(double t0, double work_ns, const Intervals& busy, double slowdown) {
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

void SimClock::add_busy(Intervals& busy, double a, double b) {
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

double SimClock::kernel(double work_ns) {
  const double t0 = compute_ns;
  if (!shares_core()) return compute_ns += work_ns;
  prune();
  compute_ns = compute_slowdown > 0 ? stretched_end(t0, work_ns, comm_busy(), compute_slowdown) : t0 + work_ns;
  if (!m_ops.empty()) add_busy(m_compute_busy, t0, compute_ns);
  return compute_ns;
}

SimClock::OpPtr SimClock::post(double start, double work, const char* kind) {
  auto op = std::make_shared<Op>();
  op->posted = compute_ns;
  op->start = start;
  op->work = work;
  op->cpu_at_post = cpu_total;
  op->kind = kind;
  ++m_in_flight;
  if (!shares_core()) {
    op->end = start + work;
    return op;
  }
  m_ops.push_back(op);
  m_busy_stale = true;
  return op;
}

double SimClock::resolve(const Op* last, double now, bool store) {
  double prev = m_last_end;
  for (const OpPtr& p : m_ops) {
    Op& op = *p;
    double end = op.end;
    if (end < 0) {
      const double claim = claim_of(op, prev, std::min(op.posted + hold_ns, now));
      const double from = std::max({claim, prev, op.posted, op.start});
      end = comm_slowdown > 0 ? stretched_end(from, op.work, m_compute_busy, comm_slowdown) : from + op.work;
      if (store) {
        op.end = end;
        m_busy_stale = true;
      }
    }
    prev = end;
    if (&op == last) break;
  }
  return prev;
}

double SimClock::oversubscribed_end(const Op& op) const {
  // CPU time of the kernels run beside it since it was posted and since the
  // rank last stopped to wait (a wait already paid for those).
  const double beside = cpu_total - std::max(op.cpu_at_post, m_cpu_at_block);
  double begin = std::max(op.start, m_comm_free);
  if (!(beside > 0)) return begin + op.work;
  begin = std::max(begin, compute_ns);
  return begin + op.work + overlap_wait_at(*oversubscribed, op.kind, beside) * 1e9;
}

void SimClock::wait(const OpPtr& op) {
  if (!shares_core()) {
    if (oversubscribed && !op->settled) op->end = oversubscribed_end(*op);
    settle(*op);
    if (op->end > compute_ns) {
      segment_cpu = 0;  // the rank stops here: its core goes to others
      m_cpu_at_block = cpu_total;
    }
    if (oversubscribed) m_comm_free = std::max(m_comm_free, op->end);
    compute_ns = std::max(compute_ns, op->end);
    comm_ns = std::max(comm_ns, op->end);
    return;
  }
  settle(*op);
  const double now = compute_ns, end = op->end >= 0 ? op->end : resolve(op.get(), now, true);
  op->waited = true;
  if (end > now) {
    segment_cpu = 0;
    // The rank blocks: its comm thread has the core from now on for every
    // collective it still holds.
    for (const OpPtr& p : m_ops)
      if (p->end < 0 && p->claim < 0) p->claim = std::min(p->posted + hold_ns, now);
    m_busy_stale = true;
    compute_ns = end;
    // Collectives the comm thread runs on after this one keep the core until
    // they are done, or a slice later.
    if (hold_ns > 0) {
      auto it = std::find(m_ops.begin(), m_ops.end(), op);
      if (it != m_ops.end() && ++it != m_ops.end()) {
        double chain = end;
        for (; it != m_ops.end(); ++it) chain = std::max(chain, (*it)->start) + (*it)->work;
        compute_ns = std::min(end + hold_ns, chain);
      }
    }
  }
  comm_ns = std::max(comm_ns, end);
  while (!m_ops.empty() && m_ops.front()->waited && m_ops.front()->end >= 0) {
    m_last_end = std::max(m_last_end, m_ops.front()->end);
    m_ops.pop_front();
    m_busy_stale = true;
  }
}

bool SimClock::done(const OpPtr& op) {
  if (oversubscribed && !op->settled) return compute_ns >= oversubscribed_end(*op);
  if (!shares_core() || op->end >= 0) return compute_ns >= op->end;
  return compute_ns >= resolve(op.get(), compute_ns, false);
}

const SimClock::Intervals& SimClock::comm_busy() {
  if (!m_busy_stale) return m_busy;
  m_busy.clear();
  double prev = m_last_end;
  for (const OpPtr& p : m_ops) {
    const Op& op = *p;
    const double begin = std::max({claim_of(op, prev, op.posted + hold_ns), prev, op.posted});
    const double end = op.end >= 0 ? op.end : std::max(begin, op.start) + op.work;
    add_busy(m_busy, begin, end);
    prev = std::max(prev, end);
  }
  m_busy_stale = false;
  return m_busy;
}

void SimClock::prune() {
  // Kernels before the oldest collective still held can slow none of them.
  const double before = m_ops.empty() ? compute_ns : m_ops.front()->posted;
  auto it = m_compute_busy.begin();
  while (it != m_compute_busy.end() && it->second <= before) ++it;
  m_compute_busy.erase(m_compute_busy.begin(), it);
}

}  // namespace ss
