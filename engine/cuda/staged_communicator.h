// The cuda backend's Communicator where ranks share a GPU: NCCL refuses two
// ranks of one communicator on the same device, so their collectives go
// through host memory over MPI instead. Each operation copies its device
// inputs to the host on the compute stream (which waits for the kernels
// queued before it), runs the same operation of the host communicator on
// those copies, and copies the results back on the compute stream, so the
// kernels queued after it see them. The non-blocking forms return once the
// inputs are on the host; Request::wait() copies the results back. The
// kernels are the GPU's, the arithmetic of every reduction the MPI
// communicator's (fp32 sums of bf16/fp16, rounded once), and the comm spans
// are the host communicator's.
//
// `--backend cuda-emu` runs its ranks through this class too, on the
// compute stream of the device their backend takes (the emulator's streams
// run on threads of their own, so a copy on another stream would race the
// kernels), and every CI run checks the staging against the single-device
// reference.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "cuda/kernels.h"

namespace ss::SS_CUDA_NS {

class StagedCommunicator final : public Communicator {
 public:
  // `host`: the group's ranks over MPI; `compute`: the stream the backend's
  // kernels run on (the copies queue there); `keep` holds whatever owns that
  // stream (the device context) for as long as this communicator lives.
  StagedCommunicator(std::unique_ptr<Communicator> host, Stream compute, std::shared_ptr<const void> keep);

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

 private:
  // A host tensor of `like`'s shape and dtype; with `copy`, holding its bytes
  // (after the kernels queued before now on the compute stream).
  Tensor to_host(const Tensor& like, const char* op, const char* what, bool copy);
  // A blocking out-of-place operation (reduce_scatter, all_to_all): `in` to
  // the host, `run` of the host communicator, `out` back.
  void out_of(const char* op, const Tensor& out, const Tensor& in,
              void (Communicator::*run)(const Tensor&, const Tensor&));
  // The request that, once `inner` completes, copies each host tensor back
  // into its device twin on the compute stream.
  Request returning(Request inner, std::vector<std::pair<Tensor, Tensor>> device_host);

  std::unique_ptr<Communicator> m_host;
  Stream m_compute;
  std::shared_ptr<const void> m_keep;
};

}  // namespace ss::SS_CUDA_NS
