// Mamba (v1) and Falcon-Mamba layers' training forward and backward (see
// train_model.h):
//   h = rmsnorm(x_in); [x | z] = h in_proj^T; xc = silu(conv(x) + b);
//   [dt_low | B | C] = xc x_proj^T (x_proj is split by channel: a partial sum,
//   all-reduced under tp, whose backward is the identity; every rank's
//   channels then use the whole of it, so its gradient is all-reduced); Falcon-Mamba
//   RMS-normalises dt_low, B and C (no weights); dt = dt_low dt_proj^T;
//   y = selective_scan(xc, dt, z, B, C); x_out = x_in + y out_proj^T.
// Kept for backward (R rows, b bytes a value, Di this rank's channels,
// r = dt_rank): h R d; xz 2 R Di; xc, dt, y 3 R Di; x_proj's output
// R (r + 2N), and its normalised copy for Falcon-Mamba (all b bytes a value).
// Selective recomputation drops h and the normalised copy.
#include "train/train_model.h"

namespace ss {

void TrainModel::mamba_forward(int i, const Tensor& x_in, const Tensor& x_out, const TrainBatch& b, Saved& s,
                               bool keep) {
  const ModelConfig& c = m_cfg;
  const Layer& L = m_layers[size_t(i)];
  Recorder& rec = m_be.recorder();
  const int64_t R = x_in.rows(), d = c.d_model, Di = m_m1.channels, N = c.d_state, r = c.dt_rank;
  const int64_t Tl = int64_t(b.positions.size());
  const DType dt = c.dtype;
  s.x_in = x_in;
  s.h1 = act({R, d}, "mixer.norm", dt);
  {
    SiteScope sc(rec, i, "mixer.norm");
    m_be.rmsnorm(s.h1, x_in, L.norm, c.norm_eps, d);
  }
  s.zxbcdt = act({R, 2 * Di}, "mixer.in_proj", dt);
  const bool folded = m_par.folded();
  const int64_t Ds = folded ? Di / m_par.sp_size : Di;  // tsp: channels per shard
  if (folded) {
    // tsp: shard j's rows are [x_j; z_j]; its product goes to those columns of xz.
    m_model.stream_pack(pack_of(i, "mixer.in_proj"), [&](int j, const std::vector<Tensor>& w) {
      SiteScope sc(rec, i, "mixer.in_proj");
      Tensor part = work({R, 2 * Ds}, "mixer.in_proj_shard", dt);
      m_be.matmul(part, s.h1, w[0]);
      m_be.copy(s.zxbcdt.slice(1, j * Ds, Ds), part.slice(1, 0, Ds));
      m_be.copy(s.zxbcdt.slice(1, Di + j * Ds, Ds), part.slice(1, Ds, Ds));
    });
  } else {
    SiteScope sc(rec, i, "mixer.in_proj");
    m_be.matmul(s.zxbcdt, s.h1, L.in_proj);
  }
  s.xbc = act({R, Di}, "mixer.conv", dt);
  const Tensor cw = L.conv_w.reshape({Di, c.d_conv});
  const bool seq = m_par.sp_size > 1;
  const int64_t K1 = c.d_conv - 1;
  for (int q = 0; q < b.sequences; ++q) {
    const Tensor xq = s.zxbcdt.slice(0, q * Tl, Tl).slice(1, 0, Di), xc = s.xbc.slice(0, q * Tl, Tl);
    if (!seq) {
      SiteScope sc(rec, i, "mixer.conv");
      m_be.conv1d_causal(xc, xq, cw, L.conv_b, Tensor{}, true);
      continue;
    }
    // Sequence parallel: each chunk's conv starts from its halo (train/ssm_sequence.cpp).
    s.halos.push_back(conv_halos(i, xq, b));
    Tensor halo = m_be.alloc({K1, Di}, Category::Workspace, "mixer.conv_state", dt);
    const std::vector<LocalChunk> chunks = local_chunks(b);
    for (size_t j = 0; j < chunks.size(); ++j) {
      m_be.copy(halo, s.halos.back().slice(0, int64_t(j) * K1, K1));  // the conv overwrites its state
      SiteScope sc(rec, i, "mixer.conv");
      m_be.conv1d_causal(xc.slice(0, chunks[j].row, chunks[j].len), xq.slice(0, chunks[j].row, chunks[j].len), cw,
                         L.conv_b, halo, true);
    }
  }
  s.dbc = act({R, r + 2 * N}, "mixer.x_proj", dt);
  {
    SiteScope sc(rec, i, "mixer.x_proj");
    if (folded) {  // x_proj shards are channel (column) slices: their products sum
      m_be.fill(s.dbc, 0.0f);
      m_model.stream_pack(pack_of(i, "mixer.x_proj"), [&](int j, const std::vector<Tensor>& w) {
        m_be.matmul(s.dbc, s.xbc.slice(1, j * Ds, Ds), w[0], true);
      });
    } else if (m_par.tp_size > 1) {
      Tensor partial = m_be.alloc({R, r + 2 * N}, Category::CommBuffers, "mixer.x_proj_partial", dt);
      m_be.matmul(partial, s.xbc, L.x_proj);
      m_par.tp->all_reduce(partial);
      m_be.copy(s.dbc, partial);
    } else {
      m_be.matmul(s.dbc, s.xbc, L.x_proj);
    }
  }
  s.dbc_n = s.dbc;
  if (c.bcdt_rms) {
    SiteScope sc(rec, i, "mixer.bcdt_norm");
    s.dbc_n = act({R, r + 2 * N}, "mixer.bcdt_norm", dt);
    for (auto [c0, n] : {std::pair{int64_t(0), r}, std::pair{r, N}, std::pair{r + N, N}})
      m_be.rmsnorm(s.dbc_n.slice(1, c0, n), s.dbc.slice(1, c0, n), Tensor{}, c.mixer_rms_eps, n);
  }
  s.dt = act({R, Di}, "mixer.dt", dt);
  {
    SiteScope sc(rec, i, "mixer.dt_proj");
    if (folded)
      m_model.stream_pack(pack_of(i, "mixer.dt_proj"), [&](int j, const std::vector<Tensor>& w) {
        m_be.matmul(s.dt.slice(1, j * Ds, Ds), s.dbc_n.slice(1, 0, r), w[0]);
      });
    else
      m_be.matmul(s.dt, s.dbc_n.slice(1, 0, r), L.dt_proj_w);
  }
  s.ys = act({R, Di}, "mixer.scan", dt);
  for (int q = 0; q < b.sequences; ++q) {
    auto args = [&](int64_t r0, int64_t n) {
      auto rows = [&](const Tensor& t) { return t.slice(0, q * Tl + r0, n); };
      SelectiveScanArgs a;
      a.y = rows(s.ys);
      a.x = rows(s.xbc);
      a.dt = rows(s.dt);
      a.z = rows(s.zxbcdt).slice(1, Di, Di);
      a.B = rows(s.dbc_n).slice(1, r, N);
      a.C = rows(s.dbc_n).slice(1, r + N, N);
      a.dt_bias = L.dt_proj_b;
      a.A_log = L.A_log;
      a.D = L.D;
      return a;
    };
    if (!seq) {
      SiteScope sc(rec, i, "mixer.scan");
      m_be.selective_scan(args(0, Tl));
      continue;
    }
    StateOps ops;
    ops.state_numel = Di * N;
    ops.decay_numel = Di;
    ops.scan = [&](const LocalChunk& ch, const Tensor& state, const Tensor& dt_sum) {
      SelectiveScanArgs a = args(ch.row, ch.len);
      a.state = state.reshape({Di, N});
      a.dt_sum = dt_sum.reshape({Di});
      SiteScope sc(rec, i, "mixer.scan");
      m_be.selective_scan(a);
    };
    ops.correct = [&](const LocalChunk& ch, const Tensor& incoming) {
      SelectiveScanArgs a = args(ch.row, ch.len);
      a.state = incoming.reshape({Di, N});
      SiteScope sc(rec, i, "mixer.state_correction");
      m_be.selective_state_correction(a);
    };
    ops.advance = [&](const Tensor& state, const Tensor& chunk_state, const Tensor& dt_sum) {
      m_be.selective_state_advance(state.reshape({Di, N}), L.A_log, chunk_state.reshape({Di, N}), dt_sum.reshape({Di}));
    };
    s.passed.push_back(pass_states_forward(i, b, ops));
  }
  m_be.copy(x_out, x_in);
  if (folded)
    m_model.stream_pack(pack_of(i, "mixer.out_proj"), [&](int j, const std::vector<Tensor>& w) {
      SiteScope sc(rec, i, "mixer.out_proj");
      m_be.matmul(x_out, s.ys.slice(1, j * Ds, Ds), w[0], true);
    });
  else
    project_out(i, x_out, s.ys, L.out_proj, "mixer.out_proj");
  if (!keep) {
    const Tensor x = s.x_in;
    s = Saved{};
    s.x_in = x;
  } else if (m_rc == Recompute::Selective) {
    s.h1 = Tensor{};
    if (c.bcdt_rms) s.dbc_n = Tensor{};
  }
}

void TrainModel::mamba_backward(int i, const Tensor& dx, const TrainBatch& b, Saved& s) {
  const ModelConfig& c = m_cfg;
  const Layer& L = m_layers[size_t(i)];
  Recorder& rec = m_be.recorder();
  const int64_t R = dx.rows(), d = c.d_model, Di = m_m1.channels, N = c.d_state, r = c.dt_rank;
  const int64_t Tl = int64_t(b.positions.size());
  const DType dt = c.dtype;
  const bool folded = m_par.folded();
  const int64_t Ds = folded ? Di / m_par.sp_size : Di;  // tsp: channels per shard
  recompute(i, b, s);
  Tensor dxz = work({R, 2 * Di}, "grad.mixer.in_proj", dt);
  Tensor dxc = work({R, Di}, "grad.mixer.conv", dt);
  {
    Tensor dys = work({R, Di}, "grad.mixer.scan", dt);
    if (folded) {
      ring_backward(pack_of(i, "mixer.out_proj"), [&](int j, const std::vector<Tensor>& w, const std::vector<Tensor>& gw) {
        SiteScope sc(rec, i, "mixer.out_proj.backward");
        m_be.matmul_dx(dys.slice(1, j * Ds, Ds), dx, w[0], false);
        m_be.matmul_dw(gw[0], dx, s.ys.slice(1, j * Ds, Ds), false);
      });
    } else {
      SiteScope sc(rec, i, "mixer.out_proj.backward");
      m_be.matmul_dx(dys, dx, L.out_proj, false);
      m_be.matmul_dw(L.g_out_proj, dx, s.ys, true);
    }
    Tensor ddt = work({R, Di}, "grad.mixer.dt", dt);
    Tensor dn = work({R, r + 2 * N}, "grad.mixer.bcdt", dt);  // of dt_low, B, C as the scan saw them
    const bool seq = m_par.sp_size > 1;
    Tensor scratch[3];  // parameter gradients of state passing's first backward
    if (seq) {
      scratch[0] = work({Di}, "grad.mixer.scratch", dt);
      scratch[1] = work({Di, N}, "grad.mixer.scratch", dt);
      scratch[2] = work({Di}, "grad.mixer.scratch", dt);
    }
    for (int q = 0; q < b.sequences; ++q) {
      auto scan_backward = [&](int64_t r0, int64_t n, const Tensor& state, const Tensor& dso, const Tensor& dsi,
                               bool throwaway) {
        auto rows = [&](const Tensor& t) { return t.slice(0, q * Tl + r0, n); };
        SelectiveScanArgs a;
        a.x = rows(s.xbc);
        a.dt = rows(s.dt);
        a.z = rows(s.zxbcdt).slice(1, Di, Di);
        a.B = rows(s.dbc_n).slice(1, r, N);
        a.C = rows(s.dbc_n).slice(1, r + N, N);
        a.dt_bias = L.dt_proj_b;
        a.A_log = L.A_log;
        a.D = L.D;
        if (state.defined()) a.state = state.reshape({Di, N});
        SelectiveGrads g;
        g.dx = rows(dxc);
        g.ddt = rows(ddt);
        g.dz = rows(dxz).slice(1, Di, Di);
        g.dB = rows(dn).slice(1, r, N);
        g.dC = rows(dn).slice(1, r + N, N);
        g.d_dt_bias = throwaway ? scratch[0] : L.g_dt_proj_b;
        g.dA_log = throwaway ? scratch[1] : L.g_A_log;
        g.dD = throwaway ? scratch[2] : L.g_D;
        if (dso.defined()) g.dstate_out = dso.reshape({Di, N});
        if (dsi.defined()) g.dstate_in = dsi.reshape({Di, N});
        SiteScope sc(rec, i, "mixer.scan.backward");
        m_be.selective_scan_backward(a, rows(dys), g);
      };
      if (!seq) {
        scan_backward(0, Tl, Tensor{}, Tensor{}, Tensor{}, false);
        continue;
      }
      StateOps ops;
      ops.state_numel = Di * N;
      ops.decay_numel = Di;
      ops.advance = [&](const Tensor& state, const Tensor& chunk_state, const Tensor& dt_sum) {
        m_be.selective_state_advance(state.reshape({Di, N}), L.A_log, chunk_state.reshape({Di, N}),
                                     dt_sum.reshape({Di}));
      };
      ops.backward = [&](const LocalChunk& ch, const Tensor& incoming, const Tensor& dso, const Tensor& dsi,
                         bool throwaway) { scan_backward(ch.row, ch.len, incoming, dso, dsi, throwaway); };
      pass_states_backward(i, b, ops, s.passed[size_t(q)]);
    }
    dys = Tensor{};
    s.ys = Tensor{};
    {
      SiteScope sc(rec, i, "mixer.dt_proj.backward");
      if (folded) {
        m_be.fill(dn.slice(1, 0, r), 0.0f);
        ring_backward(pack_of(i, "mixer.dt_proj"), [&](int j, const std::vector<Tensor>& w, const std::vector<Tensor>& gw) {
          m_be.matmul_dx(dn.slice(1, 0, r), ddt.slice(1, j * Ds, Ds), w[0], true);
          m_be.matmul_dw(gw[0], ddt.slice(1, j * Ds, Ds), s.dbc_n.slice(1, 0, r), false);
        });
      } else {
        m_be.matmul_dx(dn.slice(1, 0, r), ddt, L.dt_proj_w, false);
        m_be.matmul_dw(L.g_dt_proj_w, ddt, s.dbc_n.slice(1, 0, r), true);
      }
    }
    ddt = Tensor{};
    s.dt = Tensor{};
    // dt_low, B and C are whole on every rank but each rank's channels used
    // them: their gradient is the sum of every rank's share.
    tp_sum(dn, i, "mixer.bcdt_grad_all_reduce");
    // Through Falcon-Mamba's weightless norms, to x_proj's output.
    Tensor draw = dn;
    if (c.bcdt_rms) {
      SiteScope sc(rec, i, "mixer.bcdt_norm.backward");
      draw = work({R, r + 2 * N}, "grad.mixer.x_proj", dt);
      m_be.fill(draw, 0.0f);
      for (auto [c0, n] : {std::pair{int64_t(0), r}, std::pair{r, N}, std::pair{r + N, N}})
        m_be.rmsnorm_backward(draw.slice(1, c0, n), Tensor{}, dn.slice(1, c0, n), s.dbc.slice(1, c0, n), Tensor{},
                              c.mixer_rms_eps, n);
    }
    s.dbc_n = Tensor{};
    // x_proj's forward all-reduce summed partials: its backward hands every rank that whole gradient.
    SiteScope sc(rec, i, "mixer.x_proj.backward");
    if (folded) {
      ring_backward(pack_of(i, "mixer.x_proj"), [&](int j, const std::vector<Tensor>& w, const std::vector<Tensor>& gw) {
        m_be.matmul_dx(dxc.slice(1, j * Ds, Ds), draw, w[0], true);
        m_be.matmul_dw(gw[0], draw, s.xbc.slice(1, j * Ds, Ds), false);
      });
    } else {
      m_be.matmul_dx(dxc, draw, L.x_proj, true);
      m_be.matmul_dw(L.g_x_proj, draw, s.xbc, true);
    }
  }
  s.dbc = s.xbc = Tensor{};
  {
    const Tensor cw = L.conv_w.reshape({Di, c.d_conv}), gcw = L.g_conv_w.reshape({Di, c.d_conv});
    const int64_t K1 = c.d_conv - 1;
    for (int q = 0; q < b.sequences; ++q) {
      const Tensor dxq = dxz.slice(0, q * Tl, Tl).slice(1, 0, Di), dyq = dxc.slice(0, q * Tl, Tl);
      const Tensor xq = s.zxbcdt.slice(0, q * Tl, Tl).slice(1, 0, Di);
      if (m_par.sp_size <= 1) {
        SiteScope sc(rec, i, "mixer.conv.backward");
        m_be.conv1d_backward(dxq, gcw, L.g_conv_b, Tensor{}, dyq, xq, cw, L.conv_b, Tensor{}, true);
        continue;
      }
      const std::vector<LocalChunk> chunks = local_chunks(b);
      Tensor dhalos = work({int64_t(chunks.size()) * K1, Di}, "grad.mixer.conv_halo", dt);
      for (size_t j = 0; j < chunks.size(); ++j) {
        const LocalChunk& ch = chunks[j];
        SiteScope sc(rec, i, "mixer.conv.backward");
        m_be.conv1d_backward(dxq.slice(0, ch.row, ch.len), gcw, L.g_conv_b, dhalos.slice(0, int64_t(j) * K1, K1),
                             dyq.slice(0, ch.row, ch.len), xq.slice(0, ch.row, ch.len), cw, L.conv_b,
                             s.halos[size_t(q)].slice(0, int64_t(j) * K1, K1), true);
      }
      conv_halo_backward(i, dxq, dhalos, b);
    }
  }
  s.halos.clear();
  s.passed.clear();
  dxc = Tensor{};
  Tensor dh = work({R, d}, "grad.mixer.norm", dt);
  if (folded) {
    m_be.fill(dh, 0.0f);
    ring_backward(pack_of(i, "mixer.in_proj"), [&](int j, const std::vector<Tensor>& w, const std::vector<Tensor>& gw) {
      SiteScope sc(rec, i, "mixer.in_proj.backward");
      Tensor part = work({R, 2 * Ds}, "grad.mixer.in_proj_shard", dt);
      m_be.copy(part.slice(1, 0, Ds), dxz.slice(1, j * Ds, Ds));
      m_be.copy(part.slice(1, Ds, Ds), dxz.slice(1, Di + j * Ds, Ds));
      m_be.matmul_dx(dh, part, w[0], true);
      m_be.matmul_dw(gw[0], part, s.h1, false);
    });
  } else {
    SiteScope sc(rec, i, "mixer.in_proj.backward");
    m_be.matmul_dx(dh, dxz, L.in_proj, false);
    m_be.matmul_dw(L.g_in_proj, dxz, s.h1, true);
  }
  dxz = Tensor{};
  s.zxbcdt = s.h1 = Tensor{};
  tp_sum(dh, i, "mixer.grad_all_reduce");
  SiteScope sc(rec, i, "mixer.norm.backward");
  m_be.rmsnorm_backward(dx, L.g_norm, dh, s.x_in, L.norm, c.norm_eps, d);
}

}  // namespace ss
