// A simulated rank's two virtual streams, compute and comm, and how they share
// the rank's core where a profile says they do (device.contention).
//
// On a cpu rank the comm stream is a thread beside the kernels' thread on the
// same core. Measured on such a host (tsp on 2 ranks, kernels of 0.1-1 ms): a
// collective posted while kernels run starts when they stop to wait, not
// beside them, and kernels woken while the comm thread still has work start
// when it is done: the thread that holds the core keeps it for about one
// scheduler slice. Only past that do the two share the core, each slower
// (prefill's GEMMs of tens of ms, beside which a ring step started 2.7-3.1 ms
// after it was posted). So, per rank:
//   - a collective's comm thread gets the core when the rank's kernels stop
//     to wait, or `hold` after it was posted if they run on; a collective
//     posted while the comm thread still has earlier ones follows them;
//   - before then it makes no progress and the kernels run at full speed;
//     after, kernels run 1 + compute_contention times slower while the comm
//     thread holds collectives (waiting for peers included), and collectives
//     progress 1 + comm_contention times slower while kernels run;
//   - a wait that blocks ends at the collective's end; where the comm thread
//     then has later collectives to run, kernels resume when those are done,
//     or `hold` later.
// With hold 0 this is the streams' plain overlap with those slowdowns.
//
// Where a host has more ranks than cores and calibrate measured its overlap
// steps (sim/hardware.h), those replace the figures above: every thread of
// every rank then shares the same few cores, and a collective's comm threads
// get them only as the ranks' kernels leave them. Measured (4 ranks on 2
// cores, a broadcast posted before a GEMM and waited for after it, as tsp
// does): the broadcast made no progress beside the GEMMs, and the wait after
// them lasted the broadcast's own time plus up to 2 ms, more the longer the
// GEMMs; the GEMMs themselves ran at a larger share of a core than between
// blocking collectives (the waiting ranks leave theirs). So a collective
// posted before kernels begins when the rank waits for it (or at its last
// participant's arrival, or when the comm thread is done with earlier ones)
// and ends its time alone plus overlap_wait_at(those kernels' CPU time)
// later; kernels with a collective in flight take overlap_segment_wall.
// All of it is the rank's own view: the collective's span in the event
// stream, and the comm clock that orders the rank's next post, keep the
// collective's time alone from its start (sim_comm.cpp), and a peer's end of
// the same collective comes from the peer's own clock.
#pragma once

#include <deque>
#include <memory>
#include <utility>
#include <vector>

namespace ss {

struct HardwareProfile;

struct SimClock {
  double compute_ns = 0;
  double comm_ns = 0;
  // CPU seconds of kernels since this rank last stopped to wait for a
  // collective: where ranks share cores, a segment of work between two waits
  // takes segment_wall() of its length (sim/hardware.h).
  double segment_cpu = 0;

  // The contention figures (HardwareProfile), hold in ns. With all three 0
  // the streams are independent and none of the bookkeeping below runs.
  double compute_slowdown = 0, comm_slowdown = 0, hold_ns = 0;
  bool shares_core() const { return compute_slowdown > 0 || comm_slowdown > 0 || hold_ns > 0; }
  // The profile when its overlap steps apply (see above), else null.
  const HardwareProfile* oversubscribed = nullptr;
  // CPU seconds of all kernels so far (the backend adds them).
  double cpu_total = 0;
  // Collectives posted and not yet waited for or dropped.
  int in_flight() const { return m_in_flight; }

  using Intervals = std::vector<std::pair<double, double>>;  // [start, end) in ns, ordered, disjoint

  // A collective this rank posted: its post, its start (the last
  // participant's arrival; untimed, its own) and its time alone, in ns.
  struct Op {
    double posted = 0, start = 0, work = 0;
    double claim = -1;  // when the comm thread got the core for it; < 0: not known yet
    double end = -1;    // < 0: not resolved yet
    bool waited = false;
    bool settled = false;     // waited for or dropped: no longer in flight
    double cpu_at_post = 0;   // cpu_total when it was posted
    const char* kind = "";    // the collective ("broadcast", ...)
  };
  using OpPtr = std::shared_ptr<Op>;

  // Kernel time: `work_ns` of a kernel that starts at compute_ns; returns its end.
  double kernel(double work_ns);
  // A collective `kind` posted now (compute_ns), starting at `start`, taking `work` alone.
  OpPtr post(double start, double work, const char* kind = "");
  // The rank waits for `op` now: compute_ns moves to its end when that is
  // later (and on past any hold, see above).
  void wait(const OpPtr& op);
  // Whether `op` has ended by compute_ns.
  bool done(const OpPtr& op);
  // A request dropped without a wait: it still runs on the comm thread.
  void drop(const OpPtr& op) {
    op->waited = true;
    settle(*op);
  }

  // When `work_ns` of progress begun at `t0` ends, if it runs 1 + slowdown
  // times slower inside `busy`.
  static double stretched_end(double t0, double work_ns, const Intervals& busy, double slowdown);
  // Adds [a, b), merged with the intervals it touches.
  static void add_busy(Intervals& busy, double a, double b);

 private:
  // Ends of the ops up to and including `last` (FIFO on the comm thread),
  // taking a claim not yet known as min(posted + hold, now); stores them when
  // `store`. Returns last's end.
  double resolve(const Op* last, double now, bool store);
  // When the comm thread gets the core for `op`: at once if it is still busy
  // with earlier ones (`prev`, their end), else its claim, or as `unknown`.
  double claim_of(const Op& op, double prev, double unknown) const {
    return prev > op.posted ? prev : op.claim >= 0 ? op.claim : unknown;
  }
  // Where the comm thread holds the core (collectives posted, claimed, not
  // yet ended by their estimate alone): what slows kernels. Cached until the
  // ops change.
  const Intervals& comm_busy();
  void prune();
  void settle(Op& op) {
    if (!op.settled) op.settled = true, --m_in_flight;
  }
  // An op's end on an oversubscribed host (see above), waited for now.
  double oversubscribed_end(const Op& op) const;

  int m_in_flight = 0;
  double m_cpu_at_block = 0;  // cpu_total when the rank last stopped to wait
  double m_comm_free = 0;     // oversubscribed: when the comm thread is done with the ops waited for so far
  std::deque<OpPtr> m_ops;   // posted and not yet resolved-and-waited, in posting order
  Intervals m_compute_busy;  // kernels since the oldest op in m_ops was posted
  double m_last_end = 0;     // the end of the last op that left m_ops
  Intervals m_busy;          // comm_busy(), valid unless m_busy_stale
  bool m_busy_stale = true;
};

}  // namespace ss
