// Sequence parallelism for SSM layers in training (sp, tp_sp): a sequence's
// chunks live on different ranks, so the conv needs the inputs just before
// each chunk (its halo) and the scan needs the state entering it.
//
// Conv: every rank all-gathers its chunks' last d_conv-1 inputs; a chunk's
// halo is its predecessor's tail (zeros for the first). Backward: the conv's
// gradient of each halo is all-gathered back and added to the rows it came
// from.
//
// Scan: forward scans each chunk from a zero state, giving its final state
// S0_k and its decay; after an all-gather of both, the state entering chunk
// k is S_k = decay_{k-1} S_{k-1} + S0_{k-1} (S_0 = 0), and the chunk's output
// gets the term of S_k (the state correction kernels). S_k is kept.
// Backward: the gradient of a chunk's initial state is linear in the
// gradient arriving at its final state: dS_k = decay_k dS'_k + b_k, with b_k
// the part through the chunk's own outputs. A first backward per chunk, with
// no final-state gradient, gives b_k (its parameter gradients are thrown
// away); after an all-gather of the b's, each chunk's final-state gradient
// is dS'_k = dS_{k+1} = decay_{k+1} dS'_{k+1} + b_{k+1} (the same advance as
// the forward's, run from the last chunk); the second backward, with it,
// gives the chunk's gradients. Twice the scan backward's arithmetic, a state
// per chunk on the wire each way.
#include "train/train_model.h"

namespace ss {

std::vector<LocalChunk> TrainModel::local_chunks(const TrainBatch& b) const {
  std::vector<LocalChunk> out;
  int64_t row = 0;
  for (int k = 0; k < int(b.layout.chunks.size()); ++k)
    if (b.layout.chunks[size_t(k)].second == m_par.sp_rank) {
      const Range r = b.layout.chunks[size_t(k)].first;
      out.push_back({k, row, r.second - r.first});
      row += r.second - r.first;
    }
  return out;
}

// Where chunk k sits in the all-gathered per-chunk buffers: its owner's
// block, then its index among the owner's chunks.
static int64_t gathered_slot(const StepLayout& l, int k, int per_rank) {
  int j = 0;
  for (int i = 0; i < k; ++i) j += l.chunks[size_t(i)].second == l.chunks[size_t(k)].second;
  return int64_t(l.chunks[size_t(k)].second) * per_rank + j;
}

Tensor TrainModel::conv_halos(int layer, const Tensor& x, const TrainBatch& b) {
  const std::vector<LocalChunk> mine = local_chunks(b);
  const int64_t K1 = m_cfg.d_conv - 1, C = x.cols(), n = int64_t(mine.size());
  const int S = m_par.sp_size;
  Recorder& rec = m_be.recorder();
  Tensor tails = m_be.alloc({n * K1, C}, Category::CommBuffers, "mixer.conv_tails", m_cfg.dtype);
  for (int64_t j = 0; j < n; ++j)
    m_be.copy(tails.slice(0, j * K1, K1), x.slice(0, mine[size_t(j)].row + mine[size_t(j)].len - K1, K1));
  Tensor all = m_be.alloc({S * n * K1, C}, Category::CommBuffers, "mixer.conv_tails_gathered", m_cfg.dtype);
  {
    SiteScope sc(rec, layer, "mixer.conv_halo");
    m_par.sp->all_gather(all, tails);
  }
  Tensor halos = act({n * K1, C}, "mixer.conv_halo", m_cfg.dtype);
  for (int64_t j = 0; j < n; ++j) {
    const int k = mine[size_t(j)].seq;
    if (k == 0) m_be.fill(halos.slice(0, j * K1, K1), 0.0f);
    else m_be.copy(halos.slice(0, j * K1, K1), all.slice(0, gathered_slot(b.layout, k - 1, int(n)) * K1, K1));
  }
  return halos;
}

void TrainModel::conv_halo_backward(int layer, const Tensor& dx, const Tensor& dhalos, const TrainBatch& b) {
  const std::vector<LocalChunk> mine = local_chunks(b);
  const int64_t K1 = m_cfg.d_conv - 1, C = dx.cols(), n = int64_t(mine.size());
  const int S = m_par.sp_size;
  Tensor all = m_be.alloc({S * n * K1, C}, Category::CommBuffers, "mixer.conv_halo_grads", m_cfg.dtype);
  {
    SiteScope sc(m_be.recorder(), layer, "mixer.conv_halo_backward");
    m_par.sp->all_gather(all, dhalos);
  }
  // Chunk k's halo gradient belongs to chunk k-1's last rows.
  for (int64_t j = 0; j < n; ++j) {
    const int k = mine[size_t(j)].seq;
    if (k + 1 >= int(b.layout.chunks.size())) continue;
    const Tensor rows = dx.slice(0, mine[size_t(j)].row + mine[size_t(j)].len - K1, K1);
    m_be.add(rows, rows, all.slice(0, gathered_slot(b.layout, k + 1, int(n)) * K1, K1));
  }
}

TrainModel::PassedStates TrainModel::pass_states_forward(int layer, const TrainBatch& b, const StateOps& ops) {
  const std::vector<LocalChunk> mine = local_chunks(b);
  const int64_t n = int64_t(mine.size()), SN = ops.state_numel, DN = ops.decay_numel;
  const int S = m_par.sp_size;
  Tensor s0 = m_be.alloc({n, SN}, Category::CommBuffers, "mixer.chunk_states", DType::F32);
  PassedStates out;
  out.decays = act({n, DN}, "mixer.chunk_decays", DType::F32);  // kept: the backward's advance needs them
  const Tensor& d0 = out.decays;
  m_be.fill(s0, 0.0f);
  for (int64_t j = 0; j < n; ++j) ops.scan(mine[size_t(j)], s0.slice(0, j, 1), d0.slice(0, j, 1));
  Tensor s_all = m_be.alloc({S * n, SN}, Category::CommBuffers, "mixer.chunk_states_gathered", DType::F32);
  Tensor d_all = m_be.alloc({S * n, DN}, Category::CommBuffers, "mixer.chunk_decays_gathered", DType::F32);
  {
    SiteScope sc(m_be.recorder(), layer, "mixer.state_all_gather");
    m_par.sp->all_gather(s_all, s0);
    m_par.sp->all_gather(d_all, d0);
  }
  // Walk the chunks in sequence order, advancing the state through each.
  std::vector<Tensor>& incoming = out.incoming;
  incoming.resize(size_t(n));
  Tensor state = m_be.alloc({1, SN}, Category::Workspace, "mixer.state_walk", DType::F32);
  m_be.fill(state, 0.0f);
  const int last = mine.back().seq;
  for (int k = 0; k <= last; ++k) {
    for (int64_t j = 0; j < n; ++j)
      if (mine[size_t(j)].seq == k) {
        incoming[size_t(j)] = act({1, SN}, "mixer.state_in", DType::F32);
        m_be.copy(incoming[size_t(j)], state);
        ops.correct(mine[size_t(j)], incoming[size_t(j)]);
      }
    const int64_t slot = gathered_slot(b.layout, k, int(n));
    ops.advance(state, s_all.slice(0, slot, 1), d_all.slice(0, slot, 1));
  }
  return out;
}

void TrainModel::pass_states_backward(int layer, const TrainBatch& b, const StateOps& ops,
                                      const PassedStates& passed) {
  const std::vector<Tensor>& incoming = passed.incoming;
  const std::vector<LocalChunk> mine = local_chunks(b);
  const int64_t n = int64_t(mine.size()), SN = ops.state_numel, DN = ops.decay_numel;
  const int S = m_par.sp_size, chunks = int(b.layout.chunks.size());
  // Pass 1: each chunk's initial-state gradient through its own outputs (b_k).
  Tensor bk = m_be.alloc({n, SN}, Category::CommBuffers, "mixer.state_grads", DType::F32);
  for (int64_t j = 0; j < n; ++j)
    ops.backward(mine[size_t(j)], incoming[size_t(j)], Tensor{}, bk.slice(0, j, 1), /*scratch=*/true);
  Tensor b_all = m_be.alloc({S * n, SN}, Category::CommBuffers, "mixer.state_grads_gathered", DType::F32);
  Tensor d_all = m_be.alloc({S * n, DN}, Category::CommBuffers, "mixer.chunk_decays_gathered", DType::F32);
  {
    SiteScope sc(m_be.recorder(), layer, "mixer.state_grad_all_gather");
    m_par.sp->all_gather(b_all, bk);
    m_par.sp->all_gather(d_all, passed.decays);
  }
  // From the last chunk back: the gradient at chunk k's final state is chunk k+1's initial-state gradient.
  Tensor g = m_be.alloc({1, SN}, Category::Workspace, "mixer.state_grad_walk", DType::F32);
  m_be.fill(g, 0.0f);
  for (int k = chunks - 1; k >= mine.front().seq; --k) {
    for (int64_t j = 0; j < n; ++j)
      if (mine[size_t(j)].seq == k) ops.backward(mine[size_t(j)], incoming[size_t(j)], g, Tensor{}, false);
    const int64_t slot = gathered_slot(b.layout, k, int(n));
    ops.advance(g, b_all.slice(0, slot, 1), d_all.slice(0, slot, 1));
  }
}

}  // namespace ss
