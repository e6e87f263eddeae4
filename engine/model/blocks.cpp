// The residual blocks. Each reads the residual stream x [T, d_model] and adds
// its output to it in place. Under tensor parallelism the output projection
// is row-parallel: a partial sum reduced over the tp group (reduce_into).
// Under sequence parallelism (prefill) each rank holds its own chunks:
// attention all-gathers K/V, Mamba layers take a conv halo from the previous
// chunk and pass scan states between chunks (ranks act as SSD chunks).
#include <array>
#include <cmath>

#include "model/model.h"

namespace ss {
namespace {

std::vector<LocalChunk> local_chunks(const StepLayout& l, int sp_rank) {
  std::vector<LocalChunk> out;
  int64_t row = 0;
  for (int k = 0; k < int(l.chunks.size()); ++k)
    if (l.chunks[size_t(k)].second == sp_rank) {
      const int64_t len = l.chunks[size_t(k)].first.second - l.chunks[size_t(k)].first.first;
      out.push_back({k, row, len});
      row += len;
    }
  return out;
}
// Index of chunk k among its owner's chunks.
int index_at_owner(const StepLayout& l, int k) {
  int j = 0;
  for (int i = 0; i < k; ++i) j += l.chunks[size_t(i)].second == l.chunks[size_t(k)].second;
  return j;
}

}  // namespace

void StepLayout::append_positions(int r, std::vector<int32_t>& out) const {
  size_t n = out.size();
  for (auto& [range, owner] : chunks)
    if (owner == r) n += size_t(range.second - range.first);
  out.reserve(n);
  for (auto& [range, owner] : chunks)
    if (owner == r)
      for (int64_t p = range.first; p < range.second; ++p) out.push_back(int32_t(p));
}

// Falcon-Mamba RMS-normalises x_proj's (dt, B, C) without weights; Mamba does not.
void Model::bcdt_norm(int layer, const Tensor& dt_low, const Tensor& B, const Tensor& C) {
  if (!m_cfg.bcdt_rms) return;
  SiteScope s(m_be.recorder(), layer, "mixer.bcdt_norm");
  m_be.rmsnorm(dt_low, dt_low, Tensor{}, m_cfg.mixer_rms_eps, dt_low.cols());
  m_be.rmsnorm(B, B, Tensor{}, m_cfg.mixer_rms_eps, B.cols());
  m_be.rmsnorm(C, C, Tensor{}, m_cfg.mixer_rms_eps, C.cols());
}

// The RMSNorm every residual block starts with, into a fresh activation.
Tensor Model::pre_norm(int layer, const Tensor& x, const Tensor& weight, const char* site) {
  Tensor h = m_be.alloc({x.rows(), m_cfg.d_model}, Category::Activations, site, m_cfg.dtype);
  SiteScope s(m_be.recorder(), layer, site);
  m_be.rmsnorm(h, x, weight, m_cfg.norm_eps, m_cfg.d_model);
  return h;
}

// Llama attention: x += o_proj(attention(rope(q), rope(k), v)) over the cache.
void Model::attention_block(int layer, const Tensor& x, std::span<const int32_t> positions, Cache& cache,
                            const StepLayout& layout) {
  const ModelConfig& c = m_cfg;
  const AttentionWeights& w = m_layers[size_t(layer)].attn;
  LayerCache& lc = cache.layers[size_t(layer)];
  Recorder& rec = m_be.recorder();
  const int S = m_par.sp_size;
  const int64_t T = x.rows(), hq = int64_t(m_attn.heads) * c.head_dim, hkv = int64_t(m_attn.kv_heads) * c.head_dim;
  const bool keep_kv = layout.sequence_sharded || S == 1 || layout.kv_owner == m_par.sp_rank;
  const int64_t held = cache.length() - (keep_kv ? T : 0);  // tokens cached before this call

  Tensor h = pre_norm(layer, x, w.in_norm, "attn.norm");
  Tensor q = m_be.alloc({T, hq}, Category::Activations, "attn.q", m_cfg.dtype);
  // K and V go straight into the cache, or into temporaries on ranks that do not keep this token.
  Tensor k = keep_kv ? lc.k.slice(0, held, T) : m_be.alloc({T, hkv}, Category::Activations, "attn.k", m_cfg.kv_dtype);
  Tensor v = keep_kv ? lc.v.slice(0, held, T) : m_be.alloc({T, hkv}, Category::Activations, "attn.v", m_cfg.kv_dtype);
  {
    SiteScope s(rec, layer, "attn.qkv");
    m_be.matmul_group(std::array{q, k, v}, h, std::array{w.q, w.k, w.v});
    add_bias(q, w.q_b);
    add_bias(k, w.k_b);
    add_bias(v, w.v_b);
  }
  {
    SiteScope s(rec, layer, "attn.rope");
    m_be.rope(q, m_attn.heads, c.head_dim, positions, m_rope_freqs);
    m_be.rope(k, m_attn.kv_heads, c.head_dim, positions, m_rope_freqs);
  }
  h = Tensor();
  Tensor o = m_be.alloc({T, hq}, Category::Activations, "attn.out", m_cfg.dtype);
  attend(layer, o, q, k, v, positions, cache, layout, m_attn.heads, m_attn.kv_heads);
  q = Tensor();
  SiteScope s(rec, layer, "attn.o_proj");
  project_out(layer, x, o, w.o, "attn", "attn.o_partial");
  add_bias(x, w.o_b);
}

void Model::attend(int layer, const Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v,
                   std::span<const int32_t> positions, Cache& cache, const StepLayout& layout, int heads,
                   int kv_heads) {
  const ModelConfig& c = m_cfg;
  LayerCache& lc = cache.layers[size_t(layer)];
  Recorder& rec = m_be.recorder();
  const int S = m_par.sp_size;
  const int64_t T = q.rows(), hq = int64_t(heads) * c.head_dim, hkv = int64_t(kv_heads) * c.head_dim;
  const bool keep_kv = layout.sequence_sharded || S == 1 || layout.kv_owner == m_par.sp_rank;
  const int64_t held = cache.length() - (keep_kv ? T : 0);
  AttentionArgs a;
  a.n_heads = heads;
  a.n_kv_heads = kv_heads;
  a.head_dim = c.head_dim;
  a.scale = 1.0f / std::sqrt(float(c.head_dim));
  a.q_pos = positions;
  if (layout.sequence_sharded && S > 1 && m_par.ring_attention) {
    // Prefill, ring: K/V blocks travel around the sp ring; each step's partial
    // is merged by log-sum-exp while the next block is in flight.
    const int me = m_par.sp_rank;
    Tensor lse = m_be.alloc({T, heads}, Category::Activations, "attn.lse", DType::F32);
    Tensor o2 = m_be.alloc({T, hq}, Category::Activations, "attn.partial", m_cfg.dtype);
    Tensor lse2 = m_be.alloc({T, heads}, Category::Activations, "attn.lse_partial", DType::F32);
    // Two blocks: one computed on (and sent on), one being received.
    const Tensor blocks[2] = {m_be.alloc({T, 2 * hkv}, Category::CommBuffers, "attn.kv_block_a", m_cfg.kv_dtype),
                              m_be.alloc({T, 2 * hkv}, Category::CommBuffers, "attn.kv_block_b", m_cfg.kv_dtype)};
    m_be.copy(blocks[0].slice(1, 0, hkv), k);
    m_be.copy(blocks[0].slice(1, hkv, hkv), v);
    for (int step = 0; step < S; ++step) {
      const Tensor& cur = blocks[step % 2];
      Request next;
      if (step + 1 < S) {
        SiteScope s(rec, layer, "attn.kv_ring");
        next = m_par.sp->isendrecv(cur, (me + 1) % S, blocks[(step + 1) % 2], (me + S - 1) % S);
      }
      const std::vector<int32_t> kp = layout.positions((me - step + S) % S);
      a.k_pos = kp;
      {
        SiteScope s(rec, layer, "attn.core");
        if (step == 0) m_be.attention(o, q, cur.slice(1, 0, hkv), cur.slice(1, hkv, hkv), a, lse);
        else {
          m_be.attention(o2, q, cur.slice(1, 0, hkv), cur.slice(1, hkv, hkv), a, lse2);
          m_be.attention_merge(o, lse, o2, lse2, heads, c.head_dim);
        }
      }
      if (next) next->wait();
    }
  } else if (layout.sequence_sharded && S > 1) {
    // Prefill: gather every rank's K/V (their positions follow from the chunk layout).
    Tensor k_all = m_be.alloc({S * T, hkv}, Category::CommBuffers, "attn.k_gathered", m_cfg.kv_dtype);
    Tensor v_all = m_be.alloc({S * T, hkv}, Category::CommBuffers, "attn.v_gathered", m_cfg.kv_dtype);
    {
      SiteScope s(rec, layer, "attn.kv_all_gather");
      m_par.sp->all_gather(k_all, k);
      m_par.sp->all_gather(v_all, v);
    }
    std::vector<int32_t> k_pos;
    k_pos.reserve(size_t(S * T));
    for (int r = 0; r < S; ++r) layout.append_positions(r, k_pos);
    a.k_pos = k_pos;
    SiteScope s(rec, layer, "attn.core");
    m_be.attention(o, q, k_all, v_all, a);
  } else if (S > 1) {
    // Decode: attend over this rank's K/V, then merge every rank's partial by log-sum-exp.
    Tensor lse = m_be.alloc({T, heads}, Category::Activations, "attn.lse", DType::F32);
    a.k_pos = std::span<const int32_t>(cache.positions.data(), cache.positions.size());
    {
      SiteScope s(rec, layer, "attn.core");
      m_be.attention(o, q, lc.k.slice(0, 0, cache.length()), lc.v.slice(0, 0, cache.length()), a, lse);
    }
    Tensor o_all = m_be.alloc({S * T, hq}, Category::CommBuffers, "attn.partials", m_cfg.dtype);
    Tensor lse_all = m_be.alloc({S * T, heads}, Category::CommBuffers, "attn.lse_partials", DType::F32);
    {
      SiteScope s(rec, layer, "attn.partial_all_gather");
      m_par.sp->all_gather(o_all, o);
      m_par.sp->all_gather(lse_all, lse);
    }
    SiteScope s(rec, layer, "attn.merge");
    m_be.copy(o, o_all.slice(0, 0, T));
    m_be.copy(lse, lse_all.slice(0, 0, T));
    for (int r = 1; r < S; ++r)
      m_be.attention_merge(o, lse, o_all.slice(0, r * T, T), lse_all.slice(0, r * T, T), heads, c.head_dim);
  } else {
    a.k_pos = std::span<const int32_t>(cache.positions.data(), size_t(held + T));
    SiteScope s(rec, layer, "attn.core");
    m_be.attention(o, q, lc.k.slice(0, 0, held + T), lc.v.slice(0, 0, held + T), a);
  }
}

// SwiGLU MLP: x += down(silu(gate(h)) * up(h)), h = rmsnorm(x).
void Model::mlp_block(int layer, const Tensor& x) {
  const AttentionWeights& w = m_layers[size_t(layer)].attn;
  Recorder& rec = m_be.recorder();
  const int64_t T = x.rows(), F = m_attn.ffn;
  Tensor h = pre_norm(layer, x, w.post_norm, "mlp.norm");
  Tensor g = m_be.alloc({T, F}, Category::Activations, "mlp.gate", m_cfg.dtype);
  Tensor u = m_be.alloc({T, F}, Category::Activations, "mlp.up", m_cfg.dtype);
  {
    SiteScope s(rec, layer, "mlp.gate_up");
    m_be.matmul_group(std::array{g, u}, h, std::array{w.gate, w.up});
    add_bias(g, w.gate_b);
    add_bias(u, w.up_b);
  }
  h = Tensor();
  {
    SiteScope s(rec, layer, "mlp.act");
    m_be.silu_mul(g, g, u);
  }
  u = Tensor();
  SiteScope s(rec, layer, "mlp.down");
  project_out(layer, x, g, w.down, "mlp", "mlp.down_partial");
  add_bias(x, w.down_b);
}

void Model::sharded_conv(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& state,
                         const StepLayout& layout) {
  const int64_t K1 = m_cfg.d_conv - 1, C = x.cols();
  const auto mine = local_chunks(layout, m_par.sp_rank);
  const int64_t nl = int64_t(mine.size()), S = m_par.sp_size;
  // Each chunk's last d_conv-1 inputs are the next chunk's halo: gather them all.
  Tensor tails = m_be.alloc({nl * K1, C}, Category::CommBuffers, "conv.tails", m_cfg.dtype);
  for (int64_t j = 0; j < nl; ++j)
    m_be.copy(tails.slice(0, j * K1, K1), x.slice(0, mine[size_t(j)].row + mine[size_t(j)].len - K1, K1));
  Tensor all = m_be.alloc({S * nl * K1, C}, Category::CommBuffers, "conv.halos", m_cfg.dtype);
  {
    SiteScope s(m_be.recorder(), m_be.recorder().layer(), "mixer.conv_halo");
    m_par.sp->all_gather(all, tails);
  }
  auto tail_of = [&](int k) {
    const int owner = layout.chunks[size_t(k)].second;
    return all.slice(0, (owner * nl + index_at_owner(layout, k)) * K1, K1);
  };
  Tensor halo = m_be.alloc({K1, C}, Category::Activations, "conv.halo", m_cfg.dtype);
  for (const LocalChunk& ch : mine) {
    if (ch.seq == 0) m_be.fill(halo, 0.0f);
    else m_be.copy(halo, tail_of(ch.seq - 1));
    m_be.conv1d_causal(y.slice(0, ch.row, ch.len), x.slice(0, ch.row, ch.len), w, b, halo, true);
  }
  // The sequence's last inputs: the conv state decode continues from.
  m_be.copy(state, tail_of(int(layout.chunks.size()) - 1));
}

// Mamba2 mixer: in_proj -> [z, xBC, dt]; conv1d+SiLU on xBC; SSD scan over
// (x, B, C, dt); gated RMSNorm with z; out_proj.
void Model::mamba2_block(int layer, const Tensor& x, Cache& cache, const StepLayout& layout) {
  const ModelConfig& c = m_cfg;
  const Mamba2Weights& w = m_layers[size_t(layer)].m2;
  Recorder& rec = m_be.recorder();
  const int H = m_m2.heads, G = m_m2.groups;
  const int64_t T = x.rows(), Di = int64_t(H) * c.ssm_head_dim, GN = int64_t(G) * c.d_state;

  Tensor h = pre_norm(layer, x, w.norm, "mixer.norm");
  Tensor zxbcdt = m_be.alloc({T, 2 * Di + 2 * GN + H}, Category::Activations, "mixer.in_proj", m_cfg.dtype);
  {
    SiteScope s(rec, layer, "mixer.in_proj");
    m_be.matmul(zxbcdt, h, w.in_proj);
  }
  h = Tensor();
  Tensor y = mamba2_mix(layer, zxbcdt, cache, layout, H, G, w);
  zxbcdt = Tensor();
  SiteScope s(rec, layer, "mixer.out_proj");
  project_out(layer, x, y, w.out_proj, "mixer", "mixer.out_partial");
}

Tensor Model::mamba2_mix(int layer, const Tensor& zxbcdt, Cache& cache, const StepLayout& layout, int H, int G,
                         const Mamba2Weights& w) {
  const ModelConfig& c = m_cfg;
  LayerCache& lc = cache.layers[size_t(layer)];
  Recorder& rec = m_be.recorder();
  const int P = c.ssm_head_dim, N = c.d_state;
  const int64_t T = zxbcdt.rows(), Di = int64_t(H) * P, GN = int64_t(G) * N, conv_dim = Di + 2 * GN;
  const bool seq = layout.sequence_sharded && m_par.sp_size > 1;
  const Tensor z = zxbcdt.slice(1, 0, Di);
  const Tensor xBC = zxbcdt.slice(1, Di, conv_dim);
  const Tensor dt = zxbcdt.slice(1, Di + conv_dim, H);
  Tensor xBCc = m_be.alloc({T, conv_dim}, Category::Activations, "mixer.conv", m_cfg.dtype);
  {
    SiteScope s(rec, layer, "mixer.conv");
    const Tensor cw = w.conv_w.reshape({conv_dim, c.d_conv});
    if (seq) sharded_conv(xBCc, xBC, cw, w.conv_b, lc.conv_state, layout);
    else m_be.conv1d_causal(xBCc, xBC, cw, w.conv_b, lc.conv_state, true);
  }
  Tensor y = m_be.alloc({T, Di}, Category::Activations, "mixer.scan", m_cfg.dtype);
  SsdArgs a;
  a.dt_bias = w.dt_bias;
  a.A_log = w.A_log;
  a.D = w.D;
  a.n_heads = H;
  a.head_dim = P;
  a.n_groups = G;
  a.d_state = N;
  a.chunk = c.chunk;
  a.dt_min = c.dt_min;
  a.dt_max = c.dt_max;
  auto rows = [&](int64_t r0, int64_t n) {
    SsdArgs b = a;
    b.y = y.slice(0, r0, n);
    b.x = xBCc.slice(0, r0, n).slice(1, 0, Di);
    b.B = xBCc.slice(0, r0, n).slice(1, Di, GN);
    b.C = xBCc.slice(0, r0, n).slice(1, Di + GN, GN);
    b.dt = dt.slice(0, r0, n);
    return b;
  };
  if (!seq) {
    SiteScope s(rec, layer, "mixer.scan");
    SsdArgs b = rows(0, T);
    b.state = lc.ssm_state;
    m_be.ssd_scan(b);
  } else {
    const int64_t HPN = int64_t(H) * P * N;
    pass_states(
        layer, layout, HPN, H, lc.ssm_state,
        [&](const LocalChunk& ch, const Tensor& state, const Tensor& decay) {
          SsdArgs c = rows(ch.row, ch.len);
          c.state = state.reshape({H, P, N});
          c.log_decay = decay;
          m_be.ssd_scan(c);
        },
        [&](const LocalChunk& ch, const Tensor& incoming) {
          SsdArgs c = rows(ch.row, ch.len);
          c.state = incoming;
          m_be.ssd_state_correction(c);
        },
        [&](const Tensor& incoming, const Tensor& state, const Tensor& decay) {
          m_be.ssd_state_advance(incoming, state.reshape({H, P, N}), decay);
        });
  }
  xBCc = Tensor();
  SiteScope s(rec, layer, "mixer.gated_norm");
  const int64_t group = Di / G;
  if (m_m2.norm_spans_ranks && tp_active()) {
    // A norm group spans several ranks: sum its squares over the tp group.
    Tensor ss = m_be.alloc({T, c.n_groups}, Category::CommBuffers, "mixer.norm_sumsq", DType::F32);
    m_be.gated_norm_sumsq(ss, y, z, group, m_m2.group0);
    m_par.tp->all_reduce(ss);
    m_be.gated_rmsnorm_apply(y, y, z, w.gated_norm, ss, c.norm_eps, group, c.d_inner / c.n_groups, m_m2.group0);
  } else {
    m_be.gated_rmsnorm(y, y, z, w.gated_norm, c.norm_eps, group);
  }
  return y;
}

void Model::mamba_conv(int layer, const Tensor& xc, const Tensor& xz, Cache& cache, const StepLayout& layout,
                       const MambaWeights& w) {
  LayerCache& lc = cache.layers[size_t(layer)];
  const int64_t Di = xc.cols();
  SiteScope s(m_be.recorder(), layer, "mixer.conv");
  const Tensor cw = w.conv_w.reshape({Di, m_cfg.d_conv});
  if (layout.sequence_sharded && m_par.sp_size > 1) sharded_conv(xc, xz.slice(1, 0, Di), cw, w.conv_b, lc.conv_state, layout);
  else m_be.conv1d_causal(xc, xz.slice(1, 0, Di), cw, w.conv_b, lc.conv_state, true);
}

void Model::mamba_scan(int layer, const Tensor& y, const Tensor& xc, const Tensor& dt, const Tensor& z,
                       const Tensor& B, const Tensor& C, Cache& cache, const StepLayout& layout,
                       const MambaWeights& w) {
  LayerCache& lc = cache.layers[size_t(layer)];
  Recorder& rec = m_be.recorder();
  const int64_t T = xc.rows(), Di = xc.cols(), N = m_cfg.d_state;
  SelectiveScanArgs a;
  a.dt_bias = w.dt_proj_b;
  a.A_log = w.A_log;
  a.D = w.D;
  auto rows = [&](int64_t r0, int64_t n) {
    SelectiveScanArgs b = a;
    b.y = y.slice(0, r0, n);
    b.x = xc.slice(0, r0, n);
    b.dt = dt.slice(0, r0, n);
    b.z = z.slice(0, r0, n);
    b.B = B.slice(0, r0, n);
    b.C = C.slice(0, r0, n);
    return b;
  };
  if (!(layout.sequence_sharded && m_par.sp_size > 1)) {
    SiteScope s(rec, layer, "mixer.scan");
    SelectiveScanArgs b = rows(0, T);
    b.state = lc.ssm_state;
    m_be.selective_scan(b);
    return;
  }
  pass_states(
      layer, layout, Di * N, Di, lc.ssm_state,
      [&](const LocalChunk& ch, const Tensor& state, const Tensor& dt_sum) {
        SelectiveScanArgs c = rows(ch.row, ch.len);
        c.state = state.reshape({Di, N});
        c.dt_sum = dt_sum;
        m_be.selective_scan(c);
      },
      [&](const LocalChunk& ch, const Tensor& incoming) {
        SelectiveScanArgs c = rows(ch.row, ch.len);
        c.state = incoming;
        m_be.selective_state_correction(c);
      },
      [&](const Tensor& incoming, const Tensor& state, const Tensor& dt_sum) {
        m_be.selective_state_advance(incoming, w.A_log, state.reshape({Di, N}), dt_sum);
      });
}

// Ranks as SSD chunks (sequence parallelism for the scans): each rank scans
// its chunks from a zero state, every chunk's final state and decay are
// all-gathered, then, walking the chunks in sequence order, each rank adds
// the incoming state's term to its own chunks and advances the state, which
// ends as the whole sequence's final state on every rank (decode goes on from it).
void Model::pass_states(int layer, const StepLayout& layout, int64_t state_numel, int64_t decay_numel,
                        const Tensor& final_state, const ChunkScan& scan, const ChunkCorrect& correct,
                        const StateAdvance& advance) {
  Recorder& rec = m_be.recorder();
  const auto mine = local_chunks(layout, m_par.sp_rank);
  const int64_t nl = int64_t(mine.size()), per = state_numel + decay_numel, S = m_par.sp_size;
  auto split = [&](const Tensor& slot) {
    return std::make_pair(slot.slice(0, 0, state_numel), slot.slice(0, state_numel, decay_numel));
  };
  Tensor local = m_be.alloc({nl, per}, Category::CommBuffers, "mixer.chunk_states", DType::F32);
  {
    SiteScope s(rec, layer, "mixer.scan");
    for (int64_t j = 0; j < nl; ++j) {
      auto [state, decay] = split(local.slice(0, j, 1).reshape({per}));
      m_be.fill(state, 0.0f);
      scan(mine[size_t(j)], state, decay);
    }
  }
  Tensor all = m_be.alloc({S * nl, per}, Category::CommBuffers, "mixer.all_chunk_states", DType::F32);
  {
    SiteScope s(rec, layer, "mixer.state_all_gather");
    m_par.sp->all_gather(all, local);
  }
  SiteScope s(rec, layer, "mixer.state_pass");
  m_be.fill(final_state, 0.0f);
  for (int k = 0; k < int(layout.chunks.size()); ++k) {
    const int owner = layout.chunks[size_t(k)].second;
    if (owner == m_par.sp_rank && k > 0)
      for (const LocalChunk& ch : mine)
        if (ch.seq == k) correct(ch, final_state);
    auto [state, decay] = split(all.slice(0, owner * nl + index_at_owner(layout, k), 1).reshape({per}));
    advance(final_state, state, decay);
  }
}

// Mamba (v1) mixer: in_proj -> [x, z]; conv1d+SiLU; x_proj -> (dt, B, C)
// (RMS-normalised for Falcon-Mamba); dt_proj; selective scan gated by z; out_proj.
// Under tp the channels are sharded and x_proj is row-parallel, so its
// (dt, B, C) partial sums take a second, small all-reduce per layer.
void Model::mamba_block(int layer, const Tensor& x, Cache& cache, const StepLayout& layout) {
  const ModelConfig& c = m_cfg;
  const MambaWeights& w = m_layers[size_t(layer)].m1;
  Recorder& rec = m_be.recorder();
  const int64_t T = x.rows(), Di = m_m1.channels, N = c.d_state, R = c.dt_rank;

  Tensor h = pre_norm(layer, x, w.norm, "mixer.norm");
  Tensor xz = m_be.alloc({T, 2 * Di}, Category::Activations, "mixer.in_proj", m_cfg.dtype);
  {
    SiteScope s(rec, layer, "mixer.in_proj");
    m_be.matmul(xz, h, w.in_proj);
  }
  h = Tensor();
  Tensor xc = m_be.alloc({T, Di}, Category::Activations, "mixer.conv", m_cfg.dtype);
  mamba_conv(layer, xc, xz, cache, layout, w);
  Tensor dbc = m_be.alloc({T, R + 2 * N}, tp_active() ? Category::CommBuffers : Category::Activations, "mixer.x_proj", m_cfg.dtype);
  {
    SiteScope s(rec, layer, "mixer.x_proj");
    m_be.matmul(dbc, xc, w.x_proj);
  }
  if (tp_active()) {
    SiteScope s(rec, layer, "mixer.x_proj_all_reduce");
    m_par.tp->all_reduce(dbc);
  }
  const Tensor dt_low = dbc.slice(1, 0, R), B = dbc.slice(1, R, N), C = dbc.slice(1, R + N, N);
  bcdt_norm(layer, dt_low, B, C);
  Tensor dt = m_be.alloc({T, Di}, Category::Activations, "mixer.dt", m_cfg.dtype);
  {
    SiteScope s(rec, layer, "mixer.dt_proj");
    m_be.matmul(dt, dt_low, w.dt_proj_w);
  }
  Tensor y = m_be.alloc({T, Di}, Category::Activations, "mixer.scan", m_cfg.dtype);
  mamba_scan(layer, y, xc, dt, xz.slice(1, Di, Di), B, C, cache, layout, w);
  SiteScope s(rec, layer, "mixer.out_proj");
  project_out(layer, x, y, w.out_proj, "mixer", "mixer.out_partial");
}

}  // namespace ss
