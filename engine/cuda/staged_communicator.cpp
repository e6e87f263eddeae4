#include "cuda/staged_communicator.h"

#include <cstdlib>
#include <exception>
#include <new>
#include <stdexcept>
#include <utility>

#include "cuda/runtime.h"

namespace ss::SS_CUDA_NS {
namespace {

// Staging buffers are host memory the run's device accounting must not see
// (the MPI communicator's own buffers are not counted either): a process-wide
// allocator of their own, released on the threads that release tensors.
Allocator& staging_allocator() {
  static Allocator a;
  return a;
}

void free_host(void* p) { std::free(p); }

// A host result back into its device twin on the compute stream.
void copy_back(const Tensor& dev, const Tensor& host, Stream compute) {
  if (dev.numel() > 0) copy_to_device(dev.raw(), host.raw(), dev.nbytes(), compute);
}

// Once the host operation completes, each host tensor goes back into its
// device twin on the compute stream (kernels queued after the wait see it).
struct StagedRequest final : CommRequest {
  Request inner;
  Stream compute = nullptr;
  std::shared_ptr<const void> keep;  // the stream's owner
  std::vector<std::pair<Tensor, Tensor>> device_host;
  bool returned = false;
  const int unwinding = std::uncaught_exceptions();  // at issue

  void wait() override {
    inner->wait();
    if (returned) return;
    returned = true;
    for (auto& [dev, host] : device_host) copy_back(dev, host, compute);
    device_host.clear();
  }
  bool done() override { return inner->done(); }
  // An operation issued completes, as every Communicator's does, except
  // while an error unwinds the rank: then nothing waits for the peers, and
  // the rank reports its error at once.
  ~StagedRequest() override {
    try {
      if (!returned && std::uncaught_exceptions() <= unwinding) wait();
    } catch (...) {
      // A destructor cannot report; the failure was the operation's, which wait() would have thrown.
    }
  }
};

}  // namespace

StagedCommunicator::StagedCommunicator(std::unique_ptr<Communicator> host, Stream compute,
                                       std::shared_ptr<const void> keep)
    : m_host(std::move(host)), m_compute(compute), m_keep(std::move(keep)) {
  if (!m_host) throw std::logic_error("staged communicator: no host communicator");
}

Tensor StagedCommunicator::to_host(const Tensor& like, const char* op, const char* what, bool copy) {
  const std::string where = std::string(op) + " on " + name() + ": " + what;
  if (!like.defined()) throw std::logic_error(where + " is undefined");
  if (!like.is_contiguous()) throw std::logic_error(where + " must be contiguous, got a strided view " + like.shape_str());
  if (like.numel() > 0 && !like.has_data()) throw std::logic_error(where + " has no data (a meta tensor)");
  const int64_t bytes = like.nbytes();
  void* p = bytes > 0 ? std::malloc(size_t(bytes)) : nullptr;
  if (bytes > 0 && !p) throw std::bad_alloc();
  staging_allocator().charge(Category::CommBuffers, bytes, "staging");
  Tensor host(std::make_shared<Buffer>(staging_allocator(), Category::CommBuffers, bytes, "staging", p, &free_host),
              like.shape(), like.dtype());
  if (copy && bytes > 0) copy_to_host(host.raw(), like.raw(), bytes, m_compute);
  return host;
}

Request StagedCommunicator::returning(Request inner, std::vector<std::pair<Tensor, Tensor>> device_host) {
  auto r = std::make_shared<StagedRequest>();
  r->inner = std::move(inner);
  r->compute = m_compute;
  r->keep = m_keep;
  r->device_host = std::move(device_host);
  return r;
}

// ------------------------------------------------------------ blocking

void StagedCommunicator::all_reduce(const Tensor& buf) { iall_reduce(buf)->wait(); }

void StagedCommunicator::all_gather(const Tensor& out, const Tensor& in) { iall_gather(out, in)->wait(); }

void StagedCommunicator::broadcast(const Tensor& buf, int root) { ibroadcast(buf, root)->wait(); }

void StagedCommunicator::sendrecv(const Tensor& send, int dst, const Tensor& recv, int src) {
  isendrecv(send, dst, recv, src)->wait();
}

void StagedCommunicator::out_of(const char* op, const Tensor& out, const Tensor& in,
                                void (Communicator::*run)(const Tensor&, const Tensor&)) {
  if (buffers_overlap(out, in)) throw std::logic_error(std::string(op) + " on " + name() + ": out and in overlap");
  const Tensor h_in = to_host(in, op, "in", true);
  const Tensor h_out = to_host(out, op, "out", false);
  ((*m_host).*run)(h_out, h_in);
  copy_back(out, h_out, m_compute);
}

void StagedCommunicator::reduce_scatter(const Tensor& out, const Tensor& in) {
  out_of("reduce_scatter", out, in, &Communicator::reduce_scatter);
}

void StagedCommunicator::all_to_all(const Tensor& out, const Tensor& in) {
  out_of("all_to_all", out, in, &Communicator::all_to_all);
}

void StagedCommunicator::send(const Tensor& buf, int dst) { m_host->send(to_host(buf, "send", "buf", true), dst); }

void StagedCommunicator::recv(const Tensor& buf, int src) {
  const Tensor h = to_host(buf, "recv", "buf", false);
  m_host->recv(h, src);
  copy_back(buf, h, m_compute);
}

// Every rank's queued kernels done, then the host barrier.
void StagedCommunicator::barrier() {
  sync_stream(m_compute);
  m_host->barrier();
}

// -------------------------------------------------------- non-blocking

Request StagedCommunicator::iall_reduce(const Tensor& buf) {
  const Tensor h = to_host(buf, "all_reduce", "buf", true);
  return returning(m_host->iall_reduce(h), {{buf, h}});
}

Request StagedCommunicator::iall_gather(const Tensor& out, const Tensor& in) {
  // In place (in is this rank's block of out) is fine: in is on the host
  // before out is written back, with the same bytes in that block.
  if (!gathers_in_place(out, in, rank()) && buffers_overlap(out, in))
    throw std::logic_error("all_gather on " + name() + ": in overlaps out other than as this rank's block");
  const Tensor h_in = to_host(in, "all_gather", "in", true);
  const Tensor h_out = to_host(out, "all_gather", "out", false);
  return returning(m_host->iall_gather(h_out, h_in), {{out, h_out}});
}

Request StagedCommunicator::ibroadcast(const Tensor& buf, int root) {
  const bool from_here = rank() == root;
  const Tensor h = to_host(buf, "broadcast", "buf", from_here);
  return returning(m_host->ibroadcast(h, root), from_here ? std::vector<std::pair<Tensor, Tensor>>{}
                                                          : std::vector<std::pair<Tensor, Tensor>>{{buf, h}});
}

Request StagedCommunicator::isendrecv(const Tensor& send, int dst, const Tensor& recv, int src) {
  if (buffers_overlap(send, recv)) throw std::logic_error("sendrecv on " + name() + ": send and recv overlap");
  const Tensor h_send = to_host(send, "sendrecv", "send", true);
  const Tensor h_recv = to_host(recv, "sendrecv", "recv", false);
  return returning(m_host->isendrecv(h_send, dst, h_recv, src), {{recv, h_recv}});
}

// ---------------------------------------------------------------- host

std::vector<std::string> StagedCommunicator::gather_blobs(const std::string& blob, int root) {
  return m_host->gather_blobs(blob, root);
}

std::unique_ptr<Communicator> StagedCommunicator::split(int color, int key, const std::string& child) {
  return std::make_unique<StagedCommunicator>(m_host->split(color, key, child), m_compute, m_keep);
}

}  // namespace ss::SS_CUDA_NS
