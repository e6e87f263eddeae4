// The residual blocks. Each reads the residual stream x [T, d_model] and adds
// its output to it in place (the output projection accumulates into x).
#include <cmath>

#include "model/model.h"

namespace ss {

// Llama attention: x += o_proj(attention(rope(q), rope(k), v)) over the cache.
void Model::attention_block(int layer, const Tensor& x, std::span<const int32_t> positions, Cache& cache) {
  const ModelConfig& c = m_cfg;
  const AttentionWeights& w = m_layers[size_t(layer)].attn;
  LayerCache& lc = cache.layers[size_t(layer)];
  Recorder& rec = m_be.recorder();
  const int64_t T = x.rows(), hq = int64_t(c.n_heads) * c.head_dim;
  const int64_t past = cache.length() - T;  // tokens already cached before this call

  Tensor h = m_be.alloc({T, c.d_model}, Category::Activations, "attn.norm");
  {
    SiteScope s(rec, layer, "attn.norm");
    m_be.rmsnorm(h, x, w.in_norm, c.norm_eps, c.d_model);
  }
  Tensor q = m_be.alloc({T, hq}, Category::Activations, "attn.q");
  const Tensor k = lc.k.slice(0, past, T), v = lc.v.slice(0, past, T);
  {
    SiteScope s(rec, layer, "attn.qkv");
    m_be.matmul(q, h, w.q);
    m_be.matmul(k, h, w.k);  // K and V are written straight into the cache
    m_be.matmul(v, h, w.v);
  }
  {
    SiteScope s(rec, layer, "attn.rope");
    m_be.rope(q, c.n_heads, c.head_dim, positions, c.rope_theta);
    m_be.rope(k, c.n_kv_heads, c.head_dim, positions, c.rope_theta);
  }
  h = Tensor();
  Tensor o = m_be.alloc({T, hq}, Category::Activations, "attn.out");
  {
    SiteScope s(rec, layer, "attn.core");
    AttentionArgs a;
    a.n_heads = c.n_heads;
    a.n_kv_heads = c.n_kv_heads;
    a.head_dim = c.head_dim;
    a.scale = 1.0f / std::sqrt(float(c.head_dim));
    a.q_pos = positions;
    a.k_pos = std::span<const int32_t>(cache.positions.data(), size_t(past + T));
    m_be.attention(o, q, lc.k.slice(0, 0, past + T), lc.v.slice(0, 0, past + T), a);
  }
  q = Tensor();
  SiteScope s(rec, layer, "attn.o_proj");
  m_be.matmul(x, o, w.o, /*accumulate=*/true);
}

// SwiGLU MLP: x += down(silu(gate(h)) * up(h)), h = rmsnorm(x).
void Model::mlp_block(int layer, const Tensor& x) {
  const ModelConfig& c = m_cfg;
  const AttentionWeights& w = m_layers[size_t(layer)].attn;
  Recorder& rec = m_be.recorder();
  const int64_t T = x.rows();
  Tensor h = m_be.alloc({T, c.d_model}, Category::Activations, "mlp.norm");
  {
    SiteScope s(rec, layer, "mlp.norm");
    m_be.rmsnorm(h, x, w.post_norm, c.norm_eps, c.d_model);
  }
  Tensor g = m_be.alloc({T, c.ffn_dim}, Category::Activations, "mlp.gate");
  Tensor u = m_be.alloc({T, c.ffn_dim}, Category::Activations, "mlp.up");
  {
    SiteScope s(rec, layer, "mlp.gate_up");
    m_be.matmul(g, h, w.gate);
    m_be.matmul(u, h, w.up);
  }
  h = Tensor();
  {
    SiteScope s(rec, layer, "mlp.act");
    m_be.silu_mul(g, g, u);
  }
  u = Tensor();
  SiteScope s(rec, layer, "mlp.down");
  m_be.matmul(x, g, w.down, /*accumulate=*/true);
}

// Mamba2 mixer: in_proj -> [z, xBC, dt]; conv1d+SiLU on xBC; SSD scan over
// (x, B, C, dt); gated RMSNorm with z; out_proj.
void Model::mamba2_block(int layer, const Tensor& x, Cache& cache) {
  const ModelConfig& c = m_cfg;
  const Mamba2Weights& w = m_layers[size_t(layer)].m2;
  LayerCache& lc = cache.layers[size_t(layer)];
  Recorder& rec = m_be.recorder();
  const int64_t T = x.rows(), Di = c.d_inner, GN = int64_t(c.n_groups) * c.d_state, conv_dim = c.conv_dim();

  Tensor h = m_be.alloc({T, c.d_model}, Category::Activations, "mixer.norm");
  {
    SiteScope s(rec, layer, "mixer.norm");
    m_be.rmsnorm(h, x, w.norm, c.norm_eps, c.d_model);
  }
  Tensor zxbcdt = m_be.alloc({T, c.in_proj_dim()}, Category::Activations, "mixer.in_proj");
  {
    SiteScope s(rec, layer, "mixer.in_proj");
    m_be.matmul(zxbcdt, h, w.in_proj);
  }
  h = Tensor();
  const Tensor z = zxbcdt.slice(1, 0, Di);
  const Tensor xBC = zxbcdt.slice(1, Di, conv_dim);
  const Tensor dt = zxbcdt.slice(1, Di + conv_dim, c.ssm_heads);
  Tensor xBCc = m_be.alloc({T, conv_dim}, Category::Activations, "mixer.conv");
  {
    SiteScope s(rec, layer, "mixer.conv");
    m_be.conv1d_causal(xBCc, xBC, w.conv_w.reshape({conv_dim, c.d_conv}), w.conv_b, lc.conv_state, true);
  }
  Tensor y = m_be.alloc({T, Di}, Category::Activations, "mixer.scan");
  {
    SiteScope s(rec, layer, "mixer.scan");
    SsdArgs a;
    a.y = y;
    a.x = xBCc.slice(1, 0, Di);
    a.B = xBCc.slice(1, Di, GN);
    a.C = xBCc.slice(1, Di + GN, GN);
    a.dt = dt;
    a.dt_bias = w.dt_bias;
    a.A_log = w.A_log;
    a.D = w.D;
    a.state = lc.ssm_state;
    a.n_heads = c.ssm_heads;
    a.head_dim = c.ssm_head_dim;
    a.n_groups = c.n_groups;
    a.d_state = c.d_state;
    a.chunk = c.chunk;
    a.dt_min = c.dt_min;
    a.dt_max = c.dt_max;
    m_be.ssd_scan(a);
  }
  xBCc = Tensor();
  {
    SiteScope s(rec, layer, "mixer.gated_norm");
    m_be.gated_rmsnorm(y, y, z, w.gated_norm, c.norm_eps, Di / c.n_groups);
  }
  zxbcdt = Tensor();
  SiteScope s(rec, layer, "mixer.out_proj");
  m_be.matmul(x, y, w.out_proj, /*accumulate=*/true);
}

// Mamba (v1) mixer: in_proj -> [x, z]; conv1d+SiLU; x_proj -> (dt, B, C)
// (RMS-normalised for Falcon-Mamba); dt_proj; selective scan gated by z; out_proj.
void Model::mamba_block(int layer, const Tensor& x, Cache& cache) {
  const ModelConfig& c = m_cfg;
  const MambaWeights& w = m_layers[size_t(layer)].m1;
  LayerCache& lc = cache.layers[size_t(layer)];
  Recorder& rec = m_be.recorder();
  const int64_t T = x.rows(), Di = c.d_inner, N = c.d_state, R = c.dt_rank;

  Tensor h = m_be.alloc({T, c.d_model}, Category::Activations, "mixer.norm");
  {
    SiteScope s(rec, layer, "mixer.norm");
    m_be.rmsnorm(h, x, w.norm, c.norm_eps, c.d_model);
  }
  Tensor xz = m_be.alloc({T, 2 * Di}, Category::Activations, "mixer.in_proj");
  {
    SiteScope s(rec, layer, "mixer.in_proj");
    m_be.matmul(xz, h, w.in_proj);
  }
  h = Tensor();
  Tensor xc = m_be.alloc({T, Di}, Category::Activations, "mixer.conv");
  {
    SiteScope s(rec, layer, "mixer.conv");
    m_be.conv1d_causal(xc, xz.slice(1, 0, Di), w.conv_w.reshape({Di, c.d_conv}), w.conv_b, lc.conv_state, true);
  }
  Tensor dbc = m_be.alloc({T, R + 2 * N}, Category::Activations, "mixer.x_proj");
  {
    SiteScope s(rec, layer, "mixer.x_proj");
    m_be.matmul(dbc, xc, w.x_proj);
  }
  const Tensor dt_low = dbc.slice(1, 0, R), B = dbc.slice(1, R, N), C = dbc.slice(1, R + N, N);
  if (c.bcdt_rms) {
    SiteScope s(rec, layer, "mixer.bcdt_norm");
    m_be.rmsnorm(dt_low, dt_low, Tensor{}, c.mixer_rms_eps, R);
    m_be.rmsnorm(B, B, Tensor{}, c.mixer_rms_eps, N);
    m_be.rmsnorm(C, C, Tensor{}, c.mixer_rms_eps, N);
  }
  Tensor dt = m_be.alloc({T, Di}, Category::Activations, "mixer.dt");
  {
    SiteScope s(rec, layer, "mixer.dt_proj");
    m_be.matmul(dt, dt_low, w.dt_proj_w);
  }
  Tensor y = m_be.alloc({T, Di}, Category::Activations, "mixer.scan");
  {
    SiteScope s(rec, layer, "mixer.scan");
    SelectiveScanArgs a;
    a.y = y;
    a.x = xc;
    a.dt = dt;
    a.z = xz.slice(1, Di, Di);
    a.dt_bias = w.dt_proj_b;
    a.A_log = w.A_log;
    a.B = B;
    a.C = C;
    a.D = w.D;
    a.state = lc.ssm_state;
    m_be.selective_scan(a);
  }
  SiteScope s(rec, layer, "mixer.out_proj");
  m_be.matmul(x, y, w.out_proj, /*accumulate=*/true);
}

}  // namespace ss
