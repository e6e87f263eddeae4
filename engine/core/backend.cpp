#include "core/backend.h"

#include <algorithm>
#include <vector>
#include <stdexcept>

#include "core/backend_checks.h"
#include "core/error.h"

namespace ss {
namespace detail {
namespace {
using Runs = std::vector<std::pair<int64_t, int64_t>>;
constexpr size_t kMaxRuns = 64;

// [first, last] runs of consecutive increasing positions; none past `limit`.
Runs runs_of(std::span<const int32_t> pos, size_t limit) {
  Runs runs;
  const int32_t* p = pos.data();
  const size_t n = pos.size();
  for (size_t i = 0; i < n;) {
    if (runs.size() == limit) return {};
    size_t j = i + 1;
    while (j < n && p[j] == p[j - 1] + 1) ++j;
    runs.push_back({p[i], p[j - 1]});
    i = j;
  }
  return runs;
}

// Causal (query, key) pairs between runs of query and key positions.
double pairs_of_runs(const Runs& qr, const Runs& kr) {
  double pairs = 0;
  for (auto [qa, qb] : qr)
    for (auto [ka, kb] : kr) {
      // Queries q in [qa, qb] see min(max(q - ka + 1, 0), kb - ka + 1) keys of [ka, kb].
      const int64_t n = kb - ka + 1;
      const int64_t ramp_lo = std::max(qa, ka), ramp_hi = std::min(qb, kb);  // q - ka + 1 keys
      if (ramp_lo <= ramp_hi) {
        const int64_t c = ramp_hi - ramp_lo + 1;
        pairs += double(c) * double(ramp_lo - ka + 1) + double(c) * double(c - 1) / 2;
      }
      const int64_t full_lo = std::max(qa, kb + 1);  // every key of the run
      if (full_lo <= qb) pairs += double(qb - full_lo + 1) * double(n);
    }
  return pairs;
}
}  // namespace

double visible_pairs(std::span<const int32_t> q_pos, std::span<const int32_t> k_pos) {
  const Runs qr = runs_of(q_pos, kMaxRuns), kr = runs_of(k_pos, kMaxRuns);
  if ((!qr.empty() || q_pos.empty()) && (!kr.empty() || k_pos.empty())) return pairs_of_runs(qr, kr);
  std::vector<int32_t> keys(k_pos.begin(), k_pos.end());
  std::sort(keys.begin(), keys.end());
  double pairs = 0;
  for (int32_t p : q_pos) pairs += double(std::upper_bound(keys.begin(), keys.end(), p) - keys.begin());
  return pairs;
}
std::vector<AttentionRun> attention_runs(std::span<const int32_t> q_pos, std::span<const int32_t> k_pos,
                                         size_t limit) {
  std::vector<AttentionRun> out;
  // The keys' runs once for all query runs (a 1M-token step's keys are
  // megabytes of positions, walked per query run before).
  const Runs kr = runs_of(k_pos, kMaxRuns);
  const bool key_runs = !kr.empty() || k_pos.empty();
  size_t first = 0;
  for (auto [a, b] : runs_of(q_pos, limit)) {
    const size_t n = size_t(b - a + 1);
    AttentionRun r;
    r.queries = int64_t(n);
    if (key_runs) {
      for (auto [ka, kb] : kr) r.keys += std::max<int64_t>(0, std::min(kb, b) - ka + 1);  // keys <= b
      r.pairs = pairs_of_runs({{a, b}}, kr);
    } else {
      r.keys = std::count_if(k_pos.begin(), k_pos.end(), [b = b](int32_t k) { return k <= b; });
      r.pairs = visible_pairs(q_pos.subspan(first, n), k_pos);
    }
    out.push_back(r);
    first += n;
  }
  return out;
}
}  // namespace detail

using namespace detail;

Tensor Backend::alloc(const Shape& shape, Category cat, std::string label, DType dtype) {
  int64_t bytes = 0;
  if (__builtin_mul_overflow(numel(shape), dtype_size(dtype), &bytes))
    throw UsageError(label + ": " + ss::shape_str(shape) + " of " + std::string(dtype_name(dtype)) +
                     " is more than 2^63 bytes");
  m_alloc.charge(cat, bytes, label);  // throws OomError before anything is allocated
  void* data = nullptr;
  if (has_data() && bytes > 0) {
    data = allocate_data(bytes);
    if (!data) {
      m_alloc.release(cat, bytes);
      throw OomError("host allocation of " + format_bytes(bytes) + " for " + label + " failed",
                     std::string(category_name(cat)), bytes, m_alloc.state().total, m_alloc.capacity());
    }
  }
  auto buf = std::make_shared<Buffer>(m_alloc, cat, bytes, std::move(label), data, free_fn());
  return Tensor(std::move(buf), shape, dtype);
}

void Backend::execute(const char* op, double flops, double bytes, std::vector<int64_t> dims,
                      const std::function<void()>& kernel, DType) {
  const int64_t t0 = m_rec.now();
  kernel();
  m_rec.span(StreamKind::Compute, op, t0, m_rec.now(), flops, bytes, std::move(dims));
}

void Backend::upload(const Tensor& dst, const void* src, DType src_dtype) {
  require(dst.is_contiguous(), "upload", "destination must be contiguous");
  if (has_data()) k_upload(dst, src, src_dtype);
}

void Backend::download(const Tensor& src, float* dst) {
  require(src.is_contiguous() && is_float(src.dtype()), "download", "source must be contiguous floats");
  if (has_data()) k_download(src, dst);
}

void Backend::fill(const Tensor& dst, float value) {
  if (has_data()) k_fill(dst, value);
}

namespace {
// y[M,N] = x[M,K] · w[N,K]^T: 2-D operands of matching shapes.
void require_matmul_shapes(const char* op, const Tensor& y, const Tensor& x, const Tensor& w) {
  require_2d(y, op, "y");
  require_2d(x, op, "x");
  require_2d(w, op, "w");
  require(w.cols() == x.cols() && y.rows() == x.rows() && y.cols() == w.rows(), op,
          "shapes y" + y.shape_str() + " = x" + x.shape_str() + " · w" + w.shape_str() + "^T do not match");
}
}  // namespace

void Backend::matmul(const Tensor& y, const Tensor& x, const Tensor& w, bool accumulate) {
  require_matmul_shapes("matmul", y, x, w);
  const int64_t M = x.rows(), K = x.cols(), N = w.rows();
  const double bytes = fbytes(x) + fbytes(w) + fbytes(y) * (accumulate ? 2 : 1);
  execute("gemm", 2.0 * M * N * K, bytes, {M, N, K}, [&] { k_matmul(y, x, w, accumulate); }, x.dtype());
}

void Backend::matmul_group(std::span<const Tensor> ys, const Tensor& x, std::span<const Tensor> ws) {
  require(!ws.empty() && ys.size() == ws.size(), "matmul_group", "one output per weight, at least one");
  const int64_t M = x.rows(), K = x.cols();
  int64_t N = 0;
  double bytes = fbytes(x);
  for (size_t i = 0; i < ws.size(); ++i) {
    require_matmul_shapes("matmul_group", ys[i], x, ws[i]);
    N += ws[i].rows();
    bytes += fbytes(ws[i]) + fbytes(ys[i]);
  }
  execute("gemm", 2.0 * M * N * K, bytes, {M, N, K}, [&] { k_matmul_group(ys, x, ws); }, x.dtype());
}

void Backend::embedding(const Tensor& y, const Tensor& table, std::span<const int32_t> tokens) {
  require_2d(y, "embedding", "y");
  require_2d(table, "embedding", "table");
  require(y.rows() == int64_t(tokens.size()) && y.cols() == table.cols(), "embedding", "shape mismatch");
  for (int32_t t : tokens)
    require(t >= 0 && t < table.rows(), "embedding", "token id " + std::to_string(t) + " outside the vocabulary");
  execute("embedding", 0, 2.0 * fbytes(y), {y.rows(), y.cols()}, [&] { k_embedding(y, table, tokens); });
}

void Backend::rmsnorm(const Tensor& y, const Tensor& x, const Tensor& w, float eps, int64_t group) {
  require_2d(y, "rmsnorm", "y");
  require_2d(x, "rmsnorm", "x");
  require(y.rows() == x.rows() && y.cols() == x.cols() && group > 0 && x.cols() % group == 0, "rmsnorm",
          "shape mismatch or group does not divide the columns");
  require(!w.defined() || w.numel() == x.cols(), "rmsnorm", "weight size");
  execute("rmsnorm", 4.0 * x.numel(), fbytes(x) + fbytes(y) + fbytes(w), {x.rows(), x.cols()},
          [&] { k_rmsnorm(y, x, Tensor{}, w, eps, group); });
}

void Backend::gated_rmsnorm(const Tensor& y, const Tensor& x, const Tensor& z, const Tensor& w,
                            float eps, int64_t group) {
  require_2d(y, "gated_rmsnorm", "y");
  require_2d(x, "gated_rmsnorm", "x");
  require_2d(z, "gated_rmsnorm", "z");
  require(y.rows() == x.rows() && z.rows() == x.rows() && y.cols() == x.cols() && z.cols() == x.cols() &&
              group > 0 && x.cols() % group == 0 && w.numel() == x.cols(),
          "gated_rmsnorm", "shape mismatch");
  execute("gated_rmsnorm", 8.0 * x.numel(), fbytes(x) + fbytes(z) + fbytes(y), {x.rows(), x.cols()},
          [&] { k_rmsnorm(y, x, z, w, eps, group); });
}

void Backend::rope(const Tensor& x, int n_heads, int head_dim, std::span<const int32_t> pos,
                   std::span<const double> inv_freq) {
  require_2d(x, "rope", "x");
  require(x.cols() == int64_t(n_heads) * head_dim && head_dim % 2 == 0 && x.rows() == int64_t(pos.size()) &&
              int64_t(inv_freq.size()) == head_dim / 2,
          "rope", "shape mismatch");
  execute("rope", 6.0 * x.numel(), 2.0 * fbytes(x), {x.rows(), x.cols()},
          [&] { k_rope(x, n_heads, head_dim, pos, inv_freq); });
}

void Backend::attention(const Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v,
                        const AttentionArgs& a, const Tensor& lse) {
  for (auto* t : {&o, &q, &k, &v}) require_2d(*t, "attention", "q, k, v and o");
  const int64_t hq = int64_t(a.n_heads) * a.head_dim, hkv = int64_t(a.n_kv_heads) * a.head_dim;
  require(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0, "attention", "heads must be a multiple of kv heads");
  require(q.cols() == hq && o.cols() == hq && k.cols() == hkv && v.cols() == hkv && o.rows() == q.rows() &&
              v.rows() == k.rows() && int64_t(a.q_pos.size()) == q.rows() && int64_t(a.k_pos.size()) == k.rows(),
          "attention", "shape mismatch");
  require(!lse.defined() || (lse.is_contiguous() && lse.numel() == q.rows() * a.n_heads), "attention", "lse shape");
  struct Runs {  // set for this call only, even when execute throws
    std::vector<AttentionRun>& runs;
    ~Runs() { runs.clear(); }
  } scope{m_attention_runs};
  // The visible (query, key) pairs: for a backend without data, the sum of
  // its query runs' (the simulator costs the call by them).
  double pairs = 0;
  if (!has_data()) m_attention_runs = detail::attention_runs(a.q_pos, a.k_pos);
  for (const AttentionRun& r : m_attention_runs) pairs += r.pairs;
  if (m_attention_runs.empty()) pairs = visible_pairs(a.q_pos, a.k_pos);
  // FLOPs: QK^T and PV, 2*head_dim each per pair.
  const double flops = pairs * a.n_heads * 4.0 * a.head_dim;
  execute("attention", flops, fbytes(q) + fbytes(k) + fbytes(v) + fbytes(o),
          {q.rows(), k.rows(), a.n_heads, a.head_dim}, [&] { k_attention(o, q, k, v, a, lse); }, q.dtype());
}

void Backend::attention_merge(const Tensor& o, const Tensor& lse, const Tensor& o2, const Tensor& lse2,
                              int n_heads, int head_dim) {
  require_2d(o, "attention_merge", "o");
  require_2d(o2, "attention_merge", "o2");
  require(o.rows() == o2.rows() && o.cols() == int64_t(n_heads) * head_dim && o2.cols() == o.cols() &&
              lse.numel() == o.rows() * n_heads && lse2.numel() == lse.numel(),
          "attention_merge", "shape mismatch");
  execute("attention_merge", 4.0 * o.numel(), 3.0 * fbytes(o), {o.rows(), o.cols()},
          [&] { k_attention_merge(o, lse, o2, lse2, n_heads, head_dim); });
}

void Backend::silu_mul(const Tensor& y, const Tensor& gate, const Tensor& up) {
  for (auto* t : {&y, &gate, &up}) require_2d(*t, "silu_mul", "y, gate and up");
  require(y.rows() == gate.rows() && y.rows() == up.rows() && y.cols() == gate.cols() && y.cols() == up.cols(),
          "silu_mul", "shape mismatch");
  execute("silu_mul", 5.0 * y.numel(), 3.0 * fbytes(y), {y.rows(), y.cols()}, [&] { k_silu_mul(y, gate, up); });
}

void Backend::add(const Tensor& y, const Tensor& a, const Tensor& b) {
  for (auto* t : {&y, &a, &b}) require_2d(*t, "add", "y, a and b");
  require(y.rows() == a.rows() && y.rows() == b.rows() && y.cols() == a.cols() && y.cols() == b.cols(), "add",
          "shape mismatch");
  execute("add", double(y.numel()), 3.0 * fbytes(y), {y.rows(), y.cols()}, [&] { k_add(y, a, b); });
}

void Backend::add_bias(const Tensor& y, const Tensor& b) {
  require_2d(y, "add_bias", "y");
  require(b.shape().size() == 1 && b.shape()[0] == y.cols(), "add_bias",
          "bias " + b.shape_str() + " does not match the " + std::to_string(y.cols()) + " columns of y");
  execute("add_bias", double(y.numel()), 2.0 * fbytes(y) + fbytes(b), {y.rows(), y.cols()}, [&] { k_add_bias(y, b); });
}

void Backend::copy(const Tensor& dst, const Tensor& src) {
  require(dst.shape() == src.shape(), "copy", "shape " + dst.shape_str() + " vs " + src.shape_str());
  execute("copy", 0, 2.0 * fbytes(dst), dst.shape(), [&] { k_copy(dst, src); });
}

void Backend::conv1d_causal(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b,
                            const Tensor& state, bool silu) {
  require_2d(y, "conv1d", "y");
  require_2d(x, "conv1d", "x");
  require(w.ndim() == 2 && w.is_contiguous(), "conv1d", "w must be [channels, kernel]");
  const int64_t C = x.cols(), K = w.cols();
  require(w.rows() == C && y.rows() == x.rows() && y.cols() == C && (!b.defined() || b.numel() == C),
          "conv1d", "shape mismatch");
  require(!state.defined() || (state.is_contiguous() && state.numel() == (K - 1) * C), "conv1d", "state shape");
  execute("conv1d", 2.0 * x.rows() * C * K, fbytes(x) + fbytes(y) + fbytes(w), {x.rows(), C, K},
          [&] { k_conv1d_causal(y, x, w, b, state, silu); });
}

void Backend::ssd_scan(const SsdArgs& a) {
  const int64_t T = a.x.rows(), P = a.head_dim, N = a.d_state, H = a.n_heads, G = a.n_groups;
  require(H > 0 && G > 0 && H % G == 0 && a.chunk > 0, "ssd_scan", "heads must be a multiple of groups");
  for (auto* t : {&a.y, &a.x, &a.dt, &a.B, &a.C}) require_2d(*t, "ssd_scan", "y, x, dt, B and C");
  require(a.x.cols() == H * P && a.y.cols() == H * P && a.y.rows() == T && a.dt.rows() == T && a.dt.cols() == H &&
              a.B.rows() == T && a.C.rows() == T && a.B.cols() == G * N && a.C.cols() == G * N &&
              a.dt_bias.numel() == H && a.A_log.numel() == H && a.D.numel() == H,
          "ssd_scan", "shape mismatch");
  require(!a.state.defined() || (a.state.is_contiguous() && a.state.numel() == H * P * N), "ssd_scan", "state shape");
  // Work of the chunked algorithm: C·B^T per group, masked (CB)·X per head,
  // chunk states X^T·B, and the inter-chunk term C·S per head.
  double flops = 0;
  for (int64_t c0 = 0; c0 < T; c0 += a.chunk) {
    const double L = double(std::min<int64_t>(a.chunk, T - c0));
    flops += 2.0 * G * L * L * N + 2.0 * H * L * L * P + 4.0 * H * L * P * N;
  }
  execute("ssd_scan", flops, fbytes(a.x) + fbytes(a.y) + fbytes(a.B) + fbytes(a.C) + 2 * fbytes(a.state),
          {T, H, P, N, G, a.chunk}, [&] { k_ssd_scan(a); }, a.x.dtype());
}

void Backend::selective_scan(const SelectiveScanArgs& a) {
  const int64_t T = a.x.rows(), Di = a.x.cols(), N = a.A_log.numel() / std::max<int64_t>(1, Di);
  for (auto* t : {&a.y, &a.x, &a.dt, &a.B, &a.C}) require_2d(*t, "selective_scan", "y, x, dt, B and C");
  require(a.y.rows() == T && a.y.cols() == Di && a.dt.rows() == T && a.dt.cols() == Di && a.A_log.numel() == Di * N &&
              a.B.rows() == T && a.C.rows() == T && a.B.cols() == N && a.C.cols() == N && a.D.numel() == Di &&
              a.dt_bias.numel() == Di && (!a.z.defined() || (a.z.rows() == T && a.z.cols() == Di)),
          "selective_scan", "shape mismatch");
  require(!a.state.defined() || (a.state.is_contiguous() && a.state.numel() == Di * N), "selective_scan", "state shape");
  execute("selective_scan", 7.0 * T * Di * N, fbytes(a.x) + fbytes(a.y) + fbytes(a.dt) + fbytes(a.z) + 2 * fbytes(a.state),
          {T, Di, N}, [&] { k_selective_scan(a); });
}

void Backend::quantize(const Tensor& out, const Tensor& in, const QuantSpec& spec, uint64_t counter) {
  require(in.is_contiguous() && out.is_contiguous() && out.nbytes() >= quantized_bytes(in.numel(), spec), "quantize",
          "needs contiguous tensors and room for " + std::to_string(quantized_bytes(in.numel(), spec)) + " bytes");
  const double q = double(quantized_bytes(in.numel(), spec));
  execute("quantize", 4.0 * double(in.numel()), fbytes(in) + q, {in.numel()},
          [&] { k_quantize(out, in, spec, counter); });
}

void Backend::dequantize(const Tensor& out, const Tensor& in, const QuantSpec& spec, bool accumulate) {
  require(in.is_contiguous() && out.is_contiguous() && in.nbytes() >= quantized_bytes(out.numel(), spec),
          "dequantize", "needs contiguous tensors and the quantized bytes of every value");
  const double q = double(quantized_bytes(out.numel(), spec));
  execute("dequantize", 2.0 * double(out.numel()), fbytes(out) * (accumulate ? 2 : 1) + q, {out.numel()},
          [&] { k_dequantize(out, in, spec, accumulate); });
}

void Backend::ssd_state_correction(const SsdArgs& a) {
  const int64_t T = a.y.rows(), H = a.n_heads, P = a.head_dim, N = a.d_state;
  require(a.state.defined() && a.state.numel() == H * P * N && a.C.rows() == T && a.dt.rows() == T,
          "ssd_state_correction", "needs y, C, dt and the incoming state");
  execute("ssd_state_correction", 2.0 * T * H * P * N, fbytes(a.y) * 2 + fbytes(a.C) + fbytes(a.state),
          {T, H, P, N}, [&] { k_ssd_state_correction(a); }, a.y.dtype());
}

void Backend::selective_state_correction(const SelectiveScanArgs& a) {
  const int64_t T = a.y.rows(), Di = a.y.cols(), N = a.A_log.numel() / std::max<int64_t>(1, Di);
  require(a.state.defined() && a.state.numel() == Di * N && a.C.rows() == T && a.dt.rows() == T,
          "selective_state_correction", "needs y, C, dt and the incoming state");
  execute("selective_state_correction", 4.0 * T * Di * N, fbytes(a.y) * 2 + fbytes(a.dt) + fbytes(a.z), {T, Di, N},
          [&] { k_selective_state_correction(a); });
}

void Backend::ssd_state_advance(const Tensor& state, const Tensor& chunk_state, const Tensor& log_decay) {
  require(state.numel() == chunk_state.numel() && state.ndim() == 3 && log_decay.numel() == state.size(0),
          "ssd_state_advance", "shape mismatch");
  execute("state_advance", 2.0 * state.numel(), 3.0 * fbytes(state), state.shape(),
          [&] { k_ssd_state_advance(state, chunk_state, log_decay); });
}

void Backend::selective_state_advance(const Tensor& state, const Tensor& A_log, const Tensor& chunk_state,
                                      const Tensor& dt_sum) {
  require(state.numel() == chunk_state.numel() && A_log.numel() == state.numel() && dt_sum.numel() == state.size(0),
          "selective_state_advance", "shape mismatch");
  execute("state_advance", 3.0 * state.numel(), 4.0 * fbytes(state), state.shape(),
          [&] { k_selective_state_advance(state, A_log, chunk_state, dt_sum); });
}

void Backend::gated_norm_sumsq(const Tensor& ss, const Tensor& x, const Tensor& z, int64_t local_group,
                               int64_t slot0) {
  require_2d(x, "gated_norm_sumsq", "x");
  require(ss.is_contiguous() && ss.rows() == x.rows() && local_group > 0 && x.cols() % local_group == 0 &&
              slot0 + x.cols() / local_group <= ss.cols(),
          "gated_norm_sumsq", "shape mismatch");
  execute("gated_norm_sumsq", 4.0 * x.numel(), fbytes(x) + fbytes(z), {x.rows(), x.cols()},
          [&] { k_gated_norm_sumsq(ss, x, z, local_group, slot0); });
}

void Backend::gated_rmsnorm_apply(const Tensor& y, const Tensor& x, const Tensor& z, const Tensor& w, const Tensor& ss,
                                  float eps, int64_t local_group, int64_t total_group, int64_t slot0) {
  require_2d(x, "gated_rmsnorm_apply", "x");
  require(y.rows() == x.rows() && w.numel() == x.cols() && ss.rows() == x.rows() && total_group > 0,
          "gated_rmsnorm_apply", "shape mismatch");
  execute("gated_rmsnorm", 6.0 * x.numel(), fbytes(x) + fbytes(z) + fbytes(y), {x.rows(), x.cols()},
          [&] { k_gated_rmsnorm_apply(y, x, z, w, ss, eps, local_group, total_group, slot0); });
}

int32_t Backend::argmax_row(const Tensor& x, int64_t row) {
  require_2d(x, "argmax", "x");
  require(row >= 0 && row < x.rows(), "argmax", "row out of range");
  int32_t r = 0;
  execute("argmax", double(x.cols()), 4.0 * x.cols(), {x.cols()}, [&] { r = k_argmax_row(x, row); });
  return r;
}

void Backend::k_upload(const Tensor&, const void*, DType) { no_kernel("upload"); }
void Backend::k_download(const Tensor&, float*) { no_kernel("download"); }
void Backend::k_fill(const Tensor&, float) { no_kernel("fill"); }
void Backend::k_matmul(const Tensor&, const Tensor&, const Tensor&, bool) { no_kernel("matmul"); }
void Backend::k_matmul_group(std::span<const Tensor> ys, const Tensor& x, std::span<const Tensor> ws) {
  for (size_t i = 0; i < ws.size(); ++i) k_matmul(ys[i], x, ws[i], false);
}
void Backend::k_embedding(const Tensor&, const Tensor&, std::span<const int32_t>) { no_kernel("embedding"); }
void Backend::k_rmsnorm(const Tensor&, const Tensor&, const Tensor&, const Tensor&, float, int64_t) { no_kernel("rmsnorm"); }
void Backend::k_rope(const Tensor&, int, int, std::span<const int32_t>, std::span<const double>) { no_kernel("rope"); }
void Backend::k_add_bias(const Tensor&, const Tensor&) { no_kernel("add_bias"); }
void Backend::k_attention(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AttentionArgs&, const Tensor&) { no_kernel("attention"); }
void Backend::k_attention_merge(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int, int) { no_kernel("attention_merge"); }
void Backend::k_silu_mul(const Tensor&, const Tensor&, const Tensor&) { no_kernel("silu_mul"); }
void Backend::k_add(const Tensor&, const Tensor&, const Tensor&) { no_kernel("add"); }
void Backend::k_copy(const Tensor&, const Tensor&) { no_kernel("copy"); }
void Backend::k_conv1d_causal(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool) { no_kernel("conv1d_causal"); }
void Backend::k_ssd_scan(const SsdArgs&) { no_kernel("ssd_scan"); }
void Backend::k_selective_scan(const SelectiveScanArgs&) { no_kernel("selective_scan"); }
int32_t Backend::k_argmax_row(const Tensor&, int64_t) {
  no_kernel("argmax_row");
}
void Backend::k_ssd_state_correction(const SsdArgs&) { no_kernel("ssd_state_correction"); }
void Backend::k_quantize(const Tensor&, const Tensor&, const QuantSpec&, uint64_t) { no_kernel("quantize"); }
void Backend::k_dequantize(const Tensor&, const Tensor&, const QuantSpec&, bool) { no_kernel("dequantize"); }
void Backend::k_selective_state_correction(const SelectiveScanArgs&) { no_kernel("selective_state_correction"); }
void Backend::k_ssd_state_advance(const Tensor&, const Tensor&, const Tensor&) { no_kernel("ssd_state_advance"); }
void Backend::k_selective_state_advance(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_kernel("selective_state_advance");
}
void Backend::k_gated_norm_sumsq(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t) {
  no_kernel("gated_norm_sumsq");
}
void Backend::k_gated_rmsnorm_apply(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, float,
                                    int64_t, int64_t, int64_t) {
  no_kernel("gated_rmsnorm_apply");
}

}  // namespace ss
