// tsp, folded tensor and sequence parallelism (arXiv 2604.26294): every rank
// holds 1/D of each projection matrix AND 1/D of the tokens (zigzag). A block
// computes its own tokens with every shard in turn: attention's packed QKV and
// O shards are broadcast by their owners in turn, the MLP's and the Mamba
// mixers' shards circulate on a ring with point-to-point transfers, and the
// next shard's transfer is in flight while the current shard's GEMMs run. No
// all-reduce: each rank accumulates its own tokens' outputs. Attention then
// all-gathers K/V along the sequence, and the Mamba scans pass states between
// ranks as in sp (model/blocks.cpp).
#include <array>
#include <cmath>

#include "model/model.h"

namespace ss {

std::vector<Tensor> Model::pack_views(const WeightPack& p, const Tensor& flat) const {
  std::vector<Tensor> out;
  int64_t off = 0;
  for (size_t m : p.members) {
    const Shape shape = m_specs[m].local_shape();
    out.push_back(flat.slice(0, off, numel(shape)).reshape(shape));
    off += numel(shape);
  }
  return out;
}

void Model::stream_pack(const WeightPack& p, const std::function<void(int, const std::vector<Tensor>&)>& compute) {
  Communicator* comm = m_par.sp;
  const int D = comm ? comm->size() : 1, me = comm ? comm->rank() : 0;
  if (D == 1) {
    compute(0, pack_views(p, p.flat));
    return;
  }
  Recorder& rec = m_be.recorder();
  SiteScope site(rec, p.layer, p.name + (p.ring ? ".ring" : ".broadcast"));
  const Tensor buf[2] = {m_be.alloc({p.numel}, Category::CommBuffers, p.name + ".shard_a", m_cfg.dtype),
                         m_be.alloc({p.numel}, Category::CommBuffers, p.name + ".shard_b", m_cfg.dtype)};
  if (p.ring) {
    // Step t: compute with shard (me - t) mod D while passing it to the next rank.
    Tensor cur = p.flat;
    for (int t = 0; t < D; ++t) {
      Request req;
      Tensor next;
      if (t + 1 < D) {
        next = buf[t % 2];
        req = comm->isendrecv(cur, (me + 1) % D, next, (me + D - 1) % D);
      }
      compute((me - t + D) % D, pack_views(p, cur));
      if (req) {
        req->wait();
        cur = next;
      }
    }
    return;
  }
  // Turn j: rank j broadcasts its shard; turn j+1 is posted before turn j computes.
  auto post = [&](int j) {
    Tensor b = j == me ? p.flat : buf[j % 2];
    return std::make_pair(b, comm->ibroadcast(b, j));
  };
  auto [cur, req] = post(0);
  for (int j = 0; j < D; ++j) {
    req->wait();
    const Tensor here = cur;
    if (j + 1 < D) std::tie(cur, req) = post(j + 1);
    compute(j, pack_views(p, here));
  }
}

void Model::attention_block_folded(int layer, const Tensor& x, std::span<const int32_t> positions, Cache& cache,
                                   const StepLayout& layout) {
  const ModelConfig& c = m_cfg;
  const AttentionWeights& w = m_layers[size_t(layer)].attn;
  LayerCache& lc = cache.layers[size_t(layer)];
  Recorder& rec = m_be.recorder();
  const auto& packs = m_layer_packs[size_t(layer)];
  const int D = m_par.sp_size;
  const int64_t T = x.rows(), hq = int64_t(c.n_heads) * c.head_dim, hkv = int64_t(c.n_kv_heads) * c.head_dim;
  const int64_t qs = hq / D, ks = hkv / D;
  const bool keep_kv = layout.sequence_sharded || D == 1 || layout.kv_owner == m_par.sp_rank;
  const int64_t held = cache.length() - (keep_kv ? T : 0);

  Tensor h = pre_norm(layer, x, w.in_norm, "attn.norm");
  Tensor q = m_be.alloc({T, hq}, Category::Activations, "attn.q", m_cfg.dtype);
  Tensor k = keep_kv ? lc.k.slice(0, held, T) : m_be.alloc({T, hkv}, Category::Activations, "attn.k", m_cfg.kv_dtype);
  Tensor v = keep_kv ? lc.v.slice(0, held, T) : m_be.alloc({T, hkv}, Category::Activations, "attn.v", m_cfg.kv_dtype);
  stream_pack(m_packs[packs[0]], [&](int j, const std::vector<Tensor>& qkv) {
    SiteScope s(rec, layer, "attn.qkv");
    m_be.matmul_group(std::array{q.slice(1, j * qs, qs), k.slice(1, j * ks, ks), v.slice(1, j * ks, ks)}, h,
                      std::array{qkv[0], qkv[1], qkv[2]});
  });
  h = Tensor();
  {
    SiteScope s(rec, layer, "attn.qkv");
    add_bias(q, w.q_b);
    add_bias(k, w.k_b);
    add_bias(v, w.v_b);
  }
  {
    SiteScope s(rec, layer, "attn.rope");
    m_be.rope(q, c.n_heads, c.head_dim, positions, m_rope_freqs);
    m_be.rope(k, c.n_kv_heads, c.head_dim, positions, m_rope_freqs);
  }
  Tensor o = m_be.alloc({T, hq}, Category::Activations, "attn.out", m_cfg.dtype);
  attend(layer, o, q, k, v, positions, cache, layout, c.n_heads, c.n_kv_heads);
  q = Tensor();
  stream_pack(m_packs[packs[1]], [&](int j, const std::vector<Tensor>& wo) {
    SiteScope s(rec, layer, "attn.o_proj");
    m_be.matmul(x, o.slice(1, j * qs, qs), wo[0], /*accumulate=*/true);
  });
  SiteScope s(rec, layer, "attn.o_proj");
  add_bias(x, w.o_b);
}

void Model::mlp_block_folded(int layer, const Tensor& x) {
  const AttentionWeights& w = m_layers[size_t(layer)].attn;
  Recorder& rec = m_be.recorder();
  const int64_t T = x.rows(), F = m_attn.ffn;
  Tensor h = pre_norm(layer, x, w.post_norm, "mlp.norm");
  Tensor g = m_be.alloc({T, F}, Category::Activations, "mlp.gate", m_cfg.dtype);
  Tensor u = m_be.alloc({T, F}, Category::Activations, "mlp.up", m_cfg.dtype);
  // Shard j holds intermediate columns [j F, (j+1) F); the biases are whole here.
  auto bias = [&](const Tensor& b, int j) { return b.defined() ? b.slice(0, int64_t(j) * F, F) : Tensor(); };
  stream_pack(m_packs[m_layer_packs[size_t(layer)][2]], [&](int j, const std::vector<Tensor>& mlp) {
    SiteScope s(rec, layer, "mlp.shard");
    m_be.matmul_group(std::array{g, u}, h, std::array{mlp[0], mlp[1]});
    add_bias(g, bias(w.gate_b, j));
    add_bias(u, bias(w.up_b, j));
    m_be.silu_mul(g, g, u);
    m_be.matmul(x, g, mlp[2], /*accumulate=*/true);
  });
  SiteScope s(rec, layer, "mlp.down");
  add_bias(x, w.down_b);
}

void Model::mamba2_block_folded(int layer, const Tensor& x, Cache& cache, const StepLayout& layout) {
  const ModelConfig& c = m_cfg;
  const Mamba2Weights& w = m_layers[size_t(layer)].m2;
  Recorder& rec = m_be.recorder();
  const auto& packs = m_layer_packs[size_t(layer)];
  const int D = m_par.sp_size, P = c.ssm_head_dim;
  const int64_t T = x.rows(), Di = c.d_inner, N = c.d_state, GN = int64_t(c.n_groups) * N;

  Tensor h = pre_norm(layer, x, w.norm, "mixer.norm");
  // Each shard's rows are packed [z_j, x_j, B_j, C_j, dt_j]: put its columns back in place.
  Tensor zxbcdt = m_be.alloc({T, c.in_proj_dim()}, Category::Activations, "mixer.in_proj", m_cfg.dtype);
  const int64_t width = m_specs[m_packs[packs[0]].members[0]].local_shape()[0];
  Tensor part = m_be.alloc({T, width}, Category::Activations, "mixer.in_proj_shard", m_cfg.dtype);
  stream_pack(m_packs[packs[0]], [&](int j, const std::vector<Tensor>& in) {
    SiteScope s(rec, layer, "mixer.in_proj");
    m_be.matmul(part, h, in[0]);
    const Mamba2Shard m = mamba2_shard(c, j, D);
    const int64_t hx = int64_t(m.heads) * P, g0 = m.group0 * N, gn = int64_t(m.groups) * N;
    int64_t at = 0;
    for (auto [dst, n] : {std::pair<int64_t, int64_t>{m.head0 * P, hx}, {Di + m.head0 * P, hx}, {2 * Di + g0, gn},
                          {2 * Di + GN + g0, gn}, {2 * Di + 2 * GN + m.head0, m.heads}}) {
      m_be.copy(zxbcdt.slice(1, dst, n), part.slice(1, at, n));
      at += n;
    }
  });
  part = Tensor();
  h = Tensor();
  Tensor y = mamba2_mix(layer, zxbcdt, cache, layout, c.ssm_heads, c.n_groups, w);
  zxbcdt = Tensor();
  stream_pack(m_packs[packs[1]], [&](int j, const std::vector<Tensor>& out) {
    SiteScope s(rec, layer, "mixer.out_proj");
    const Mamba2Shard m = mamba2_shard(c, j, D);
    m_be.matmul(x, y.slice(1, m.head0 * P, int64_t(m.heads) * P), out[0], /*accumulate=*/true);
  });
}

void Model::mamba_block_folded(int layer, const Tensor& x, Cache& cache, const StepLayout& layout) {
  const ModelConfig& c = m_cfg;
  const MambaWeights& w = m_layers[size_t(layer)].m1;
  Recorder& rec = m_be.recorder();
  const auto& packs = m_layer_packs[size_t(layer)];
  const int64_t T = x.rows(), Di = c.d_inner, N = c.d_state, R = c.dt_rank, Ds = m_m1.channels;

  Tensor h = pre_norm(layer, x, w.norm, "mixer.norm");
  Tensor xz = m_be.alloc({T, 2 * Di}, Category::Activations, "mixer.in_proj", m_cfg.dtype);
  Tensor part = m_be.alloc({T, 2 * Ds}, Category::Activations, "mixer.in_proj_shard", m_cfg.dtype);
  stream_pack(m_packs[packs[0]], [&](int j, const std::vector<Tensor>& in) {
    SiteScope s(rec, layer, "mixer.in_proj");
    m_be.matmul(part, h, in[0]);
    m_be.copy(xz.slice(1, j * Ds, Ds), part.slice(1, 0, Ds));
    m_be.copy(xz.slice(1, Di + j * Ds, Ds), part.slice(1, Ds, Ds));
  });
  part = Tensor();
  h = Tensor();
  Tensor xc = m_be.alloc({T, Di}, Category::Activations, "mixer.conv", m_cfg.dtype);
  mamba_conv(layer, xc, xz, cache, layout, w);
  // x_proj shards are column (channel) slices: their products sum to (dt, B, C).
  Tensor dbc = m_be.alloc({T, R + 2 * N}, Category::Activations, "mixer.x_proj", m_cfg.dtype);
  m_be.fill(dbc, 0.0f);
  stream_pack(m_packs[packs[1]], [&](int j, const std::vector<Tensor>& xp) {
    SiteScope s(rec, layer, "mixer.x_proj");
    m_be.matmul(dbc, xc.slice(1, j * Ds, Ds), xp[0], /*accumulate=*/true);
  });
  const Tensor dt_low = dbc.slice(1, 0, R), B = dbc.slice(1, R, N), C = dbc.slice(1, R + N, N);
  bcdt_norm(layer, dt_low, B, C);
  Tensor dt = m_be.alloc({T, Di}, Category::Activations, "mixer.dt", m_cfg.dtype);
  stream_pack(m_packs[packs[2]], [&](int j, const std::vector<Tensor>& dp) {
    SiteScope s(rec, layer, "mixer.dt_proj");
    m_be.matmul(dt.slice(1, j * Ds, Ds), dt_low, dp[0]);
  });
  Tensor y = m_be.alloc({T, Di}, Category::Activations, "mixer.scan", m_cfg.dtype);
  mamba_scan(layer, y, xc, dt, xz.slice(1, Di, Di), B, C, cache, layout, w);
  stream_pack(m_packs[packs[3]], [&](int j, const std::vector<Tensor>& op) {
    SiteScope s(rec, layer, "mixer.out_proj");
    m_be.matmul(x, y.slice(1, j * Ds, Ds), op[0], /*accumulate=*/true);
  });
}

}  // namespace ss
