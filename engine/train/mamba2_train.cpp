// Mamba2 layers' training forward and backward (see train_model.h):
//   h = rmsnorm(x_in); [z | xBC | dt] = h in_proj^T; xBC' = silu(conv(xBC) + b);
//   y = ssd(x = xBC'[x], dt, B = xBC'[B], C = xBC'[C]); yn = gated_norm(y, z);
//   x_out = x_in + yn out_proj^T   (row-parallel: all-reduced under tp)
// Kept for backward (R rows, b bytes a value; Di = local heads x head_dim,
// GN = local groups x d_state, H local heads):
//   h R d · b;  zxbcdt R (2 Di + 2 GN + H) · b;  xBC' R (Di + 2 GN) · b;  y, yn 2 R Di · b
// (selective recomputation drops h and yn). The conv and the scan run per
// sequence, from zero states: a sequence's first token sees nothing before it.
#include "train/train_model.h"

namespace ss {

SsdArgs TrainModel::ssd_args(const Layer& L, int H, int G) const {
  SsdArgs a;
  a.dt_bias = L.dt_bias;
  a.A_log = L.A_log;
  a.D = L.D;
  a.n_heads = H;
  a.head_dim = m_cfg.ssm_head_dim;
  a.n_groups = G;
  a.d_state = m_cfg.d_state;
  a.chunk = m_cfg.chunk;
  a.dt_min = m_cfg.dt_min;
  a.dt_max = m_cfg.dt_max;
  return a;
}

// tsp: where the rows of in_proj shard j go among in_proj's output columns
// [z | x | B | C | dt]: (first column, width) per packed block, in pack order.
std::vector<std::pair<int64_t, int64_t>> TrainModel::in_proj_columns(int j) const {
  const ModelConfig& c = m_cfg;
  const Mamba2Shard m = mamba2_shard(c, j, m_par.sp_size);
  const int64_t P = c.ssm_head_dim, N = c.d_state, Di = c.d_inner, GN = int64_t(c.n_groups) * N;
  const int64_t hx = int64_t(m.heads) * P, g0 = m.group0 * N, gn = int64_t(m.groups) * N;
  return {{m.head0 * P, hx}, {Di + m.head0 * P, hx}, {2 * Di + g0, gn}, {2 * Di + GN + g0, gn},
          {2 * Di + 2 * GN + m.head0, m.heads}};
}

void TrainModel::mamba2_forward(int i, const Tensor& x_in, const Tensor& x_out, const TrainBatch& b, Saved& s,
                                bool keep) {
  const ModelConfig& c = m_cfg;
  const Layer& L = m_layers[size_t(i)];
  Recorder& rec = m_be.recorder();
  const int H = m_m2.heads, G = m_m2.groups, P = c.ssm_head_dim, N = c.d_state;
  const int64_t R = x_in.rows(), d = c.d_model, Di = int64_t(H) * P, GN = int64_t(G) * N, conv = Di + 2 * GN;
  const int64_t Tl = int64_t(b.positions.size());
  const DType dt = c.dtype;
  s.x_in = x_in;
  s.h1 = act({R, d}, "mixer.norm", dt);
  {
    SiteScope sc(rec, i, "mixer.norm");
    m_be.rmsnorm(s.h1, x_in, L.norm, c.norm_eps, d);
  }
  s.zxbcdt = act({R, 2 * Di + 2 * GN + H}, "mixer.in_proj", dt);
  if (m_par.folded()) {
    // tsp: in_proj shards stream by; shard j's rows are packed [z_j, x_j, B_j, C_j, dt_j]: put its columns in place.
    m_model.stream_pack(pack_of(i, "mixer.in_proj"), [&](int j, const std::vector<Tensor>& w) {
      SiteScope sc(rec, i, "mixer.in_proj");
      Tensor part = work({R, w[0].rows()}, "mixer.in_proj_shard", dt);
      m_be.matmul(part, s.h1, w[0]);
      int64_t at = 0;
      for (auto [dst, n] : in_proj_columns(j)) {
        m_be.copy(s.zxbcdt.slice(1, dst, n), part.slice(1, at, n));
        at += n;
      }
    });
  } else {
    SiteScope sc(rec, i, "mixer.in_proj");
    m_be.matmul(s.zxbcdt, s.h1, L.in_proj);
  }
  s.xbc = act({R, conv}, "mixer.conv", dt);
  s.ys = act({R, Di}, "mixer.scan", dt);
  const Tensor cw = L.conv_w.reshape({conv, c.d_conv});
  const bool seq = m_par.sp_size > 1;
  const int64_t K1 = c.d_conv - 1;
  for (int q = 0; q < b.sequences; ++q) {
    const Tensor zx = s.zxbcdt.slice(0, q * Tl, Tl), xc = s.xbc.slice(0, q * Tl, Tl), ys = s.ys.slice(0, q * Tl, Tl);
    auto args = [&](int64_t r0, int64_t n) {
      SsdArgs a = ssd_args(L, H, G);
      a.y = ys.slice(0, r0, n);
      a.x = xc.slice(0, r0, n).slice(1, 0, Di);
      a.B = xc.slice(0, r0, n).slice(1, Di, GN);
      a.C = xc.slice(0, r0, n).slice(1, Di + GN, GN);
      a.dt = zx.slice(0, r0, n).slice(1, Di + conv, H);
      return a;
    };
    if (!seq) {
      {
        SiteScope sc(rec, i, "mixer.conv");
        m_be.conv1d_causal(xc, zx.slice(1, Di, conv), cw, L.conv_b, Tensor{}, true);
      }
      SiteScope sc(rec, i, "mixer.scan");
      m_be.ssd_scan(args(0, Tl));
      continue;
    }
    // Sequence parallel: each chunk's conv starts from its halo, its scan
    // from zero, then the states passed between chunks correct the outputs.
    s.halos.push_back(conv_halos(i, zx.slice(1, Di, conv), b));
    const std::vector<LocalChunk> chunks = local_chunks(b);
    Tensor halo = m_be.alloc({K1, conv}, Category::Workspace, "mixer.conv_state", dt);
    for (size_t j = 0; j < chunks.size(); ++j) {
      const LocalChunk& ch = chunks[j];
      m_be.copy(halo, s.halos.back().slice(0, int64_t(j) * K1, K1));  // the conv overwrites its state
      SiteScope sc(rec, i, "mixer.conv");
      m_be.conv1d_causal(xc.slice(0, ch.row, ch.len), zx.slice(0, ch.row, ch.len).slice(1, Di, conv), cw, L.conv_b,
                         halo, true);
    }
    const int64_t HPN = int64_t(H) * P * N;
    StateOps ops;
    ops.state_numel = HPN;
    ops.decay_numel = H;
    ops.scan = [&](const LocalChunk& ch, const Tensor& state, const Tensor& decay) {
      SsdArgs a = args(ch.row, ch.len);
      a.state = state.reshape({H, P, N});
      a.log_decay = decay.reshape({H});
      SiteScope sc(rec, i, "mixer.scan");
      m_be.ssd_scan(a);
    };
    ops.correct = [&](const LocalChunk& ch, const Tensor& incoming) {
      SsdArgs a = args(ch.row, ch.len);
      a.state = incoming.reshape({H, P, N});
      SiteScope sc(rec, i, "mixer.state_correction");
      m_be.ssd_state_correction(a);
    };
    ops.advance = [&](const Tensor& state, const Tensor& chunk_state, const Tensor& decay) {
      m_be.ssd_state_advance(state.reshape({H, P, N}), chunk_state.reshape({H, P, N}), decay.reshape({H}));
    };
    s.passed.push_back(pass_states_forward(i, b, ops));
  }
  s.yn = act({R, Di}, "mixer.gated_norm", dt);
  {
    SiteScope sc(rec, i, "mixer.gated_norm");
    m_be.gated_rmsnorm(s.yn, s.ys, s.zxbcdt.slice(1, 0, Di), L.gated_norm, c.norm_eps, Di / G);
  }
  m_be.copy(x_out, x_in);
  if (m_par.folded()) {
    m_model.stream_pack(pack_of(i, "mixer.out_proj"), [&](int j, const std::vector<Tensor>& w) {
      SiteScope sc(rec, i, "mixer.out_proj");
      const Mamba2Shard m = mamba2_shard(c, j, m_par.sp_size);
      m_be.matmul(x_out, s.yn.slice(1, m.head0 * P, int64_t(m.heads) * P), w[0], true);
    });
  } else {
    project_out(i, x_out, s.yn, L.out_proj, "mixer.out_proj");
  }
  if (!keep) {
    const Tensor x = s.x_in;
    s = Saved{};
    s.x_in = x;
  } else if (m_rc == Recompute::Selective) {
    s.h1 = s.yn = Tensor{};
  }
}

void TrainModel::mamba2_backward(int i, const Tensor& dx, const TrainBatch& b, Saved& s) {
  const ModelConfig& c = m_cfg;
  const Layer& L = m_layers[size_t(i)];
  Recorder& rec = m_be.recorder();
  const int H = m_m2.heads, G = m_m2.groups, P = c.ssm_head_dim, N = c.d_state;
  const int64_t R = dx.rows(), d = c.d_model, Di = int64_t(H) * P, GN = int64_t(G) * N, conv = Di + 2 * GN;
  const int64_t Tl = int64_t(b.positions.size());
  const DType dt = c.dtype;
  recompute(i, b, s);
  // dzxbcdt gathers the gradients of in_proj's output: z, xBC (through the conv), dt.
  Tensor dz = work({R, 2 * Di + 2 * GN + H}, "grad.mixer.in_proj", dt);
  {
    Tensor dyn = work({R, Di}, "grad.mixer.gated_norm", dt);
    if (m_par.folded()) {
      ring_backward(pack_of(i, "mixer.out_proj"), [&](int j, const std::vector<Tensor>& w, const std::vector<Tensor>& gw) {
        SiteScope sc(rec, i, "mixer.out_proj.backward");
        const Mamba2Shard m = mamba2_shard(c, j, m_par.sp_size);
        const int64_t c0 = m.head0 * P, n = int64_t(m.heads) * P;
        m_be.matmul_dx(dyn.slice(1, c0, n), dx, w[0], false);
        m_be.matmul_dw(gw[0], dx, s.yn.slice(1, c0, n), false);
      });
    } else {
      SiteScope sc(rec, i, "mixer.out_proj.backward");
      m_be.matmul_dx(dyn, dx, L.out_proj, false);
      m_be.matmul_dw(L.g_out_proj, dx, s.yn, true);
    }
    s.yn = Tensor{};
    Tensor dys = work({R, Di}, "grad.mixer.scan", dt);
    {
      SiteScope sc(rec, i, "mixer.gated_norm.backward");
      m_be.gated_rmsnorm_backward(dys, dz.slice(1, 0, Di), L.g_gated_norm, dyn, s.ys, s.zxbcdt.slice(1, 0, Di),
                                  L.gated_norm, c.norm_eps, Di / G);
    }
    dyn = Tensor{};
    Tensor dxbc = work({R, conv}, "grad.mixer.conv", dt);
    const Tensor cw = L.conv_w.reshape({conv, c.d_conv}), gcw = L.g_conv_w.reshape({conv, c.d_conv});
    const bool seq = m_par.sp_size > 1;
    const int64_t K1 = c.d_conv - 1;
    // Scratch for the parameter gradients of state passing's first backward.
    Tensor scratch[3];
    if (seq)
      for (Tensor& t : scratch) t = work({H}, "grad.mixer.scratch", dt);
    for (int q = 0; q < b.sequences; ++q) {
      const Tensor zx = s.zxbcdt.slice(0, q * Tl, Tl), xc = s.xbc.slice(0, q * Tl, Tl);
      const Tensor dzq = dz.slice(0, q * Tl, Tl), dxc = dxbc.slice(0, q * Tl, Tl), dyq = dys.slice(0, q * Tl, Tl);
      auto scan_backward = [&](int64_t r0, int64_t n, const Tensor& state, const Tensor& dso, const Tensor& dsi,
                               bool throwaway) {
        SsdArgs a = ssd_args(L, H, G);
        a.x = xc.slice(0, r0, n).slice(1, 0, Di);
        a.B = xc.slice(0, r0, n).slice(1, Di, GN);
        a.C = xc.slice(0, r0, n).slice(1, Di + GN, GN);
        a.dt = zx.slice(0, r0, n).slice(1, Di + conv, H);
        if (state.defined()) a.state = state.reshape({H, P, N});
        SsdGrads g;
        g.dx = dxc.slice(0, r0, n).slice(1, 0, Di);
        g.dB = dxc.slice(0, r0, n).slice(1, Di, GN);
        g.dC = dxc.slice(0, r0, n).slice(1, Di + GN, GN);
        g.ddt = dzq.slice(0, r0, n).slice(1, Di + conv, H);
        g.d_dt_bias = throwaway ? scratch[0] : L.g_dt_bias;
        g.dA_log = throwaway ? scratch[1] : L.g_A_log;
        g.dD = throwaway ? scratch[2] : L.g_D;
        if (dso.defined()) g.dstate_out = dso.reshape({H, P, N});
        if (dsi.defined()) g.dstate_in = dsi.reshape({H, P, N});
        SiteScope sc(rec, i, "mixer.scan.backward");
        m_be.ssd_scan_backward(a, dyq.slice(0, r0, n), g);
      };
      if (!seq) {
        scan_backward(0, Tl, Tensor{}, Tensor{}, Tensor{}, false);
        SiteScope sc(rec, i, "mixer.conv.backward");
        m_be.conv1d_backward(dzq.slice(1, Di, conv), gcw, L.g_conv_b, Tensor{}, dxc, zx.slice(1, Di, conv), cw,
                             L.conv_b, Tensor{}, true);
        continue;
      }
      StateOps ops;
      ops.state_numel = int64_t(H) * P * N;
      ops.decay_numel = H;
      ops.advance = [&](const Tensor& state, const Tensor& chunk_state, const Tensor& decay) {
        m_be.ssd_state_advance(state.reshape({H, P, N}), chunk_state.reshape({H, P, N}), decay.reshape({H}));
      };
      ops.backward = [&](const LocalChunk& ch, const Tensor& incoming, const Tensor& dso, const Tensor& dsi,
                         bool throwaway) { scan_backward(ch.row, ch.len, incoming, dso, dsi, throwaway); };
      pass_states_backward(i, b, ops, s.passed[size_t(q)]);
      const std::vector<LocalChunk> chunks = local_chunks(b);
      Tensor dhalos = work({int64_t(chunks.size()) * K1, conv}, "grad.mixer.conv_halo", dt);
      for (size_t j = 0; j < chunks.size(); ++j) {
        const LocalChunk& ch = chunks[j];
        SiteScope sc(rec, i, "mixer.conv.backward");
        m_be.conv1d_backward(dzq.slice(0, ch.row, ch.len).slice(1, Di, conv), gcw, L.g_conv_b,
                             dhalos.slice(0, int64_t(j) * K1, K1), dxc.slice(0, ch.row, ch.len),
                             zx.slice(0, ch.row, ch.len).slice(1, Di, conv), cw, L.conv_b,
                             s.halos[size_t(q)].slice(0, int64_t(j) * K1, K1), true);
      }
      conv_halo_backward(i, dzq.slice(1, Di, conv), dhalos, b);
    }
  }
  s.ys = s.xbc = Tensor{};
  s.halos.clear();
  s.passed.clear();
  Tensor dh = work({R, d}, "grad.mixer.norm", dt);
  if (m_par.folded()) {
    m_be.fill(dh, 0.0f);
    ring_backward(pack_of(i, "mixer.in_proj"), [&](int j, const std::vector<Tensor>& w, const std::vector<Tensor>& gw) {
      SiteScope sc(rec, i, "mixer.in_proj.backward");
      Tensor part = work({R, w[0].rows()}, "grad.mixer.in_proj_shard", dt);
      int64_t at = 0;
      for (auto [src, n] : in_proj_columns(j)) {
        m_be.copy(part.slice(1, at, n), dz.slice(1, src, n));
        at += n;
      }
      m_be.matmul_dx(dh, part, w[0], true);
      m_be.matmul_dw(gw[0], part, s.h1, false);
    });
  } else {
    SiteScope sc(rec, i, "mixer.in_proj.backward");
    m_be.matmul_dx(dh, dz, L.in_proj, false);
    m_be.matmul_dw(L.g_in_proj, dz, s.h1, true);
  }
  dz = Tensor{};
  s.zxbcdt = s.h1 = Tensor{};
  tp_sum(dh, i, "mixer.grad_all_reduce");
  SiteScope sc(rec, i, "mixer.norm.backward");
  m_be.rmsnorm_backward(dx, L.g_norm, dh, s.x_in, L.norm, c.norm_eps, d);
}

}  // namespace ss
