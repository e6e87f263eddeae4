// The Communicator of the cuda backend: NCCL over the GPUs of the group's
// ranks, bootstrapped over MPI (rank 0 makes the ncclUniqueId, MPI
// broadcasts it), one process per GPU.
//
// Every operation is issued on the rank's communication stream after the
// compute stream's work so far (a CUDA event joins them), so a transfer in
// flight overlaps the kernels queued after it; Request::wait() makes the
// compute stream wait for it (never the host). Spans come from CUDA events
// around each operation. Sums of bf16/fp16 buffers accumulate in fp32 and
// round once, as the MPI communicator's do: an all-to-all of each rank's
// block, an fp32 sum on the device, and an all-gather (a ring all-reduce's
// bytes). Communicators are non-blocking; a watchdog thread turns NCCL's
// asynchronous errors, and an operation outstanding past the timeout, into
// an abort (ncclCommAbort) and an error the next call throws, so a lost
// peer ends the run within seconds instead of hanging it.
// Host-side work (the telemetry blobs, members, splits' bookkeeping) goes
// over the MPI twin each communicator keeps.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi_communicator.h"
#include "cuda/cuda_backend.h"

namespace ss::SS_CUDA_NS {

// NCCL's library loaded once; "" when it can be used, else why not.
std::string nccl_unavailable_reason();
std::string nccl_version();  // "2.28.9", or "" when not loaded
// The rank side of bench --backend cuda's NCCL table (nccl_bench.cpp).
int nccl_bench_rank();

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `host`'s ranks: each joins on ctx's GPU. `timeout_s`:
  // how long an operation may stay outstanding before the communicator is
  // aborted (0: never).
  NcclCommunicator(std::unique_ptr<MpiCommunicator> host, std::shared_ptr<DeviceContext> ctx, Recorder& rec,
                   double timeout_s);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return m_host->rank(); }
  int size() const override { return m_host->size(); }
  const std::string& name() const override { return m_host->name(); }
  const std::vector<int>& members() const override { return m_host->members(); }

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

  struct State;  // the NCCL communicator, its watchdog and event pool (nccl_communicator.cpp)

 private:
  struct Adopt {};
  NcclCommunicator(Adopt, std::unique_ptr<MpiCommunicator> host, std::shared_ptr<DeviceContext> ctx, Recorder& rec,
                   std::shared_ptr<State> state);

  // Queues `call` (NCCL calls on the comm stream) after the compute stream's
  // work, records its span, and returns the completion the compute stream
  // can wait on; `keep` stays alive until then.
  Request issue(const char* op, double payload_bytes, std::vector<int64_t> dims, std::vector<int> peers,
                std::vector<Tensor> keep, const std::function<void()>& call);
  // 16-bit sums: every rank's block r to rank r, summed in fp32 into `out_block`
  // (this rank's block of `data` when gathering back), then (gather_back) every block to every rank.
  void reduce_16bit(void* data, int64_t n, DType dt, void* out_block, bool gather_back);
  void check_tensor(const Tensor& t, const char* op, const char* what) const;
  void check_peer(int peer, const char* op, const char* what) const;
  std::vector<int> others() const;

  std::unique_ptr<MpiCommunicator> m_host;
  std::shared_ptr<DeviceContext> m_ctx;
  Recorder& m_rec;
  std::shared_ptr<State> m_state;
};

}  // namespace ss::SS_CUDA_NS
