// The Communicator: collectives and point-to-point transfers over a group of
// ranks, on tensors of any backend. Strategy code is written against this
// interface; MPI (cpu), NCCL (cuda) and the simulated network (sim) implement it.
//
// Every operation is issued on the rank's comm stream, in program order, and
// records one `span` on the comm stream (op, bytes this rank puts on the wire,
// peers). Blocking calls return when the operation is complete; the `i*`
// forms return a Request at once so compute can overlap the transfer, and
// Request::wait() joins the two streams (as a CUDA event would).
//
// Buffers are contiguous tensors of any dtype and travel in it (a bf16 run
// sends 2 bytes a value). Reductions sum f32, bf16 or f16 with fp32
// accumulation, rounding once to the buffer's dtype. Sizes and
// layouts:
//   all_reduce(buf)              in place; every rank ends with the sum
//   reduce_scatter(out, in)      in: size()*n elements; rank r keeps the sum of block r (n = out.numel())
//   all_gather(out, in)          out: size()*n elements; block r is rank r's in
//   all_to_all(out, in)          in/out: size()*n; block j of in goes to rank j, block i of out came from rank i
//   broadcast(buf, root)         root's buf to every rank
//   sendrecv(send, dst, recv, src)  one ring step: send to dst while receiving from src
//   send / recv                  blocking point-to-point
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "core/trace.h"

namespace ss {

// Completion handle of a non-blocking operation.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;   // blocks the caller until the operation is complete
  virtual bool done() = 0;   // non-blocking check
};
using Request = std::shared_ptr<CommRequest>;

// Bytes one rank sends for a collective of `bytes` payload over `ranks`
// ranks under the bandwidth-optimal ring algorithms (the nccl-tests "bus
// bandwidth" factors, doc/PERFORMANCE.md): all_reduce 2(n-1)/n, all_gather and
// reduce_scatter (n-1)/n of the full buffer, broadcast 1 (root), all_to_all (n-1)/n.
double wire_bytes(const std::string& op, double bytes, int ranks);

// Whether two tensors' bytes overlap (the buffers of one operation must not).
bool buffers_overlap(const Tensor& a, const Tensor& b);
// Whether all_gather's `in` is exactly block `rank` of its `out` (a gather in
// place, which every Communicator accepts; any other overlap is refused).
bool gathers_in_place(const Tensor& out, const Tensor& in, int rank);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // rank within this group
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // "world", "tp", "sp", ...
  // World ranks of the members, in group-rank order (span peers use world ranks).
  virtual const std::vector<int>& members() const = 0;

  virtual void all_reduce(const Tensor& buf) = 0;
  virtual void reduce_scatter(const Tensor& out, const Tensor& in) = 0;
  virtual void all_gather(const Tensor& out, const Tensor& in) = 0;
  virtual void all_to_all(const Tensor& out, const Tensor& in) = 0;
  virtual void broadcast(const Tensor& buf, int root) = 0;
  virtual void sendrecv(const Tensor& send, int dst, const Tensor& recv, int src) = 0;
  virtual void send(const Tensor& buf, int dst) = 0;
  virtual void recv(const Tensor& buf, int src) = 0;
  virtual void barrier() = 0;

  virtual Request iall_reduce(const Tensor& buf) = 0;
  virtual Request iall_gather(const Tensor& out, const Tensor& in) = 0;
  virtual Request ibroadcast(const Tensor& buf, int root) = 0;
  virtual Request isendrecv(const Tensor& send, int dst, const Tensor& recv, int src) = 0;

  // Host bytes for telemetry: every rank passes its blob; the root gets all
  // of them in rank order (others get an empty vector). Records no span.
  virtual std::vector<std::string> gather_blobs(const std::string& blob, int root) = 0;

  // A sub-group of the ranks passing the same `color`, ordered by `key`.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;
};

}  // namespace ss
