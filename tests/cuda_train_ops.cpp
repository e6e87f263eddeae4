// The cuda backend's training kernels against the cpu backend: backward
// kernels, the loss and the optimizer, each dtype (tst_cuda_ops.cpp's main
// runs this suite beside the inference kernels'; same rigs and tolerances).
#include "cuda_twins.h"

class TestCudaTrainOps : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase() {
    if (const QString why = no_device(); !why.isEmpty()) QSKIP(qPrintable(why));
  }

  void matmul_grads() {
    Rigs r;
    const int64_t M = 23, N = 37, K = 19;
    const Twin dy = r.random_mat(M, N, 2), w = r.random({N, K}, 0.3), x = r.random_mat(M, K, 1);
    Twin dx = r.random_mat(M, K, 3), dw = r.random({N, K}, 1.0, DType::F32);
    r.cpu.matmul_dx(dx.c, dy.c, w.c, true);
    r.gpu.matmul_dx(dx.d, dy.d, w.d, true);
    VERIFY_TWIN_TOL(r, dx, "matmul_dx", tolerance(2));
    r.cpu.matmul_dw(dw.c, dy.c, x.c, true);
    r.gpu.matmul_dw(dw.d, dy.d, x.d, true);
    VERIFY_TWIN_TOL(r, dw, "matmul_dw (fp32 gradient)", tolerance(1));
  }

  void row_grads() {
    Rigs r;
    const int64_t T = 13, C = 96;
    const Twin dy = r.random_mat(T, C, 1), x = r.random_mat(T, C, 2), z = r.random_mat(T, C, 1);
    const Twin w = r.make({C}, r.randn(C, 0.2, 1.0));
    for (int64_t group : {C, int64_t(32)}) {
      Twin dx = r.random_mat(T, C, 1);
      Twin dw = r.random({C}, 1.0, DType::F32);
      r.cpu.rmsnorm_backward(dx.c, dw.c, dy.c, x.c, w.c, 1e-5f, group);
      r.gpu.rmsnorm_backward(dx.d, dw.d, dy.d, x.d, w.d, 1e-5f, group);
      VERIFY_TWIN_TOL(r, dx, "rmsnorm_backward dx", tolerance(2));
      VERIFY_TWIN_TOL(r, dw, "rmsnorm_backward dw", 1e-5);
      r.cpu.rmsnorm_backward(dx.c, Tensor{}, dy.c, x.c, Tensor{}, 1e-5f, group);
      r.gpu.rmsnorm_backward(dx.d, Tensor{}, dy.d, x.d, Tensor{}, 1e-5f, group);
      VERIFY_TWIN_TOL(r, dx, "rmsnorm_backward without weight", tolerance(3));
      Twin dz = r.filled({T, C}, 0.0f), gdx = r.filled({T, C}, 0.0f);
      r.cpu.gated_rmsnorm_backward(gdx.c, dz.c, dw.c, dy.c, x.c, z.c, w.c, 1e-5f, group);
      r.gpu.gated_rmsnorm_backward(gdx.d, dz.d, dw.d, dy.d, x.d, z.d, w.d, 1e-5f, group);
      VERIFY_TWIN(r, gdx, "gated_rmsnorm_backward dx");
      VERIFY_TWIN(r, dz, "gated_rmsnorm_backward dz");
      VERIFY_TWIN_TOL(r, dw, "gated_rmsnorm_backward dw", 1e-5);
    }
    Twin db = r.random({C}, 1.0, DType::F32);
    r.cpu.bias_backward(db.c, dy.c);
    r.gpu.bias_backward(db.d, dy.d);
    VERIFY_TWIN_TOL(r, db, "bias_backward", 1e-5);
    Twin dgate = r.filled({T, C}, 0.0f), dup = r.filled({T, C}, 0.0f);
    r.cpu.silu_mul_backward(dgate.c, dup.c, dy.c, x.c, z.c);
    r.gpu.silu_mul_backward(dgate.d, dup.d, dy.d, x.d, z.d);
    VERIFY_TWIN(r, dgate, "silu_mul_backward dgate");
    VERIFY_TWIN(r, dup, "silu_mul_backward dup");
    // Repeated tokens add up in their row.
    Twin table = r.random({40, C}, 1.0, DType::F32);
    const std::vector<int32_t> tokens = {3, 7, 3, 0, 39, 7, 7, 12, 3, 1, 2, 5, 6};
    r.cpu.embedding_backward(table.c, dy.c, tokens);
    r.gpu.embedding_backward(table.d, dy.d, tokens);
    VERIFY_TWIN_TOL(r, table, "embedding_backward", 1e-5);
  }

  void loss_and_optimizer() {
    Rigs r;
    const int64_t R = 6, V = 300;
    Twin logits = r.random({R, V}, 3.0, DType::F32);
    Twin loss = r.filled({R}, 0.0f, DType::F32);
    const std::vector<int32_t> targets = {4, 299, -1, 0, 17, 150};
    r.cpu.cross_entropy(logits.c, loss.c, targets, 0.25f);
    r.gpu.cross_entropy(logits.d, loss.d, targets, 0.25f);
    VERIFY_TWIN_TOL(r, logits, "cross_entropy gradient", 1e-5);
    VERIFY_TWIN_TOL(r, loss, "cross_entropy loss", 1e-5);
    std::vector<float> v = r.randn(5000, 2.0);
    v[17] = INFINITY;
    v[4000] = kNaN;
    const Twin t = r.make({5000}, v);
    Twin out = r.make({2}, {1.5f, 0.0f}, DType::F32);
    r.cpu.count_nonfinite(out.c, t.c);
    r.gpu.count_nonfinite(out.d, t.d);
    QCOMPARE(r.gpu_values(out), r.cpu_values(out));
    QCOMPARE(r.gpu_values(out)[0], 3.5f);
    v[17] = v[4000] = 1.0f;
    const Twin finite = r.make({5000}, v);
    r.cpu.sum_squares(out.c, finite.c);
    r.gpu.sum_squares(out.d, finite.d);
    VERIFY_TWIN_TOL(r, out, "sum_squares", 1e-5);  // fp32 sums in another order
    // AdamW on a 16-bit parameter with its fp32 master copy, or on fp32 itself.
    const int64_t n = 777;
    const std::vector<float> p0 = r.randn(n, 1.0, 0.0, DType::F32);
    Twin param = r.make({n}, p0), master = r.make({n}, p0, DType::F32), grad = r.random({n});
    Twin m = r.random({n}, 0.1, DType::F32), var = r.make({n}, std::vector<float>(size_t(n), 0.01f), DType::F32);
    ss::AdamWArgs a;
    a.lr = 1e-2f;
    a.weight_decay = 0.1f;
    a.grad_scale = 0.5f;
    a.step = 3;
    const bool wide = g_dtype == DType::F32;
    r.cpu.adamw(param.c, wide ? Tensor{} : master.c, grad.c, m.c, var.c, a);
    r.gpu.adamw(param.d, wide ? Tensor{} : master.d, grad.d, m.d, var.d, a);
    VERIFY_TWIN_TOL(r, param, "adamw parameter", tolerance());
    VERIFY_TWIN_TOL(r, m, "adamw m", 1e-6);
    VERIFY_TWIN_TOL(r, var, "adamw v", 1e-6);
    if (!wide) VERIFY_TWIN_TOL(r, master, "adamw master", 1e-6);
  }

  void attention_backward_data() {
    QTest::addColumn<int>("Tq");
    QTest::addColumn<int>("Tk");
    QTest::addColumn<int>("heads");
    QTest::addColumn<int>("kv_heads");
    QTest::addColumn<int>("head_dim");
    QTest::addColumn<bool>("zigzag");
    QTest::newRow("causal, grouped") << 45 << 45 << 4 << 2 << 16 << false;
    QTest::newRow("width 64, two tiles") << 70 << 70 << 2 << 1 << 64 << false;
    QTest::newRow("zigzag rank over gathered keys") << 24 << 48 << 2 << 2 << 12 << true;
  }
  void attention_backward() {
    QFETCH(int, Tq);
    QFETCH(int, Tk);
    QFETCH(int, heads);
    QFETCH(int, kv_heads);
    QFETCH(int, head_dim);
    QFETCH(bool, zigzag);
    Rigs r;
    const std::vector<int32_t> qp = zigzag ? zigzag_pos(2 * Tq, 2, 0) : iota_pos(Tq), kp = iota_pos(Tk);
    const int64_t hq = int64_t(heads) * head_dim, hkv = int64_t(kv_heads) * head_dim;
    const Twin q = r.random_mat(Tq, hq, 1), k = r.random_mat(Tk, hkv, 2), v = r.random_mat(Tk, hkv, 1),
               dout = r.random_mat(Tq, hq, 2);
    ss::AttentionArgs a;
    a.n_heads = heads;
    a.n_kv_heads = kv_heads;
    a.head_dim = head_dim;
    a.scale = float(1.0 / std::sqrt(double(head_dim)));
    a.q_pos = qp;
    a.k_pos = kp;
    // The forward's output and lse from the cpu, the same on both sides.
    Twin o = r.filled({Tq, hq}, 0.0f), lse = r.filled({Tq, heads}, 0.0f, DType::F32);
    r.cpu.attention(o.c, q.c, k.c, v.c, a, lse.c);
    const std::vector<float> ov = r.cpu_values(o), lv = r.cpu_values(lse);
    o = r.make({Tq, hq}, ov);
    lse = r.make({Tq, heads}, lv, DType::F32);
    Twin dq = r.mat(Tq, hq, 1, std::vector<float>(size_t(Tq * hq), 0.0f)),
         dk = r.mat(Tk, hkv, 2, std::vector<float>(size_t(Tk * hkv), 0.0f)), dv = r.filled({Tk, hkv}, 0.0f);
    r.cpu.attention_backward(dq.c, dk.c, dv.c, dout.c, q.c, k.c, v.c, o.c, lse.c, a);
    r.gpu.attention_backward(dq.d, dk.d, dv.d, dout.d, q.d, k.d, v.d, o.d, lse.d, a);
    VERIFY_TWIN(r, dq, "attention_backward dq");
    VERIFY_TWIN(r, dk, "attention_backward dk");
    VERIFY_TWIN(r, dv, "attention_backward dv");
  }

  void conv1d_backward() {
    Rigs r;
    const int64_t T = 21, C = 40, K = 4;
    const Twin x = r.random_mat(T, C, 1), dy = r.random_mat(T, C, 2), w = r.random({C, K}, 0.4),
               b = r.random({C}, 0.1), state = r.random({K - 1, C});
    for (bool with_state : {true, false}) {
      Twin dx = r.filled({T, C}, 0.0f), dw = r.random({C, K}, 1.0, DType::F32), db = r.random({C}, 1.0, DType::F32);
      Twin dstate = r.filled({K - 1, C}, 0.0f);
      r.cpu.conv1d_backward(dx.c, dw.c, db.c, with_state ? dstate.c : Tensor{}, dy.c, x.c, w.c, b.c,
                            with_state ? state.c : Tensor{}, true);
      r.gpu.conv1d_backward(dx.d, dw.d, db.d, with_state ? dstate.d : Tensor{}, dy.d, x.d, w.d, b.d,
                            with_state ? state.d : Tensor{}, true);
      VERIFY_TWIN(r, dx, "conv1d_backward dx");
      VERIFY_TWIN_TOL(r, dw, "conv1d_backward dw", 1e-5);
      VERIFY_TWIN_TOL(r, db, "conv1d_backward db", 1e-5);
      if (with_state) VERIFY_TWIN(r, dstate, "conv1d_backward dstate");
    }
  }

  void ssd_scan_backward_data() {
    QTest::addColumn<int>("T");
    QTest::addColumn<bool>("states");
    QTest::newRow("one chunk, states in and out") << 40 << true;
    QTest::newRow("chunks and a tail, no states") << 150 << false;
  }
  void ssd_scan_backward() {
    QFETCH(int, T);
    QFETCH(bool, states);
    Rigs r;
    const SsdTwins in(r, T, 4, 2, 8, 16);
    const int H = in.H, G = in.G, P = in.P, N = in.N;
    const Twin dy = r.random_mat(T, H * P, 2);
    const Twin st = r.random({H, P, N}, 0.5, DType::F32), dst_out = r.random({H, P, N}, 0.5, DType::F32);
    Twin dx = r.filled({T, H * P}, 0.0f), ddt = r.filled({T, H}, 0.0f), dB = r.filled({T, G * N}, 0.0f),
         dC = r.filled({T, G * N}, 0.0f);
    Twin dbias = r.random({H}, 1.0, DType::F32), dA = r.random({H}, 1.0, DType::F32), dD = r.random({H}, 1.0, DType::F32);
    Twin dst_in = r.filled({H, P, N}, 0.0f, DType::F32);
    auto run = [&](bool cpu) {
      ss::SsdArgs a = in.args(cpu, 0.8f);
      if (states) a.state = st.on(cpu);
      a.chunk = 32;
      ss::SsdGrads g;
      g.dx = dx.on(cpu);
      g.ddt = ddt.on(cpu);
      g.dB = dB.on(cpu);
      g.dC = dC.on(cpu);
      g.d_dt_bias = dbias.on(cpu);
      g.dA_log = dA.on(cpu);
      g.dD = dD.on(cpu);
      if (states) {
        g.dstate_out = dst_out.on(cpu);
        g.dstate_in = dst_in.on(cpu);
      }
      (cpu ? static_cast<ss::Backend&>(r.cpu) : r.gpu).ssd_scan_backward(a, dy.on(cpu), g);
    };
    run(true);
    run(false);
    VERIFY_TWIN(r, dx, "ssd dx");
    VERIFY_TWIN(r, ddt, "ssd ddt");
    VERIFY_TWIN(r, dB, "ssd dB");
    VERIFY_TWIN(r, dC, "ssd dC");
    VERIFY_TWIN_TOL(r, dbias, "ssd d_dt_bias", 1e-4);
    VERIFY_TWIN_TOL(r, dA, "ssd dA_log", 1e-4);
    VERIFY_TWIN_TOL(r, dD, "ssd dD", 1e-5);
    if (states) VERIFY_TWIN_TOL(r, dst_in, "ssd dstate_in", 1e-5);
  }

  void selective_scan_backward() {
    Rigs r;
    const int64_t T = 37, Di = 24, N = 8;
    const Twin x = r.random_mat(T, Di, 1), dt = r.random_mat(T, Di, 2), z = r.random_mat(T, Di, 1),
               B = r.random_mat(T, N, 1), C = r.random_mat(T, N, 2), dy = r.random_mat(T, Di, 1);
    const Twin dt_bias = r.random({Di}, 0.5), D = r.random({Di}), A_log = r.random({Di, N}, 0.5);
    const Twin st = r.random({Di, N}, 0.5, DType::F32), dst_out = r.random({Di, N}, 0.5, DType::F32);
    Twin dx = r.filled({T, Di}, 0.0f), ddt = r.filled({T, Di}, 0.0f), dz = r.filled({T, Di}, 0.0f),
         dB = r.filled({T, N}, 0.0f), dC = r.filled({T, N}, 0.0f);
    Twin dbias = r.random({Di}, 1.0, DType::F32), dA = r.random({Di, N}, 1.0, DType::F32),
         dD = r.random({Di}, 1.0, DType::F32), dst_in = r.filled({Di, N}, 0.0f, DType::F32);
    auto run = [&](bool cpu) {
      ss::SelectiveScanArgs a;
      a.x = x.on(cpu);
      a.dt = dt.on(cpu);
      a.z = z.on(cpu);
      a.dt_bias = dt_bias.on(cpu);
      a.D = D.on(cpu);
      a.A_log = A_log.on(cpu);
      a.B = B.on(cpu);
      a.C = C.on(cpu);
      a.state = st.on(cpu);
      a.chunk = 16;
      ss::SelectiveGrads g;
      g.dx = dx.on(cpu);
      g.ddt = ddt.on(cpu);
      g.dz = dz.on(cpu);
      g.dB = dB.on(cpu);
      g.dC = dC.on(cpu);
      g.d_dt_bias = dbias.on(cpu);
      g.dA_log = dA.on(cpu);
      g.dD = dD.on(cpu);
      g.dstate_out = dst_out.on(cpu);
      g.dstate_in = dst_in.on(cpu);
      (cpu ? static_cast<ss::Backend&>(r.cpu) : r.gpu).selective_scan_backward(a, dy.on(cpu), g);
    };
    run(true);
    run(false);
    VERIFY_TWIN(r, dx, "selective dx");
    VERIFY_TWIN(r, ddt, "selective ddt");
    VERIFY_TWIN(r, dz, "selective dz");
    VERIFY_TWIN(r, dB, "selective dB");
    VERIFY_TWIN(r, dC, "selective dC");
    VERIFY_TWIN_TOL(r, dbias, "selective d_dt_bias", 1e-5);
    VERIFY_TWIN_TOL(r, dA, "selective dA_log", 1e-5);
    VERIFY_TWIN_TOL(r, dD, "selective dD", 1e-5);
    VERIFY_TWIN_TOL(r, dst_in, "selective dstate_in", 1e-5);
  }
};

int run_cuda_train_ops(int argc, char** argv) {
  TestCudaTrainOps t;
  return exec_own_functions(t, argc, argv);
}

#include "cuda_train_ops.moc"
