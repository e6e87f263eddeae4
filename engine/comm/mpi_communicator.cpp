#include "comm/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <exception>
#include <numeric>
#include <stdexcept>
#include <utility>

namespace ss {

// ---------------------------------------------------------------- MpiWorld

MpiWorld::MpiWorld() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) throw std::runtime_error("MPI was already finalized in this process");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    MPI_Query_thread(&m_thread_level);
  } else {
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &m_thread_level);
    if (rc != MPI_SUCCESS) throw std::runtime_error("MPI_Init_thread failed");
    m_owns = true;
  }
  // One comm thread issues all MPI calls, so SERIALIZED is enough; FUNNELED
  // would tie MPI to the main thread, which must stay free for compute.
  if (m_thread_level < MPI_THREAD_SERIALIZED) {
    if (m_owns) MPI_Finalize();
    throw std::runtime_error(
        "MPI provides thread level " + std::to_string(m_thread_level) +
        "; the engine needs at least MPI_THREAD_SERIALIZED (its comm stream calls MPI from a "
        "thread of its own). Use an MPI library built with thread support.");
  }
  // Errors come back as codes (and become exceptions) instead of aborting
  // the job; communicators duplicated or split from the world inherit this.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &m_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &m_size);

  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> all(size_t(m_size) * MPI_MAX_PROCESSOR_NAME, '\0');
  check_mpi(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(),
                          MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD),
            "MPI_Allgather", "world");
  for (int r = 0; r < m_size; ++r) {
    const char* p = all.data() + size_t(r) * MPI_MAX_PROCESSOR_NAME;
    m_hostnames.emplace_back(p, strnlen(p, MPI_MAX_PROCESSOR_NAME));
  }
}

MpiWorld::~MpiWorld() {
  if (m_owns) MPI_Finalize();
}

void check_mpi(int rc, const char* call, const std::string& comm_name) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(std::string(call) + " on " + comm_name +
                           " failed: " + std::string(msg, size_t(len)));
}

// -------------------------------------------------------------- CommStream

// One queued task and its completion. The comm thread never drops the last
// reference to an item (see enqueue()), so `keep` is released on a caller's
// thread.
struct CommStream::Item final : CommRequest {
  std::function<void()> task;
  std::vector<Tensor> keep;
  std::mutex mutex;
  std::condition_variable cv;
  bool finished = false;
  std::exception_ptr error;

  void run() {
    try {
      task();
    } catch (...) {
      error = std::current_exception();
    }
    task = nullptr;
    std::lock_guard lock(mutex);
    finished = true;
    cv.notify_all();
  }

  void wait() override {
    std::unique_lock lock(mutex);
    cv.wait(lock, [this] { return finished; });
    keep.clear();
    if (error) std::rethrow_exception(error);
  }

  bool done() override {
    std::lock_guard lock(mutex);
    return finished;
  }
};

CommStream::CommStream() : m_thread([this] { loop(); }) {}

CommStream::~CommStream() {
  {
    std::lock_guard lock(m_mutex);
    m_stop = true;
  }
  m_cv.notify_all();
  m_thread.join();
  m_finished.clear();
}

Request CommStream::enqueue(std::function<void()> task, std::vector<Tensor> keep) {
  auto item = std::make_shared<Item>();
  item->task = std::move(task);
  item->keep = std::move(keep);
  std::vector<std::shared_ptr<Item>> finished;
  {
    std::lock_guard lock(m_mutex);
    if (m_stop) throw std::logic_error("enqueue on a comm stream that is shutting down");
    m_queue.push_back(item);
    finished.swap(m_finished);
  }
  m_cv.notify_one();
  return item;  // `finished` is released here, on the caller's thread
}

void CommStream::loop() {
  for (;;) {
    std::shared_ptr<Item> item;
    {
      std::unique_lock lock(m_mutex);
      m_cv.wait(lock, [this] { return m_stop || !m_queue.empty(); });
      if (m_queue.empty()) return;  // stopping, and everything queued has run
      item = std::move(m_queue.front());
      m_queue.pop_front();
    }
    item->run();
    // Hand the reference back instead of dropping it here (see Item).
    std::lock_guard lock(m_mutex);
    m_finished.push_back(std::move(item));
  }
}

// --------------------------------------------------------- MpiCommunicator

namespace {

constexpr int kTag = 0;  // one FIFO stream per rank: MPI's ordering rules suffice

// MPI wants a valid pointer even for zero elements; empty tensors have none.
char* ptr(const Tensor& t) {
  static float empty = 0;
  void* p = t.raw();
  return static_cast<char*>(p ? p : &empty);
}

// The MPI type that moves a dtype's values (16-bit floats travel as their bits).
MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::BF16:
    case DType::F16: return MPI_UINT16_T;
    case DType::I32: return MPI_INT32_T;
  }
  return MPI_BYTE;
}

// Sums 16-bit floats with fp32 accumulation. MPI has no bf16/fp16 type, and
// a user-defined MPI_Op would round to 16 bits after every pairwise step of
// MPI's algorithm; instead (DESIGN.md, "Number formats"): an all-to-all
// delivers to rank r every rank's block r (a reduce-scatter's traffic), rank r
// sums the D blocks in fp32 and rounds once, and an all-gather returns every
// summed block: the bytes of a ring all-reduce, 2 (D-1)/D of the buffer. The
// staging is the communicator's own, as MPI's and NCCL's internal buffers are.
void reduce_16bit(char* data, int64_t n, DType dt, MPI_Comm comm, int rank, int size, bool gather_back,
                  char* out_block, const std::string& name) {
  const size_t d = static_cast<size_t>(size);
  std::vector<int> counts(d), displs(d);
  for (int r = 0; r < size; ++r) {
    displs[size_t(r)] = int(n * r / size);
    counts[size_t(r)] = int(n * (r + 1) / size) - displs[size_t(r)];
  }
  const int mine = counts[size_t(rank)];
  std::vector<uint16_t> recv(size_t(mine) * size_t(size));
  std::vector<int> rcounts(d, mine), rdispls(d);
  for (int r = 0; r < size; ++r) rdispls[size_t(r)] = r * mine;
  check_mpi(MPI_Alltoallv(data, counts.data(), displs.data(), MPI_UINT16_T, recv.data(), rcounts.data(),
                          rdispls.data(), MPI_UINT16_T, comm),
            "MPI_Alltoallv", name);
  std::vector<float> sum(size_t(mine), 0.0f);
  for (int r = 0; r < size; ++r) widen(recv.data() + size_t(r) * size_t(mine), dt, mine, sum.data(), true);
  char* dst = gather_back ? data + int64_t(displs[size_t(rank)]) * 2 : out_block;
  narrow(sum.data(), mine, dt, dst);
  if (gather_back)
    check_mpi(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, counts.data(), displs.data(), MPI_UINT16_T,
                             comm),
              "MPI_Allgatherv", name);
}

}  // namespace

MpiCommunicator::MpiCommunicator(std::shared_ptr<CommStream> stream, MPI_Comm comm, Recorder& rec,
                                 std::string name)
    : m_stream(std::move(stream)), m_rec(rec), m_name(std::move(name)) {
  m_stream
      ->enqueue([this, comm] {
        check_mpi(MPI_Comm_dup(comm, &m_comm), "MPI_Comm_dup", m_name);
        init_members();
      })
      ->wait();
}

MpiCommunicator::MpiCommunicator(Adopt, std::shared_ptr<CommStream> stream, MPI_Comm comm,
                                 Recorder& rec, std::string name)
    : m_stream(std::move(stream)), m_comm(comm), m_rec(rec), m_name(std::move(name)) {
  m_stream->enqueue([this] { init_members(); })->wait();
}

MpiCommunicator::~MpiCommunicator() {
  if (m_comm == MPI_COMM_NULL) return;
  try {
    m_stream->enqueue([comm = m_comm]() mutable { MPI_Comm_free(&comm); })->wait();
  } catch (...) {
    // A destructor cannot report; the process is usually ending anyway.
  }
}

void MpiCommunicator::init_members() {
  MPI_Comm_set_name(m_comm, m_name.c_str());
  check_mpi(MPI_Comm_rank(m_comm, &m_rank), "MPI_Comm_rank", m_name);
  check_mpi(MPI_Comm_size(m_comm, &m_size), "MPI_Comm_size", m_name);
  MPI_Group group, world;
  check_mpi(MPI_Comm_group(m_comm, &group), "MPI_Comm_group", m_name);
  check_mpi(MPI_Comm_group(MPI_COMM_WORLD, &world), "MPI_Comm_group", "world");
  std::vector<int> local(static_cast<size_t>(m_size));
  std::iota(local.begin(), local.end(), 0);
  m_members.assign(size_t(m_size), MPI_UNDEFINED);
  const int rc = MPI_Group_translate_ranks(group, m_size, local.data(), world, m_members.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  check_mpi(rc, "MPI_Group_translate_ranks", m_name);
}

std::vector<int> MpiCommunicator::others() const {
  std::vector<int> out;
  for (int r = 0; r < m_size; ++r)
    if (r != m_rank) out.push_back(m_members[size_t(r)]);
  return out;
}

void MpiCommunicator::check_tensor(const Tensor& t, const char* op, const char* what) const {
  const std::string where = std::string(op) + " on " + m_name + ": " + what;
  if (!t.defined()) throw std::logic_error(where + " is undefined");
  if (!t.is_contiguous())
    throw std::logic_error(where + " must be contiguous, got a strided view " + t.shape_str());
  if (t.numel() > 0 && !t.has_data())
    throw std::logic_error(where + " has no data (a meta tensor); MPI moves host tensors only");
  if (t.numel() > INT_MAX)
    throw std::logic_error(where + " has " + std::to_string(t.numel()) +
                           " elements, more than one MPI message can carry");
}

void MpiCommunicator::check_summable(const Tensor& t, const char* op) const {
  if (!is_float(t.dtype()))
    throw std::logic_error(std::string(op) + " on " + m_name + ": sums take f32, bf16 or f16, got " +
                           std::string(dtype_name(t.dtype())));
}

void MpiCommunicator::check_peer(int peer, const char* op, const char* what) const {
  if (peer < 0 || peer >= m_size)
    throw std::logic_error(std::string(op) + " on " + m_name + ": " + what + " " +
                           std::to_string(peer) + " is not a rank of a group of " +
                           std::to_string(m_size));
}

Request MpiCommunicator::submit(const char* op, double payload_bytes, std::vector<int64_t> dims,
                                std::vector<int> peers, std::vector<Tensor> keep,
                                std::function<void()> call) {
  const double bytes = wire_bytes(op, payload_bytes, m_size);
  // The compute thread moves on to other layers while this op waits its
  // turn, so the tag is taken now, not when the span is recorded.
  auto task = [this, op, bytes, tag = m_rec.tag(), dims = std::move(dims), peers = std::move(peers),
               call = std::move(call)] {
    const int64_t t0 = m_rec.now();
    call();
    const int64_t t1 = m_rec.now();
    m_rec.span_at(tag, StreamKind::Comm, op, t0, t1, 0, bytes, dims, peers);
  };
  return m_stream->enqueue(std::move(task), std::move(keep));
}

Request MpiCommunicator::issue_all_reduce(const Tensor& buf) {
  check_tensor(buf, "all_reduce", "buf");
  check_summable(buf, "all_reduce");
  const int n = int(buf.numel());
  char* p = ptr(buf);
  const DType dt = buf.dtype();
  return submit("all_reduce", double(buf.nbytes()), {buf.numel()}, others(), {buf}, [this, p, n, dt] {
    if (dt == DType::F32)
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, p, n, MPI_FLOAT, MPI_SUM, m_comm), "MPI_Allreduce", m_name);
    else
      reduce_16bit(p, n, dt, m_comm, m_rank, m_size, true, nullptr, m_name);
  });
}

void MpiCommunicator::reduce_scatter(const Tensor& out, const Tensor& in) {
  check_tensor(out, "reduce_scatter", "out");
  check_tensor(in, "reduce_scatter", "in");
  if (in.numel() != int64_t(m_size) * out.numel())
    throw std::logic_error("reduce_scatter on " + m_name + ": in has " +
                           std::to_string(in.numel()) + " elements, expected size() * out = " +
                           std::to_string(m_size) + " * " + std::to_string(out.numel()));
  if (buffers_overlap(out, in))
    throw std::logic_error("reduce_scatter on " + m_name + ": out and in overlap");
  check_summable(in, "reduce_scatter");
  if (in.dtype() != out.dtype()) throw std::logic_error("reduce_scatter on " + m_name + ": in and out dtypes differ");
  const int n = int(out.numel());
  char* pin = ptr(in);
  char* pout = ptr(out);
  const DType dt = in.dtype();
  submit("reduce_scatter", double(in.nbytes()), {in.numel()}, others(), {out, in},
         [this, pin, pout, n, dt] {
           if (dt == DType::F32)
             check_mpi(MPI_Reduce_scatter_block(pin, pout, n, MPI_FLOAT, MPI_SUM, m_comm),
                       "MPI_Reduce_scatter_block", m_name);
           else
             reduce_16bit(pin, int64_t(n) * m_size, dt, m_comm, m_rank, m_size, false, pout, m_name);
         })
      ->wait();
}

Request MpiCommunicator::issue_all_gather(const Tensor& out, const Tensor& in) {
  check_tensor(out, "all_gather", "out");
  check_tensor(in, "all_gather", "in");
  const int64_t n = in.numel();
  if (out.numel() != int64_t(m_size) * n)
    throw std::logic_error("all_gather on " + m_name + ": out has " + std::to_string(out.numel()) +
                           " elements, expected size() * in = " + std::to_string(m_size) + " * " +
                           std::to_string(n));
  if (in.dtype() != out.dtype()) throw std::logic_error("all_gather on " + m_name + ": in and out dtypes differ");
  char* pin = ptr(in);
  char* pout = ptr(out);
  const MPI_Datatype type = mpi_type(in.dtype());
  // `in` may already sit in this rank's block of `out` (a gather in place).
  const bool in_place = gathers_in_place(out, in, m_rank);
  if (!in_place && buffers_overlap(out, in))
    throw std::logic_error("all_gather on " + m_name +
                           ": in overlaps out other than as this rank's block");
  return submit("all_gather", double(out.nbytes()), {out.numel()}, others(), {out, in},
                [this, pin, pout, n, in_place, type] {
                  check_mpi(MPI_Allgather(in_place ? MPI_IN_PLACE : pin, int(n), type, pout, int(n), type,
                                          m_comm),
                            "MPI_Allgather", m_name);
                });
}

void MpiCommunicator::all_to_all(const Tensor& out, const Tensor& in) {
  check_tensor(out, "all_to_all", "out");
  check_tensor(in, "all_to_all", "in");
  if (in.numel() != out.numel() || in.numel() % m_size != 0)
    throw std::logic_error("all_to_all on " + m_name + ": in and out need the same number of " +
                           "elements, a multiple of size() = " + std::to_string(m_size) +
                           "; got in " + std::to_string(in.numel()) + ", out " +
                           std::to_string(out.numel()));
  if (buffers_overlap(out, in)) throw std::logic_error("all_to_all on " + m_name + ": out and in overlap");
  if (in.dtype() != out.dtype()) throw std::logic_error("all_to_all on " + m_name + ": in and out dtypes differ");
  const int n = int(in.numel() / m_size);
  char* pin = ptr(in);
  char* pout = ptr(out);
  const MPI_Datatype type = mpi_type(in.dtype());
  submit("all_to_all", double(in.nbytes()), {in.numel()}, others(), {out, in},
         [this, pin, pout, n, type] {
           check_mpi(MPI_Alltoall(pin, n, type, pout, n, type, m_comm), "MPI_Alltoall", m_name);
         })
      ->wait();
}

Request MpiCommunicator::issue_broadcast(const Tensor& buf, int root) {
  check_tensor(buf, "broadcast", "buf");
  check_peer(root, "broadcast", "root");
  const int n = int(buf.numel());
  char* p = ptr(buf);
  const MPI_Datatype type = mpi_type(buf.dtype());
  return submit("broadcast", double(buf.nbytes()), {buf.numel()}, others(), {buf},
                [this, p, n, root, type] {
                  check_mpi(MPI_Bcast(p, n, type, root, m_comm), "MPI_Bcast", m_name);
                });
}

namespace {

// A receive must fill the tensor exactly: a shorter message would leave stale
// data that looks like a result.
void check_count(const MPI_Status& status, MPI_Datatype type, int expected, const char* op, int src,
                 const std::string& comm_name) {
  int got = 0;
  MPI_Get_count(&status, type, &got);
  if (got != expected)
    throw std::runtime_error(std::string(op) + " on " + comm_name + ": received " +
                             std::to_string(got) + " elements from rank " + std::to_string(src) +
                             ", the receive tensor has " + std::to_string(expected));
}

}  // namespace

Request MpiCommunicator::issue_sendrecv(const Tensor& send, int dst, const Tensor& recv, int src) {
  check_tensor(send, "sendrecv", "send");
  check_tensor(recv, "sendrecv", "recv");
  check_peer(dst, "sendrecv", "dst");
  check_peer(src, "sendrecv", "src");
  if (buffers_overlap(send, recv))
    throw std::logic_error("sendrecv on " + m_name + ": send and recv overlap");
  if (send.dtype() != recv.dtype()) throw std::logic_error("sendrecv on " + m_name + ": send and recv dtypes differ");
  const int ns = int(send.numel());
  const int nr = int(recv.numel());
  char* ps = ptr(send);
  char* pr = ptr(recv);
  const MPI_Datatype type = mpi_type(send.dtype());
  return submit("sendrecv", double(send.nbytes()), {send.numel()},
                {m_members[size_t(dst)], m_members[size_t(src)]}, {send, recv},
                [this, ps, ns, dst, pr, nr, src, type] {
                  MPI_Status status;
                  check_mpi(MPI_Sendrecv(ps, ns, type, dst, kTag, pr, nr, type, src, kTag, m_comm, &status),
                            "MPI_Sendrecv", m_name);
                  check_count(status, type, nr, "sendrecv", src, m_name);
                });
}

void MpiCommunicator::send(const Tensor& buf, int dst) {
  check_tensor(buf, "send", "buf");
  check_peer(dst, "send", "dst");
  const int n = int(buf.numel());
  char* p = ptr(buf);
  const MPI_Datatype type = mpi_type(buf.dtype());
  submit("send", double(buf.nbytes()), {buf.numel()}, {m_members[size_t(dst)]}, {buf},
         [this, p, n, dst, type] {
           check_mpi(MPI_Send(p, n, type, dst, kTag, m_comm), "MPI_Send", m_name);
         })
      ->wait();
}

void MpiCommunicator::recv(const Tensor& buf, int src) {
  check_tensor(buf, "recv", "buf");
  check_peer(src, "recv", "src");
  const int n = int(buf.numel());
  char* p = ptr(buf);
  const MPI_Datatype type = mpi_type(buf.dtype());
  // A receive puts nothing on the wire: its bytes are the sender's.
  submit("recv", 0, {buf.numel()}, {m_members[size_t(src)]}, {buf}, [this, p, n, src, type] {
    MPI_Status status;
    check_mpi(MPI_Recv(p, n, type, src, kTag, m_comm, &status), "MPI_Recv", m_name);
    check_count(status, type, n, "recv", src, m_name);
  })->wait();
}

void MpiCommunicator::barrier() {
  submit("barrier", 0, {}, others(), {}, [this] {
    check_mpi(MPI_Barrier(m_comm), "MPI_Barrier", m_name);
  })->wait();
}

void MpiCommunicator::all_reduce(const Tensor& buf) {
  issue_all_reduce(buf)->wait();
}
void MpiCommunicator::all_gather(const Tensor& out, const Tensor& in) {
  issue_all_gather(out, in)->wait();
}
void MpiCommunicator::broadcast(const Tensor& buf, int root) {
  issue_broadcast(buf, root)->wait();
}
void MpiCommunicator::sendrecv(const Tensor& send, int dst, const Tensor& recv, int src) {
  issue_sendrecv(send, dst, recv, src)->wait();
}

Request MpiCommunicator::iall_reduce(const Tensor& buf) {
  return issue_all_reduce(buf);
}
Request MpiCommunicator::iall_gather(const Tensor& out, const Tensor& in) {
  return issue_all_gather(out, in);
}
Request MpiCommunicator::ibroadcast(const Tensor& buf, int root) {
  return issue_broadcast(buf, root);
}
Request MpiCommunicator::isendrecv(const Tensor& send, int dst, const Tensor& recv, int src) {
  return issue_sendrecv(send, dst, recv, src);
}

std::vector<std::string> MpiCommunicator::gather_blobs(const std::string& blob, int root) {
  check_peer(root, "gather_blobs", "root");
  if (blob.size() > size_t(INT_MAX))
    throw std::logic_error("gather_blobs on " + m_name + ": a blob of " +
                           std::to_string(blob.size()) + " bytes is more than one message");
  std::vector<std::string> out;
  m_stream
      ->enqueue([&] {
        // Every rank learns every length, so an oversized total fails on all
        // ranks alike instead of leaving the others waiting in the gather.
        const int len = int(blob.size());
        std::vector<int> lens(static_cast<size_t>(m_size));
        check_mpi(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, m_comm), "MPI_Allgather",
                  m_name);
        std::vector<int> displs(static_cast<size_t>(m_size));
        int64_t total = 0;
        for (int r = 0; r < m_size; ++r) {
          displs[size_t(r)] = int(std::min<int64_t>(total, INT_MAX));
          total += lens[size_t(r)];
        }
        if (total > INT_MAX)
          throw std::runtime_error("gather_blobs on " + m_name + ": " + std::to_string(total) +
                                   " bytes in all, more than one message");
        std::vector<char> all(m_rank == root ? size_t(total) + 1 : 1);
        check_mpi(MPI_Gatherv(blob.data(), len, MPI_BYTE, all.data(), lens.data(), displs.data(),
                              MPI_BYTE, root, m_comm),
                  "MPI_Gatherv", m_name);
        if (m_rank != root) return;
        for (int r = 0; r < m_size; ++r)
          out.emplace_back(all.data() + displs[size_t(r)], size_t(lens[size_t(r)]));
      })
      ->wait();
  return out;
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, const std::string& name) {
  if (color < 0)
    throw std::logic_error("split of " + m_name + " into " + name + ": color " +
                           std::to_string(color) + " is negative");
  MPI_Comm child = MPI_COMM_NULL;
  m_stream
      ->enqueue(
          [&] { check_mpi(MPI_Comm_split(m_comm, color, key, &child), "MPI_Comm_split", m_name); })
      ->wait();
  return std::unique_ptr<Communicator>(new MpiCommunicator(Adopt{}, m_stream, child, m_rec, name));
}

}  // namespace ss
