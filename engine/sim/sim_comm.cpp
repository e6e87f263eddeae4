#include "sim/sim_comm.h"

#include <algorithm>
#include <stdexcept>
#include <string_view>

#include "sim/cost_model.h"

namespace ss {
namespace {

// A collective's completion on this rank: its end and the waits are the
// rank's clock's to work out (sim/sim_clock.h).
class SimRequest final : public CommRequest {
 public:
  SimRequest(SimClock& clock, SimClock::OpPtr op) : m_clock(clock), m_op(std::move(op)) {}
  ~SimRequest() override {
    if (!m_op->waited) m_clock.drop(m_op);
  }
  void wait() override { m_clock.wait(m_op); }
  bool done() override { return m_clock.done(m_op); }

 private:
  SimClock& m_clock;
  SimClock::OpPtr m_op;
};

uint64_t mix(uint64_t a, uint64_t b) {
  a ^= b + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2);
  return a * 0xbf58476d1ce4e5b9ull;
}

}  // namespace

const LinkProfile& SimNetwork::link_for(const std::vector<int>& members) const {
  for (int m : members)
    if (node_of(m) != node_of(members.front())) return m_hw.inter;
  return m_hw.intra;
}

std::vector<SimNetwork::Deposit> SimNetwork::exchange(uint64_t comm, uint64_t seq, int n, int index, Deposit mine,
                                                      Receive receive) {
  std::unique_lock lock(m_mutex);
  if (m_aborted) throw std::runtime_error("the simulated run was aborted by another rank");
  Slot& s = m_slots[{comm, seq}];
  if (s.deposits.empty()) s.deposits.resize(size_t(n));
  s.deposits[size_t(index)] = std::move(mine);
  if (++s.arrived == n) s.cv.notify_all();
  else s.cv.wait(lock, [&] { return s.arrived == n || m_aborted; });
  if (s.arrived != n) throw std::runtime_error("the simulated run was aborted by another rank");
  std::vector<Deposit> out;
  const bool last = ++s.departed == n;
  // Every deposit is in (all arrived), and no one else reads them where one takes them.
  if (receive == Receive::Take || (receive == Receive::Copy && last)) out = std::move(s.deposits);
  else if (receive == Receive::Copy) out = s.deposits;
  if (last) m_slots.erase({comm, seq});
  return out;
}

void SimNetwork::abort() {
  std::lock_guard lock(m_mutex);
  m_aborted = true;
  for (auto& [key, slot] : m_slots) slot.cv.notify_all();
}

SimCommunicator::SimCommunicator(SimNetwork& net, uint64_t id, std::vector<int> members, int world_rank,
                                 Recorder& rec, SimClock& clock, std::string name)
    : m_net(net), m_id(id), m_members(std::move(members)), m_world_rank(world_rank), m_rec(rec), m_clock(clock),
      m_name(std::move(name)) {
  m_rank = int(std::find(m_members.begin(), m_members.end(), world_rank) - m_members.begin());
}

std::vector<int> SimCommunicator::others() const {
  std::vector<int> o;
  for (int m : m_members)
    if (m != m_world_rank) o.push_back(m);
  return o;
}

Request SimCommunicator::timed(const char* op, double payload, std::vector<int64_t> dims, std::vector<int> peers) {
  const double arrive = std::max(m_clock.compute_ns, m_clock.comm_ns);
  double start = arrive;
  if (m_net.timed())  // the collective starts when its last member arrives
    for (auto& d : m_net.exchange(m_id, m_seq++, size(), m_rank, {arrive, {}})) start = std::max(start, d.time);
  const CollectiveCost cost = collective_seconds(m_net.link_for(m_members), op, payload, size());
  const double end = start + cost.seconds * 1e9;
  m_clock.comm_ns = end;
  // The span opens when this rank arrives, as a real blocking call's would:
  // waiting for the last participant is part of what a rank sees.
  // The receiving side of a send puts nothing on the wire: recorded as the
  // real communicators record it, so both streams agree on all but times.
  const double wire = std::string_view(op) == "recv" ? 0.0 : wire_bytes(op, payload, size());
  m_rec.span(StreamKind::Comm, op, int64_t(arrive), int64_t(end), 0, wire, std::move(dims), std::move(peers));
  return std::make_shared<SimRequest>(m_clock, m_clock.post(start, end - start, op));
}

Request SimCommunicator::iall_reduce(const Tensor& buf) {
  return timed("all_reduce", double(buf.nbytes()), {buf.numel()}, others());
}
Request SimCommunicator::iall_gather(const Tensor& out, const Tensor&) {
  return timed("all_gather", double(out.nbytes()), {out.numel()}, others());
}
Request SimCommunicator::ibroadcast(const Tensor& buf, int) {
  // Peers are all other members on every rank, root or not, as the real
  // communicators record a broadcast.
  return timed("broadcast", double(buf.nbytes()), {buf.numel()}, others());
}
Request SimCommunicator::isendrecv(const Tensor& send, int dst, const Tensor&, int src) {
  // Ring steps run on every member at once: time them as one group operation.
  return timed("sendrecv", double(send.nbytes()), {send.numel()}, {m_members[size_t(dst)], m_members[size_t(src)]});
}
void SimCommunicator::reduce_scatter(const Tensor&, const Tensor& in) {
  timed("reduce_scatter", double(in.nbytes()), {in.numel()}, others())->wait();
}
void SimCommunicator::all_to_all(const Tensor& out, const Tensor&) {
  timed("all_to_all", double(out.nbytes()), {out.numel()}, others())->wait();
}
void SimCommunicator::send(const Tensor& buf, int dst) {
  timed("send", double(buf.nbytes()), {buf.numel()}, {m_members[size_t(dst)]})->wait();
}
void SimCommunicator::recv(const Tensor& buf, int src) {
  timed("recv", double(buf.nbytes()), {buf.numel()}, {m_members[size_t(src)]})->wait();
}
void SimCommunicator::barrier() { timed("barrier", 0, {}, others())->wait(); }

std::vector<std::string> SimCommunicator::gather_blobs(const std::string& blob, int root) {
  auto all = m_net.exchange(m_id, m_seq++, size(), m_rank, {0, blob},
                            m_rank == root ? SimNetwork::Receive::Take : SimNetwork::Receive::Nothing);
  std::vector<std::string> out;
  if (m_rank == root)
    for (auto& d : all) out.push_back(std::move(d.payload));
  return out;
}

std::unique_ptr<Communicator> SimCommunicator::split(int color, int key, const std::string& name) {
  const uint64_t seq = m_seq++;
  const std::string mine = std::to_string(color) + " " + std::to_string(key) + " " + std::to_string(m_world_rank);
  auto all = m_net.exchange(m_id, seq, size(), m_rank, {0, mine});
  std::vector<std::pair<int, int>> group;  // (key, world rank) of the same color
  for (auto& d : all) {
    int c, k, w;
    std::sscanf(d.payload.c_str(), "%d %d %d", &c, &k, &w);
    if (c == color) group.emplace_back(k, w);
  }
  std::sort(group.begin(), group.end());
  std::vector<int> members;
  for (auto& [k, w] : group) members.push_back(w);
  return std::make_unique<SimCommunicator>(m_net, mix(mix(m_id, seq), uint64_t(color)), std::move(members),
                                           m_world_rank, m_rec, m_clock, name);
}

}  // namespace ss
