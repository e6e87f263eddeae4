// The simulated network: ranks are threads of one process. A collective is a
// rendezvous: it starts when its last participant arrives (each arrives at
// max(its compute clock, its comm clock)), takes the alpha-beta time of its
// algorithm over the link class it crosses (inside a node or between nodes),
// and ends on every participant's comm stream at once. Blocking calls then
// advance the caller's compute clock to the end; the i* forms leave that to
// Request::wait(), so overlap falls out of the strategy code's own schedule.
// An untimed network (peaks only) holds no rendezvous: each rank's
// collective starts at its own arrival.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "comm/communicator.h"
#include "sim/hardware.h"
#include "sim/sim_backend.h"

namespace ss {

class SimNetwork {
 public:
  // Untimed (not `timed`), a collective does not wait for its other members:
  // every rank runs on alone, and only data (gather_blobs, split) meets.
  SimNetwork(const HardwareProfile& hw, int world, int devices_per_node, bool timed = true)
      : m_hw(hw), m_world(world), m_per_node(devices_per_node), m_timed(timed) {}
  bool timed() const { return m_timed; }

  const HardwareProfile& hardware() const { return m_hw; }
  int world() const { return m_world; }
  int node_of(int rank) const { return rank / m_per_node; }
  // The link class a group's traffic crosses: inside one node, or the network.
  const LinkProfile& link_for(const std::vector<int>& members) const;

  struct Deposit {
    double time = 0;
    std::string payload;
  };
  // What a participant gets back from an exchange: a copy of every deposit
  // (the last one out takes them instead), nothing (a gather's senders:
  // copying every rank's blob to every rank made a 128K tsp training step on
  // 8 ranks fault in 280 MB), or every deposit taken, by the one participant
  // that receives (a gather's root: copying them was a fifth of the page
  // faults of a simulated llama2-7b tsp prefill on 8 ranks).
  enum class Receive { Copy, Nothing, Take };
  // Blocks until all `n` participants of (comm, seq) have deposited; returns
  // the deposits in group-rank order, as `receive` says. Throws once the run
  // is aborted.
  std::vector<Deposit> exchange(uint64_t comm, uint64_t seq, int n, int index, Deposit mine,
                                Receive receive = Receive::Copy);
  // Wakes every waiting rank with an error (a rank failed).
  void abort();

 private:
  // One rendezvous. Its own condition variable wakes only its participants
  // (a map node never moves while ranks wait on it).
  struct Slot {
    int arrived = 0, departed = 0;
    std::vector<Deposit> deposits;
    std::condition_variable cv;
  };
  const HardwareProfile& m_hw;
  int m_world, m_per_node;
  bool m_timed;
  std::mutex m_mutex;
  std::map<std::pair<uint64_t, uint64_t>, Slot> m_slots;
  bool m_aborted = false;
};

class SimCommunicator final : public Communicator {
 public:
  SimCommunicator(SimNetwork& net, uint64_t id, std::vector<int> members, int world_rank, Recorder& rec,
                  SimClock& clock, std::string name);

  int rank() const override { return m_rank; }
  int size() const override { return int(m_members.size()); }
  const std::string& name() const override { return m_name; }
  const std::vector<int>& members() const override { return m_members; }

  void all_reduce(const Tensor& buf) override { iall_reduce(buf)->wait(); }
  void reduce_scatter(const Tensor& out, const Tensor& in) override;
  void all_gather(const Tensor& out, const Tensor& in) override { iall_gather(out, in)->wait(); }
  void all_to_all(const Tensor& out, const Tensor& in) override;
  void broadcast(const Tensor& buf, int root) override { ibroadcast(buf, root)->wait(); }
  void sendrecv(const Tensor& send, int dst, const Tensor& recv, int src) override {
    isendrecv(send, dst, recv, src)->wait();
  }
  void send(const Tensor& buf, int dst) override;
  void recv(const Tensor& buf, int src) override;
  void barrier() override;

  Request iall_reduce(const Tensor& buf) override;
  Request iall_gather(const Tensor& out, const Tensor& in) override;
  Request ibroadcast(const Tensor& buf, int root) override;
  Request isendrecv(const Tensor& send, int dst, const Tensor& recv, int src) override;

  std::vector<std::string> gather_blobs(const std::string& blob, int root) override;
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

 private:
  // One timed operation over the whole group: returns its completion handle.
  Request timed(const char* op, double payload_bytes, std::vector<int64_t> dims, std::vector<int> peers);
  std::vector<int> others() const;

  SimNetwork& m_net;
  uint64_t m_id;
  std::vector<int> m_members;
  int m_rank = 0, m_world_rank = 0;
  Recorder& m_rec;
  SimClock& m_clock;
  std::string m_name;
  uint64_t m_seq = 0;
};

}  // namespace ss
