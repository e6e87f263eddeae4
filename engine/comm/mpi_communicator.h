// The Communicator of the cpu backend: MPI, one process per virtual device.
//
// Every MPI call of a rank after start-up runs on that rank's one CommStream
// thread, in the order the program issued it. Collectives are therefore
// entered in the same order on every rank whatever the compute thread does in
// between, the compute thread can overlap a transfer in flight, and MPI needs
// no more than MPI_THREAD_SERIALIZED. Lifetimes: the MpiWorld outlives every
// CommStream, which outlives every MpiCommunicator using it (communicators
// hold the stream by shared_ptr).
#pragma once

#include <mpi.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"

namespace ss {

// MPI for the life of the process: MPI_Init_thread in the constructor,
// MPI_Finalize in the destructor. Works without mpirun (a singleton world of
// size 1). Errors on MPI_COMM_WORLD and the communicators derived from it are
// returned, not fatal, so the engine can report them.
class MpiWorld {
 public:
  // Throws std::runtime_error if MPI offers less than MPI_THREAD_SERIALIZED
  // or was already finalized.
  MpiWorld();
  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  int rank() const { return m_rank; }
  int size() const { return m_size; }
  // MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE.
  int thread_level() const { return m_thread_level; }
  // The host of every world rank, gathered once at start-up.
  const std::vector<std::string>& hostnames() const { return m_hostnames; }
  const std::string& hostname() const { return m_hostnames[m_rank]; }

 private:
  bool m_owns = false;  // false when MPI was initialised by someone else
  int m_rank = 0;
  int m_size = 1;
  int m_thread_level = 0;
  std::vector<std::string> m_hostnames;
};

// Throws std::runtime_error naming the call, the communicator and MPI's
// message when `rc` is not MPI_SUCCESS.
void check_mpi(int rc, const char* call, const std::string& comm_name);

// The rank's comm stream: one thread running tasks in FIFO order.
class CommStream {
 public:
  CommStream();
  // Runs every task still queued, then joins the thread.
  ~CommStream();
  CommStream(const CommStream&) = delete;
  CommStream& operator=(const CommStream&) = delete;

  // Queues `task`; the Request completes when it has run. An exception the
  // task throws is rethrown by Request::wait(); later tasks still run. The
  // tensors in `keep` (those the task reads or writes) stay alive until then
  // and are released on a caller's thread, by wait() or the Request's last
  // owner, because freeing a buffer updates the compute thread's allocator.
  Request enqueue(std::function<void()> task, std::vector<Tensor> keep = {});

 private:
  struct Item;
  void loop();

  std::mutex m_mutex;
  std::condition_variable m_cv;
  std::deque<std::shared_ptr<Item>> m_queue;
  std::vector<std::shared_ptr<Item>> m_finished;  // released by the next enqueue()
  bool m_stop = false;
  std::thread m_thread;
};

class MpiCommunicator final : public Communicator {
 public:
  // A communicator over a duplicate of `comm` (collective over `comm`), so
  // its traffic never matches messages of other users of `comm`.
  MpiCommunicator(std::shared_ptr<CommStream> stream, MPI_Comm comm, Recorder& rec,
                  std::string name);
  // Frees the MPI communicator on the stream (collective, like every
  // destruction of communicators: all members destroy it in the same order).
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return m_rank; }
  int size() const override { return m_size; }
  const std::string& name() const override { return m_name; }
  const std::vector<int>& members() const override { return m_members; }

  void all_reduce(const Tensor& buf) override;
  void reduce_scatter(const Tensor& out, const Tensor& in) override;
  void all_gather(const Tensor& out, const Tensor& in) override;
  void all_to_all(const Tensor& out, const Tensor& in) override;
  void broadcast(const Tensor& buf, int root) override;
  void sendrecv(const Tensor& send, int dst, const Tensor& recv, int src) override;
  void send(const Tensor& buf, int dst) override;
  void recv(const Tensor& buf, int src) override;
  void barrier() override;

  Request iall_reduce(const Tensor& buf) override;
  Request iall_gather(const Tensor& out, const Tensor& in) override;
  Request ibroadcast(const Tensor& buf, int root) override;
  Request isendrecv(const Tensor& send, int dst, const Tensor& recv, int src) override;

  std::vector<std::string> gather_blobs(const std::string& blob, int root) override;
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

  // For code that must call MPI itself (benchmarks): the handle may only be
  // used on the stream, e.g. inside a task given to stream().enqueue().
  MPI_Comm handle() const { return m_comm; }
  CommStream& stream() { return *m_stream; }

 private:
  struct Adopt {};
  // Takes ownership of `comm`, created on the stream.
  MpiCommunicator(Adopt, std::shared_ptr<CommStream> stream, MPI_Comm comm, Recorder& rec,
                  std::string name);
  void init_members();  // on the stream

  // Queues `call` on the stream; around it, records one comm span tagged with
  // the layer, site and phase current now, on the calling thread.
  // `payload_bytes` is the buffer wire_bytes() expects; `keep` the tensors
  // `call` touches.
  Request submit(const char* op, double payload_bytes, std::vector<int64_t> dims,
                 std::vector<int> peers, std::vector<Tensor> keep, std::function<void()> call);

  Request issue_all_reduce(const Tensor& buf);
  Request issue_all_gather(const Tensor& out, const Tensor& in);
  Request issue_broadcast(const Tensor& buf, int root);
  Request issue_sendrecv(const Tensor& send, int dst, const Tensor& recv, int src);

  void check_tensor(const Tensor& t, const char* op, const char* what) const;
  void check_summable(const Tensor& t, const char* op) const;
  void check_peer(int peer, const char* op, const char* what) const;
  std::vector<int> others() const;  // world ranks of the members but this one

  std::shared_ptr<CommStream> m_stream;
  MPI_Comm m_comm = MPI_COMM_NULL;
  Recorder& m_rec;
  std::string m_name;
  int m_rank = 0;
  int m_size = 1;
  std::vector<int> m_members;
};

}  // namespace ss
