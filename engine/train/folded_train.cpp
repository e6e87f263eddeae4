// Training under tsp (folded tensor and sequence parallelism): Llama layers.
//
// Forward as inference's (model/folded.cpp): each rank holds 1/D of every
// projection and 1/D of the tokens; attention's QKV and O shards are
// broadcast in turns, the MLP's circulate on the ring; every rank computes
// its own tokens with every shard and keeps what backward needs for them
// (q, k, v, o and the MLP's gate, up and activation over all heads and
// columns: the activations of sequence parallelism, the weights of tensor
// parallelism).
//
// Backward streams every pack on the ring again, the weight shard one step
// ahead of the GEMMs, and each shard's gradient travels with it: at step t
// rank r holds shard j = (r - t) mod D, adds its own tokens' contribution to
// the partial gradient that rank r-1 passed on, and passes the sum to r+1
// while it computes the next step. After D steps the partial is complete and
// lands on its owner: no rank ever holds a whole weight or a whole gradient.
// (The forward's broadcast turns become ring steps in backward: a reduce to
// each owner in turn moves the same bytes, and the ring lets the gradient
// ride behind the weights.) Per pack and rank: D-1 weight shards and D
// gradient shards sent. Mirrored parameters (norms, embeddings, head) are
// summed over the group as under sp.
#include "train/train_model.h"

#include <algorithm>

#include "core/error.h"

namespace ss {

const WeightPack& TrainModel::pack_of(int layer, const std::string& name) const {
  for (const WeightPack& p : m_model.packs())
    if (p.layer == layer && p.name == name) return p;
  throw std::logic_error("no pack " + name + " in layer " + std::to_string(layer));
}

void TrainModel::ring_backward(const WeightPack& p, const GradStep& step) {
  Communicator* comm = m_par.sp;
  const int D = comm->size(), me = comm->rank();
  Recorder& rec = m_be.recorder();
  if (D == 1) {  // one rank (a single-device tsp): the contribution is the gradient
    const Tensor once = m_be.alloc({p.numel}, Category::Workspace, p.name + ".grad", DType::F32);
    step(0, m_model.pack_views(p, p.flat), m_model.pack_views(p, once));
    m_be.add(m_pack_grads.at(&p).reshape({1, p.numel}), m_pack_grads.at(&p).reshape({1, p.numel}),
             once.reshape({1, p.numel}));
    return;
  }
  SiteScope site(rec, p.layer, p.name + ".ring_backward");
  // Five shard buffers (two weight shards, two partial gradients, one
  // arriving partial), allocated once for the largest pack and kept: fresh
  // pages at every pack would cost their first touch inside the ring.
  if (!m_ring[0].defined() || m_ring[0].numel() < p.numel) {
    int64_t most = 0;
    for (const WeightPack& q : m_model.packs()) most = std::max(most, q.numel);
    const char* names[5] = {"ring.shard_a", "ring.shard_b", "ring.grad_a", "ring.grad_b", "ring.grad_in"};
    for (int k = 0; k < 5; ++k)  // weight shards in the compute dtype, gradients in fp32 as the gradients are
      m_ring[k] = m_be.alloc({most}, Category::CommBuffers, names[k], k < 2 ? m_cfg.dtype : DType::F32);
  }
  const Tensor wbuf[2] = {m_ring[0].slice(0, 0, p.numel), m_ring[1].slice(0, 0, p.numel)};
  const Tensor mine[2] = {m_ring[2].slice(0, 0, p.numel), m_ring[3].slice(0, 0, p.numel)};
  const Tensor incoming = m_ring[4].slice(0, 0, p.numel);
  Tensor cur = p.flat;
  Request grad_req;  // the partial of this step's shard, arriving from rank me-1
  for (int t = 0; t < D; ++t) {
    Request wreq;
    Tensor next;
    if (t + 1 < D) {
      next = wbuf[t % 2];
      wreq = comm->isendrecv(cur, (me + 1) % D, next, (me + D - 1) % D);
    }
    const Tensor& g = mine[t % 2];  // written whole by step: no clearing
    // The previous pack's last partial may still be leaving from this very
    // buffer (an odd D ends on it): then it must land first.
    if (t == 0 && m_ring_pending.req && m_ring_pending.slot == 0) finish_ring();
    step((me - t + D) % D, m_model.pack_views(p, cur), m_model.pack_views(p, g));
    if (t == 0) finish_ring();  // else it arrived during this compute
    if (grad_req) {
      grad_req->wait();
      m_be.add(g.reshape({1, p.numel}), g.reshape({1, p.numel}), incoming.reshape({1, p.numel}));
    }
    // Pass the partial on (after the last step it is complete, for rank me+1,
    // which owns that shard) while the next step computes.
    grad_req = comm->isendrecv(g, (me + 1) % D, incoming, (me + D - 1) % D);
    if (wreq) {
      wreq->wait();
      cur = next;
    }
  }
  // The last transfer brings this rank its own shard's complete gradient; it
  // is added when the next pack (or the end of backward) needs the buffer,
  // so it travels during the compute that follows.
  m_ring_pending = {grad_req, m_pack_grads.at(&p), incoming, (D - 1) % 2};
}

void TrainModel::finish_ring() {
  if (!m_ring_pending.req) return;
  m_ring_pending.req->wait();
  const Tensor& flat = m_ring_pending.grad;
  const int64_t n = flat.numel();
  m_be.add(flat.reshape({1, n}), flat.reshape({1, n}), m_ring_pending.incoming.reshape({1, n}));
  m_ring_pending = {};
}

void TrainModel::folded_forward(int i, const Tensor& x_in, const Tensor& x_out, const TrainBatch& b, Saved& s,
                                bool keep) {
  const ModelConfig& c = m_cfg;
  const Layer& L = m_layers[size_t(i)];
  Recorder& rec = m_be.recorder();
  const int D = m_par.sp_size;
  const int64_t R = x_in.rows(), d = c.d_model, hd = c.head_dim;
  const int64_t hq = int64_t(c.n_heads) * hd, hkv = int64_t(c.n_kv_heads) * hd, qs = hq / D, ks = hkv / D;
  const int64_t F = c.ffn_dim, fs = F / D;
  const DType dt = c.dtype;
  const std::vector<int32_t> pos_rows = row_positions(b);
  s.x_in = x_in;
  s.h1 = act({R, d}, "attn.norm", dt);
  {
    SiteScope sc(rec, i, "attn.norm");
    m_be.rmsnorm(s.h1, x_in, L.in_norm, c.norm_eps, d);
  }
  s.q = act({R, hq}, "attn.q", dt);
  s.k = act({R, hkv}, "attn.k", dt);
  s.v = act({R, hkv}, "attn.v", dt);
  m_model.stream_pack(pack_of(i, "attn.qkv"), [&](int j, const std::vector<Tensor>& w) {
    SiteScope sc(rec, i, "attn.qkv");
    m_be.matmul(s.q.slice(1, j * qs, qs), s.h1, w[0]);
    m_be.matmul(s.k.slice(1, j * ks, ks), s.h1, w[1]);
    m_be.matmul(s.v.slice(1, j * ks, ks), s.h1, w[2]);
  });
  {
    // The biases are whole on every rank under tsp.
    SiteScope sc(rec, i, "attn.qkv");
    add_bias(s.q, L.q_b);
    add_bias(s.k, L.k_b);
    add_bias(s.v, L.v_b);
  }
  {
    SiteScope sc(rec, i, "attn.rope");
    m_be.rope(s.q, c.n_heads, int(hd), pos_rows, m_model.rope_freqs());
    m_be.rope(s.k, c.n_kv_heads, int(hd), pos_rows, m_model.rope_freqs());
  }
  s.o = act({R, hq}, "attn.out", dt);
  s.lse = act({R, c.n_heads}, "attn.lse", DType::F32);
  attention(s.o, s.lse, s.q, s.k, s.v, b, i);
  s.x_mid = act({R, d}, "residual.mid", c.residual_dtype());
  m_be.copy(s.x_mid, x_in);
  m_model.stream_pack(pack_of(i, "attn.o"), [&](int j, const std::vector<Tensor>& w) {
    SiteScope sc(rec, i, "attn.o_proj");
    m_be.matmul(s.x_mid, s.o.slice(1, j * qs, qs), w[0], true);
  });
  add_bias(s.x_mid, L.o_b);
  s.h2 = act({R, d}, "mlp.norm", dt);
  {
    SiteScope sc(rec, i, "mlp.norm");
    m_be.rmsnorm(s.h2, s.x_mid, L.post_norm, c.norm_eps, d);
  }
  s.g = act({R, F}, "mlp.gate", dt);
  s.u = act({R, F}, "mlp.up", dt);
  s.a = act({R, F}, "mlp.act", dt);
  m_be.copy(x_out, s.x_mid);
  // Shard j's slice of a whole bias (or none).
  auto shard = [fs](const Tensor& b, int j) { return b.defined() ? b.slice(0, j * fs, fs) : Tensor(); };
  m_model.stream_pack(pack_of(i, "mlp"), [&](int j, const std::vector<Tensor>& w) {
    SiteScope sc(rec, i, "mlp.shard");
    const Tensor g = s.g.slice(1, j * fs, fs), u = s.u.slice(1, j * fs, fs), a = s.a.slice(1, j * fs, fs);
    m_be.matmul(g, s.h2, w[0]);
    m_be.matmul(u, s.h2, w[1]);
    add_bias(g, shard(L.gate_b, j));
    add_bias(u, shard(L.up_b, j));
    m_be.silu_mul(a, g, u);
    m_be.matmul(x_out, a, w[2], true);
  });
  add_bias(x_out, L.down_b);
  if (!keep) {
    const Tensor x = s.x_in;
    s = Saved{};
    s.x_in = x;
  } else if (m_rc == Recompute::Selective) {
    s.h1 = s.h2 = s.a = Tensor{};
  }
}

void TrainModel::folded_backward(int i, const Tensor& dx, const TrainBatch& b, Saved& s) {
  const ModelConfig& c = m_cfg;
  const Layer& L = m_layers[size_t(i)];
  Recorder& rec = m_be.recorder();
  const int D = m_par.sp_size;
  const int64_t R = dx.rows(), d = c.d_model, hd = c.head_dim;
  const int64_t hq = int64_t(c.n_heads) * hd, hkv = int64_t(c.n_kv_heads) * hd, qs = hq / D, ks = hkv / D;
  const int64_t F = c.ffn_dim, fs = F / D;
  const DType dt = c.dtype;
  const std::vector<int32_t> pos_rows = row_positions(b);
  recompute(i, b, s);
  // MLP, shard by shard around the ring.
  {
    Tensor dh2 = work({R, d}, "grad.mlp.norm", dt);
    m_be.fill(dh2, 0.0f);
    Tensor da = work({R, fs}, "grad.mlp.act", dt), dg = work({R, fs}, "grad.mlp.gate", dt),
           du = work({R, fs}, "grad.mlp.up", dt);
    auto shard = [fs](const Tensor& b, int j) { return b.defined() ? b.slice(0, j * fs, fs) : Tensor(); };
    bias_backward(L.g_down_b, dx);
    ring_backward(pack_of(i, "mlp"), [&](int j, const std::vector<Tensor>& w, const std::vector<Tensor>& gw) {
      SiteScope sc(rec, i, "mlp.shard.backward");
      m_be.matmul_dx(da, dx, w[2], false);
      m_be.matmul_dw(gw[2], dx, s.a.slice(1, j * fs, fs), false);
      m_be.silu_mul_backward(dg, du, da, s.g.slice(1, j * fs, fs), s.u.slice(1, j * fs, fs));
      bias_backward(shard(L.g_gate_b, j), dg);
      bias_backward(shard(L.g_up_b, j), du);
      m_be.matmul_dx(dh2, dg, w[0], true);
      m_be.matmul_dx(dh2, du, w[1], true);
      m_be.matmul_dw(gw[0], dg, s.h2, false);
      m_be.matmul_dw(gw[1], du, s.h2, false);
    });
    s.g = s.u = s.a = s.h2 = Tensor{};
    SiteScope sc(rec, i, "mlp.norm.backward");
    m_be.rmsnorm_backward(dx, L.g_post_norm, dh2, s.x_mid, L.post_norm, c.norm_eps, d);
  }
  s.x_mid = Tensor{};
  Tensor dh1 = work({R, d}, "grad.attn.norm", dt);
  {
    Tensor dout = work({R, hq}, "grad.attn.out", dt);
    bias_backward(L.go_b, dx);
    ring_backward(pack_of(i, "attn.o"), [&](int j, const std::vector<Tensor>& w, const std::vector<Tensor>& gw) {
      SiteScope sc(rec, i, "attn.o_proj.backward");
      m_be.matmul_dx(dout.slice(1, j * qs, qs), dx, w[0], false);
      m_be.matmul_dw(gw[0], dx, s.o.slice(1, j * qs, qs), false);
    });
    Tensor dq = work({R, hq}, "grad.attn.q", dt), dk = work({R, hkv}, "grad.attn.k", dt),
           dv = work({R, hkv}, "grad.attn.v", dt);
    attention_grad(dq, dk, dv, dout, s.q, s.k, s.v, s.o, s.lse, b, i);
    dout = Tensor{};
    s.q = s.k = s.v = s.o = s.lse = Tensor{};
    {
      SiteScope sc(rec, i, "attn.rope.backward");
      m_be.rope_backward(dq, c.n_heads, int(hd), pos_rows, m_model.rope_freqs());
      m_be.rope_backward(dk, c.n_kv_heads, int(hd), pos_rows, m_model.rope_freqs());
    }
    bias_backward(L.gq_b, dq);
    bias_backward(L.gk_b, dk);
    bias_backward(L.gv_b, dv);
    m_be.fill(dh1, 0.0f);
    ring_backward(pack_of(i, "attn.qkv"), [&](int j, const std::vector<Tensor>& w, const std::vector<Tensor>& gw) {
      SiteScope sc(rec, i, "attn.qkv.backward");
      const Tensor dqj = dq.slice(1, j * qs, qs), dkj = dk.slice(1, j * ks, ks), dvj = dv.slice(1, j * ks, ks);
      m_be.matmul_dx(dh1, dqj, w[0], true);
      m_be.matmul_dx(dh1, dkj, w[1], true);
      m_be.matmul_dx(dh1, dvj, w[2], true);
      m_be.matmul_dw(gw[0], dqj, s.h1, false);
      m_be.matmul_dw(gw[1], dkj, s.h1, false);
      m_be.matmul_dw(gw[2], dvj, s.h1, false);
    });
  }
  s.h1 = Tensor{};
  SiteScope sc(rec, i, "attn.norm.backward");
  m_be.rmsnorm_backward(dx, L.g_in_norm, dh1, s.x_in, L.in_norm, c.norm_eps, d);
}

}  // namespace ss
