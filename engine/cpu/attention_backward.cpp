// Causal attention's backward, flash-style (Dao 2023, FlashAttention-2,
// Alg. 2): the scores of a (query block, key block) tile are recomputed from
// Q, K and the forward's log-sum-exp, so no Tq×Tk matrix ever exists. With
// P = exp(scale Q K^T - lse) and D_i = dO_i · O_i:
//   dV = P^T dO,  dP = dO V^T,  dS = P ∘ (dP - D),  dQ = scale dS K,  dK = scale dS^T Q.
// Two passes keep every output owned by one thread: dQ over (head, query
// block), then dK and dV over (kv head, key block), each recomputing its
// tiles. The tile products are sgemm calls on fp32 tiles (16-bit operands
// are widened once).
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/kernels.h"

namespace ss::cpu {
namespace {

constexpr int64_t kBlock = 64;

struct Tile {
  const float* p;
  int64_t ld;
};

// c[m,n] (ldc) = a[m,k] · b (b [n,k] used transposed when bt, else [k,n]); accumulate adds.
void gemm(bool at, bool bt, int64_t m, int64_t n, int64_t k, Tile a, Tile b, float alpha, float* c, int64_t ldc,
          bool accumulate) {
  cblas_sgemm(CblasRowMajor, at ? CblasTrans : CblasNoTrans, bt ? CblasTrans : CblasNoTrans, int(m), int(n), int(k),
              alpha, a.p, int(a.ld), b.p, int(b.ld), accumulate ? 1.0f : 0.0f, c, int(ldc));
}

struct Inputs {
  const F32Rows &q, &k, &v, &dout;
  const std::vector<float>& D;  // [Tq, heads]
  const float* lse;
  const AttentionArgs& a;
};

// P and dS of one tile (bq queries from i0 of head h, bk keys from j0 of kv head kvh), row-major [bq, kBlock].
void tile_grads(const Inputs& in, int h, int kvh, int64_t i0, int64_t bq, int64_t j0, int64_t bk, float* P,
                float* dS) {
  const AttentionArgs& a = in.a;
  const int hd = a.head_dim;
  const Tile qt{in.q.row(i0) + int64_t(h) * hd, in.q.ld}, kt{in.k.row(j0) + int64_t(kvh) * hd, in.k.ld};
  const Tile vt{in.v.row(j0) + int64_t(kvh) * hd, in.v.ld}, dot{in.dout.row(i0) + int64_t(h) * hd, in.dout.ld};
  gemm(false, true, bq, bk, hd, qt, kt, a.scale, P, kBlock, false);
  gemm(false, true, bq, bk, hd, dot, vt, 1.0f, dS, kBlock, false);
  for (int64_t i = 0; i < bq; ++i) {
    const float l = in.lse[(i0 + i) * a.n_heads + h], Di = in.D[size_t((i0 + i) * a.n_heads + h)];
    const int32_t qp = a.q_pos[size_t(i0 + i)];
    float* pr = P + i * kBlock;
    float* sr = dS + i * kBlock;
    for (int64_t j = 0; j < bk; ++j) {
      const bool visible = a.k_pos[size_t(j0 + j)] <= qp && l != -INFINITY;
      pr[j] = visible ? fast_exp(pr[j] - l) : 0.0f;
      sr[j] = pr[j] * (sr[j] - Di);
    }
  }
}

}  // namespace

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse, const AttentionArgs& a) {
  const int64_t Tq = q.rows(), Tk = k.rows();
  const int nh = a.n_heads, hd = a.head_dim, group = a.n_heads / a.n_kv_heads;
  const F32Rows qf(q), kf(k), vf(v), of(o), df(dout);
  F32Out dqo(dq, false), dko(dk, false), dvo(dv, false);
  std::vector<float> D(size_t(Tq * nh));
  for (int64_t i = 0; i < Tq; ++i)
    for (int h = 0; h < nh; ++h) {
      const float* x = of.row(i) + int64_t(h) * hd;
      const float* g = df.row(i) + int64_t(h) * hd;
      float s = 0;
      for (int d = 0; d < hd; ++d) s += x[d] * g[d];
      D[size_t(i * nh + h)] = s;
    }
  const Inputs in{qf, kf, vf, df, D, lse.data<float>(), a};
  // Visibility per block: the latest query and the earliest key.
  const int64_t nq = (Tq + kBlock - 1) / kBlock, nk = (Tk + kBlock - 1) / kBlock;
  std::vector<int32_t> q_last(size_t(nq), INT32_MIN), k_first(size_t(nk), INT32_MAX);
  for (int64_t i = 0; i < Tq; ++i) q_last[size_t(i / kBlock)] = std::max(q_last[size_t(i / kBlock)], a.q_pos[size_t(i)]);
  for (int64_t j = 0; j < Tk; ++j) k_first[size_t(j / kBlock)] = std::min(k_first[size_t(j / kBlock)], a.k_pos[size_t(j)]);

  // Pass 1: dQ per (head, query block).
#pragma omp parallel
  {
    std::vector<float> P(size_t(kBlock * kBlock)), dS(P.size());
#pragma omp for schedule(dynamic) collapse(2)
    for (int h = 0; h < nh; ++h)
      for (int64_t bi = 0; bi < nq; ++bi) {
        const int64_t i0 = bi * kBlock, bq = std::min(kBlock, Tq - i0);
        const int kvh = h / group;
        float* dqr = dqo.row(i0) + int64_t(h) * hd;
        for (int64_t i = 0; i < bq; ++i) std::fill_n(dqr + i * dqo.ld, hd, 0.0f);
        for (int64_t bj = 0; bj < nk; ++bj) {
          if (k_first[size_t(bj)] > q_last[size_t(bi)]) continue;
          const int64_t j0 = bj * kBlock, bk = std::min(kBlock, Tk - j0);
          tile_grads(in, h, kvh, i0, bq, j0, bk, P.data(), dS.data());
          gemm(false, false, bq, hd, bk, {dS.data(), kBlock}, {kf.row(j0) + int64_t(kvh) * hd, kf.ld}, a.scale, dqr,
               dqo.ld, true);
        }
      }
  }
  // Pass 2: dK and dV per (kv head, key block), summed over the heads of the group.
#pragma omp parallel
  {
    std::vector<float> P(size_t(kBlock * kBlock)), dS(P.size());
#pragma omp for schedule(dynamic) collapse(2)
    for (int kvh = 0; kvh < a.n_kv_heads; ++kvh)
      for (int64_t bj = 0; bj < nk; ++bj) {
        const int64_t j0 = bj * kBlock, bk = std::min(kBlock, Tk - j0);
        float* dkr = dko.row(j0) + int64_t(kvh) * hd;
        float* dvr = dvo.row(j0) + int64_t(kvh) * hd;
        for (int64_t j = 0; j < bk; ++j) {
          std::fill_n(dkr + j * dko.ld, hd, 0.0f);
          std::fill_n(dvr + j * dvo.ld, hd, 0.0f);
        }
        for (int h = kvh * group; h < (kvh + 1) * group; ++h)
          for (int64_t bi = 0; bi < nq; ++bi) {
            if (k_first[size_t(bj)] > q_last[size_t(bi)]) continue;
            const int64_t i0 = bi * kBlock, bq = std::min(kBlock, Tq - i0);
            tile_grads(in, h, kvh, i0, bq, j0, bk, P.data(), dS.data());
            gemm(true, false, bk, hd, bq, {P.data(), kBlock}, {df.row(i0) + int64_t(h) * hd, df.ld}, 1.0f, dvr,
                 dvo.ld, true);
            gemm(true, false, bk, hd, bq, {dS.data(), kBlock}, {qf.row(i0) + int64_t(h) * hd, qf.ld}, a.scale, dkr,
                 dko.ld, true);
          }
      }
  }
  dqo.commit();
  dko.commit();
  dvo.commit();
}

}  // namespace ss::cpu
