// The Backend's training methods: shape checks, FLOP and byte counts, then
// the backend's kernel (or the simulator's cost). Backward FLOPs follow the
// forward's: a GEMM's data and weight gradients are one GEMM each; the
// attention backward recomputes the scores (QK^T) and does four more
// products of the forward's size (dV, dP, dQ, dK): 2.5 times its FLOPs.
#include <algorithm>
#include <vector>

#include "core/backend.h"
#include "core/backend_checks.h"

namespace ss {
using namespace detail;

void Backend::matmul_dx(const Tensor& dx, const Tensor& dy, const Tensor& w, bool accumulate) {
  require_2d(dx, "matmul_dx", "dx");
  require_2d(dy, "matmul_dx", "dy");
  require_2d(w, "matmul_dx", "w");
  const int64_t M = dy.rows(), N = dy.cols(), K = w.cols();
  require(w.rows() == N && dx.rows() == M && dx.cols() == K, "matmul_dx",
          "shapes dx" + dx.shape_str() + " = dy" + dy.shape_str() + " · w" + w.shape_str() + " do not match");
  const double bytes = fbytes(dy) + fbytes(w) + fbytes(dx) * (accumulate ? 2 : 1);
  execute("gemm", 2.0 * M * N * K, bytes, {M, K, N}, [&] { k_matmul_dx(dx, dy, w, accumulate); }, dy.dtype());
}

void Backend::matmul_dw(const Tensor& dw, const Tensor& dy, const Tensor& x, bool accumulate) {
  require_2d(dw, "matmul_dw", "dw");
  require_2d(dy, "matmul_dw", "dy");
  require_2d(x, "matmul_dw", "x");
  const int64_t M = dy.rows(), N = dy.cols(), K = x.cols();
  require(x.rows() == M && dw.rows() == N && dw.cols() == K, "matmul_dw",
          "shapes dw" + dw.shape_str() + " = dy" + dy.shape_str() + "^T · x" + x.shape_str() + " do not match");
  const double bytes = fbytes(dy) + fbytes(x) + fbytes(dw) * (accumulate ? 2 : 1);
  execute("gemm", 2.0 * M * N * K, bytes, {N, K, M}, [&] { k_matmul_dw(dw, dy, x, accumulate); }, dy.dtype());
}

void Backend::embedding_backward(const Tensor& dtable, const Tensor& dy, std::span<const int32_t> tokens) {
  require_2d(dtable, "embedding_backward", "dtable");
  require_2d(dy, "embedding_backward", "dy");
  require(dy.rows() == int64_t(tokens.size()) && dy.cols() == dtable.cols(), "embedding_backward", "shape mismatch");
  for (int32_t t : tokens)
    require(t >= 0 && t < dtable.rows(), "embedding_backward", "token id " + std::to_string(t) + " outside the table");
  execute("embedding_backward", double(dy.numel()), 3.0 * fbytes(dy), {dy.rows(), dy.cols()},
          [&] { k_embedding_backward(dtable, dy, tokens); });
}

void Backend::rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                               const Tensor& w, float eps, int64_t group) {
  for (auto* t : {&dx, &dy, &x}) require_2d(*t, "rmsnorm_backward", "dx, dy and x");
  require(dx.rows() == x.rows() && dy.rows() == x.rows() && dx.cols() == x.cols() && dy.cols() == x.cols() &&
              group > 0 && x.cols() % group == 0,
          "rmsnorm_backward", "shape mismatch or group does not divide the columns");
  require(w.defined() == dw.defined() && (!w.defined() || (w.numel() == x.cols() && dw.numel() == x.cols() &&
                                                           dw.is_contiguous())),
          "rmsnorm_backward", "weight and its gradient");
  execute("rmsnorm_backward", 10.0 * x.numel(), fbytes(x) + fbytes(dy) + 2 * fbytes(dx) + 2 * fbytes(dw),
          {x.rows(), x.cols()}, [&] { k_rmsnorm_backward(dx, dw, dy, x, w, eps, group); });
}

void Backend::rope_backward(const Tensor& dx, int n_heads, int head_dim, std::span<const int32_t> pos,
                            std::span<const double> inv_freq) {
  // A rotation's transpose is the rotation by the opposite angle.
  std::vector<int32_t> back(pos.size());
  std::transform(pos.begin(), pos.end(), back.begin(), [](int32_t p) { return -p; });
  require_2d(dx, "rope_backward", "dx");
  require(dx.cols() == int64_t(n_heads) * head_dim && head_dim % 2 == 0 && dx.rows() == int64_t(pos.size()) &&
              int64_t(inv_freq.size()) == head_dim / 2,
          "rope_backward", "shape mismatch");
  execute("rope_backward", 6.0 * dx.numel(), 2.0 * fbytes(dx), {dx.rows(), dx.cols()},
          [&] { k_rope(dx, n_heads, head_dim, back, inv_freq); });
}

void Backend::bias_backward(const Tensor& db, const Tensor& dy) {
  require_2d(dy, "bias_backward", "dy");
  require(db.shape().size() == 1 && db.shape()[0] == dy.cols() && db.dtype() == DType::F32 && db.is_contiguous(),
          "bias_backward", "db must be fp32 [" + std::to_string(dy.cols()) + "], is " + db.shape_str());
  execute("bias_backward", double(dy.numel()), fbytes(dy) + 2 * fbytes(db), {dy.rows(), dy.cols()},
          [&] { k_bias_backward(db, dy); });
}

void Backend::silu_mul_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dy, const Tensor& gate,
                                const Tensor& up) {
  for (auto* t : {&dgate, &dup, &dy, &gate, &up}) require_2d(*t, "silu_mul_backward", "every operand");
  for (auto* t : {&dgate, &dup, &gate, &up})
    require(t->rows() == dy.rows() && t->cols() == dy.cols(), "silu_mul_backward", "shape mismatch");
  execute("silu_mul_backward", 12.0 * dy.numel(), 5.0 * fbytes(dy), {dy.rows(), dy.cols()},
          [&] { k_silu_mul_backward(dgate, dup, dy, gate, up); });
}

void Backend::attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                                 const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                 const Tensor& lse, const AttentionArgs& a) {
  for (auto* t : {&dq, &dk, &dv, &dout, &q, &k, &v, &o}) require_2d(*t, "attention_backward", "every operand");
  const int64_t hq = int64_t(a.n_heads) * a.head_dim, hkv = int64_t(a.n_kv_heads) * a.head_dim;
  require(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0, "attention_backward",
          "heads must be a multiple of kv heads");
  const int64_t Tq = q.rows(), Tk = k.rows();
  require(q.cols() == hq && o.cols() == hq && dout.cols() == hq && dq.cols() == hq && k.cols() == hkv &&
              v.cols() == hkv && dk.cols() == hkv && dv.cols() == hkv && o.rows() == Tq && dout.rows() == Tq &&
              dq.rows() == Tq && v.rows() == Tk && dk.rows() == Tk && dv.rows() == Tk &&
              int64_t(a.q_pos.size()) == Tq && int64_t(a.k_pos.size()) == Tk,
          "attention_backward", "shape mismatch");
  require(lse.defined() && lse.is_contiguous() && lse.dtype() == DType::F32 && lse.numel() == Tq * a.n_heads,
          "attention_backward", "needs the forward's fp32 lse [Tq, heads]");
  const double flops = visible_pairs(a.q_pos, a.k_pos) * a.n_heads * 10.0 * a.head_dim;
  execute("attention_backward", flops,
          fbytes(q) + fbytes(k) + fbytes(v) + fbytes(o) + fbytes(dout) + fbytes(dq) + fbytes(dk) + fbytes(dv),
          {Tq, Tk, a.n_heads, a.head_dim}, [&] { k_attention_backward(dq, dk, dv, dout, q, k, v, o, lse, a); },
          q.dtype());
}

void Backend::cross_entropy(const Tensor& logits, const Tensor& loss, std::span<const int32_t> targets, float scale) {
  require_2d(logits, "cross_entropy", "logits");
  require(logits.dtype() == DType::F32 && loss.dtype() == DType::F32 && loss.is_contiguous() &&
              loss.numel() == logits.rows() && int64_t(targets.size()) == logits.rows(),
          "cross_entropy", "fp32 logits [R, V], fp32 loss [R] and R targets");
  for (int32_t t : targets)
    require(t < logits.cols(), "cross_entropy", "target " + std::to_string(t) + " outside the vocabulary");
  execute("cross_entropy", 6.0 * logits.numel(), 2.0 * fbytes(logits), {logits.rows(), logits.cols()},
          [&] { k_cross_entropy(logits, loss, targets, scale); });
}

void Backend::conv1d_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dstate,
                              const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& state,
                              bool silu) {
  for (auto* t : {&dx, &dy, &x}) require_2d(*t, "conv1d_backward", "dx, dy and x");
  const int64_t T = x.rows(), C = x.cols(), K = w.cols();
  require(w.ndim() == 2 && w.rows() == C && dw.numel() == C * K && dw.is_contiguous() && dx.rows() == T &&
              dx.cols() == C && dy.rows() == T && dy.cols() == C && b.defined() == db.defined() &&
              (!b.defined() || (b.numel() == C && db.numel() == C)),
          "conv1d_backward", "shape mismatch");
  require(!state.defined() || (state.is_contiguous() && state.numel() == (K - 1) * C), "conv1d_backward", "state");
  require(!dstate.defined() || (dstate.is_contiguous() && dstate.numel() == (K - 1) * C), "conv1d_backward",
          "dstate");
  execute("conv1d_backward", 6.0 * T * C * K, fbytes(x) + fbytes(dy) + fbytes(dx), {T, C, K},
          [&] { k_conv1d_backward(dx, dw, db, dstate, dy, x, w, b, state, silu); });
}

void Backend::ssd_scan_backward(const SsdArgs& a, const Tensor& dy, const SsdGrads& g) {
  const int64_t T = a.x.rows(), P = a.head_dim, N = a.d_state, H = a.n_heads, G = a.n_groups;
  require(H > 0 && G > 0 && H % G == 0 && a.chunk > 0, "ssd_scan_backward", "heads must be a multiple of groups");
  for (auto* t : {&a.x, &a.dt, &a.B, &a.C, &dy, &g.dx, &g.ddt, &g.dB, &g.dC})
    require_2d(*t, "ssd_scan_backward", "x, dt, B, C, dy and their gradients");
  require(a.x.cols() == H * P && dy.rows() == T && dy.cols() == H * P && g.dx.rows() == T && g.dx.cols() == H * P &&
              a.dt.rows() == T && a.dt.cols() == H && g.ddt.rows() == T && g.ddt.cols() == H && a.B.rows() == T &&
              a.C.rows() == T && a.B.cols() == G * N && a.C.cols() == G * N && g.dB.rows() == T &&
              g.dC.rows() == T && g.dB.cols() == G * N && g.dC.cols() == G * N && a.dt_bias.numel() == H &&
              a.A_log.numel() == H && a.D.numel() == H && g.d_dt_bias.numel() == H && g.dA_log.numel() == H &&
              g.dD.numel() == H,
          "ssd_scan_backward", "shape mismatch");
  for (auto* t : {&a.state, &g.dstate_out, &g.dstate_in})
    require(!t->defined() || (t->is_contiguous() && t->dtype() == DType::F32 && t->numel() == H * P * N),
            "ssd_scan_backward", "states are fp32 [heads, head_dim, d_state]");
  // About three times the forward's work: the chunk states recomputed, then
  // the quadratic intra-chunk form and the state terms in reverse.
  double flops = 0;
  for (int64_t c0 = 0; c0 < T; c0 += a.chunk) {
    const double L = double(std::min<int64_t>(a.chunk, T - c0));
    flops += 3 * (2.0 * H * L * L * N + 2.0 * H * L * L * P + 4.0 * H * L * P * N);
  }
  execute("ssd_scan_backward", flops, 2 * (fbytes(a.x) + fbytes(a.B) + fbytes(a.C)) + fbytes(dy), {T, H, P, N, G, a.chunk},
          [&] { k_ssd_scan_backward(a, dy, g); }, a.x.dtype());
}

void Backend::selective_scan_backward(const SelectiveScanArgs& a, const Tensor& dy, const SelectiveGrads& g) {
  const int64_t T = a.x.rows(), Di = a.x.cols(), N = a.A_log.numel() / std::max<int64_t>(1, Di);
  for (auto* t : {&a.x, &a.dt, &a.B, &a.C, &dy, &g.dx, &g.ddt, &g.dB, &g.dC})
    require_2d(*t, "selective_scan_backward", "x, dt, B, C, dy and their gradients");
  require(a.dt.rows() == T && a.dt.cols() == Di && a.A_log.numel() == Di * N && a.B.rows() == T && a.C.rows() == T &&
              a.B.cols() == N && a.C.cols() == N && a.D.numel() == Di && a.dt_bias.numel() == Di &&
              dy.rows() == T && dy.cols() == Di && g.dx.rows() == T && g.dx.cols() == Di && g.ddt.rows() == T &&
              g.ddt.cols() == Di && g.dB.rows() == T && g.dB.cols() == N && g.dC.rows() == T && g.dC.cols() == N &&
              g.d_dt_bias.numel() == Di && g.dA_log.numel() == Di * N && g.dD.numel() == Di &&
              a.z.defined() == g.dz.defined() && (!a.z.defined() || (a.z.rows() == T && a.z.cols() == Di &&
                                                                     g.dz.rows() == T && g.dz.cols() == Di)),
          "selective_scan_backward", "shape mismatch");
  for (auto* t : {&a.state, &g.dstate_out, &g.dstate_in})
    require(!t->defined() || (t->is_contiguous() && t->dtype() == DType::F32 && t->numel() == Di * N),
            "selective_scan_backward", "states are fp32 [channels, d_state]");
  execute("selective_scan_backward", 3 * 7.0 * T * Di * N, 2 * (fbytes(a.x) + fbytes(a.dt) + fbytes(a.z)) + fbytes(dy),
          {T, Di, N}, [&] { k_selective_scan_backward(a, dy, g); });
}

void Backend::gated_rmsnorm_backward(const Tensor& dx, const Tensor& dz, const Tensor& dw, const Tensor& dy,
                                     const Tensor& x, const Tensor& z, const Tensor& w, float eps, int64_t group) {
  for (auto* t : {&dx, &dz, &dy, &x, &z}) require_2d(*t, "gated_rmsnorm_backward", "dx, dz, dy, x and z");
  for (auto* t : {&dx, &dz, &dy, &z})
    require(t->rows() == x.rows() && t->cols() == x.cols(), "gated_rmsnorm_backward", "shape mismatch");
  require(group > 0 && x.cols() % group == 0 && w.numel() == x.cols() && dw.numel() == x.cols() && dw.is_contiguous(),
          "gated_rmsnorm_backward", "weight, its gradient, or the group");
  execute("gated_rmsnorm_backward", 16.0 * x.numel(), 3 * fbytes(x) + 2 * fbytes(dy), {x.rows(), x.cols()},
          [&] { k_gated_rmsnorm_backward(dx, dz, dw, dy, x, z, w, eps, group); });
}

void Backend::sum_squares(const Tensor& out, const Tensor& t) {
  require(out.dtype() == DType::F32 && out.numel() >= 1 && t.is_contiguous(), "sum_squares",
          "fp32 out and a contiguous tensor");
  execute("sum_squares", 2.0 * double(t.numel()), fbytes(t), {t.numel()}, [&] { k_sum_squares(out, t); });
}

void Backend::count_nonfinite(const Tensor& out, const Tensor& t) {
  require(out.dtype() == DType::F32 && out.numel() >= 1 && t.is_contiguous(), "count_nonfinite",
          "fp32 out and a contiguous tensor");
  execute("count_nonfinite", double(t.numel()), fbytes(t), {t.numel()}, [&] { k_count_nonfinite(out, t); });
}

void Backend::adamw(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                    const AdamWArgs& a) {
  const int64_t n = param.numel();
  require(param.is_contiguous() && grad.is_contiguous() && grad.numel() == n && m.numel() == n && v.numel() == n &&
              m.dtype() == DType::F32 && v.dtype() == DType::F32 &&
              (!master.defined() || (master.numel() == n && master.dtype() == DType::F32)) &&
              (master.defined() || param.dtype() == DType::F32),
          "adamw", "param, grad and fp32 moments of one size (and fp32 master weights for a 16-bit param)");
  const double bytes = fbytes(param) * 2 + fbytes(grad) + 2 * (fbytes(m) + fbytes(v) + fbytes(master));
  execute("adamw", 12.0 * double(n), bytes, {n}, [&] { k_adamw(param, master, grad, m, v, a); });
}

void Backend::k_matmul_dx(const Tensor&, const Tensor&, const Tensor&, bool) { no_kernel("matmul_dx"); }
void Backend::k_matmul_dw(const Tensor&, const Tensor&, const Tensor&, bool) { no_kernel("matmul_dw"); }
void Backend::k_bias_backward(const Tensor&, const Tensor&) { no_kernel("bias_backward"); }
void Backend::k_embedding_backward(const Tensor&, const Tensor&, std::span<const int32_t>) {
  no_kernel("embedding_backward");
}
void Backend::k_rmsnorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, float,
                                 int64_t) {
  no_kernel("rmsnorm_backward");
}
void Backend::k_silu_mul_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_kernel("silu_mul_backward");
}
void Backend::k_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                   const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AttentionArgs&) {
  no_kernel("attention_backward");
}
void Backend::k_cross_entropy(const Tensor&, const Tensor&, std::span<const int32_t>, float) {
  no_kernel("cross_entropy");
}
void Backend::k_sum_squares(const Tensor&, const Tensor&) { no_kernel("sum_squares"); }
void Backend::k_conv1d_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool) {
  no_kernel("conv1d_backward");
}
void Backend::k_ssd_scan_backward(const SsdArgs&, const Tensor&, const SsdGrads&) { no_kernel("ssd_scan_backward"); }
void Backend::k_selective_scan_backward(const SelectiveScanArgs&, const Tensor&, const SelectiveGrads&) {
  no_kernel("selective_scan_backward");
}
void Backend::k_gated_rmsnorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                       const Tensor&, const Tensor&, float, int64_t) {
  no_kernel("gated_rmsnorm_backward");
}
void Backend::k_count_nonfinite(const Tensor&, const Tensor&) { no_kernel("count_nonfinite"); }
void Backend::k_adamw(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AdamWArgs&) {
  no_kernel("adamw");
}

}  // namespace ss
