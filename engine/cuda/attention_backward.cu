// Causal attention's backward, flash-style (Dao 2023, FlashAttention-2,
// Alg. 2), as cpu/attention_backward.cpp: a tile's scores are recomputed
// from Q, K and the forward's lse, so no Tq x Tk matrix exists. With
// P = exp(scale Q K^T - lse) and D_i = dO_i . O_i:
//   dV = P^T dO,  dP = dO V^T,  dS = P o (dP - D),  dQ = scale dS K,  dK = scale dS^T Q.
// Two kernels keep every output owned by one block: dQ per (query tile,
// head), dK and dV per (key tile, kv head) summed over the heads sharing it.
// fp32 tiles in shared memory for every dtype.
#include <climits>

#include "cuda/common.cuh"

namespace ss::SS_CUDA_NS {
namespace {

constexpr int kThreads = 256;

template <int HDMAX>
struct Bwd {
  static constexpr int B = HDMAX <= 128 ? 32 : 16;  // query and key tile
  static constexpr int LD = HDMAX + 1;
  static constexpr int PER = B * HDMAX / kThreads;  // accumulators per thread
  // Q, dO, K, V tiles; P and dS tiles; key positions and the rows' lse and D.
  static constexpr size_t smem_bytes() {
    return sizeof(float) * (size_t(4) * B * LD + 2 * B * (B + 1) + 2 * B) + sizeof(int) * 2 * B;
  }
};

// D[i, h] = dO_i . O_i per head.
__global__ void attn_bwd_d_kernel(Mat dout, Mat o, AttnShape a, float* D) {
  const int64_t n = a.Tq * a.n_heads;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / a.n_heads, c0 = (i % a.n_heads) * a.head_dim;
    float s = 0;
    for (int d = 0; d < a.head_dim; ++d) s += at(o, t, c0 + d) * at(dout, t, c0 + d);
    D[i] = s;
  }
}

// The tile of P and dS for queries [i0, i0 + B) of head h and keys [j0, j0 + B)
// (staged: Qs, dOs, Ks, Vs; rows' lse and D; key positions), into Ps and dSs.
template <int HDMAX>
SS_DEV void tile_p_ds(const AttnShape& a, const float* Qs, const float* dOs, const float* Ks, const float* Vs,
                      const float* lse_s, const float* D_s, const int* qp, const int* kp, int nq, int nk, float* Ps,
                      float* dSs) {
  using W = Bwd<HDMAX>;
  constexpr int B = W::B, LD = W::LD;
  for (int e = threadIdx.x; e < B * B; e += kThreads) {
    const int i = e / B, j = e % B;
    float p = 0, ds = 0;
    if (i < nq && j < nk && kp[j] <= qp[i] && lse_s[i] != -INFINITY) {
      float s = 0, dp = 0;
      for (int d = 0; d < a.head_dim; ++d) {
        s += Qs[i * LD + d] * Ks[j * LD + d];
        dp += dOs[i * LD + d] * Vs[j * LD + d];
      }
      p = expf(s * a.scale - lse_s[i]);
      ds = p * (dp - D_s[i]);
    }
    Ps[i * (B + 1) + j] = p;
    dSs[i * (B + 1) + j] = ds;
  }
}

// Stages rows [r0, r0 + n) of columns [c0, c0 + hd) as fp32 (zeros past n).
template <int HDMAX>
SS_DEV void stage(float* dst, const Mat& m, int64_t r0, int n, int64_t c0, int hd) {
  using W = Bwd<HDMAX>;
  for (int e = threadIdx.x; e < W::B * hd; e += kThreads) {
    const int r = e / hd, d = e % hd;
    dst[r * W::LD + d] = r < n ? at(m, r0 + r, c0 + d) : 0.0f;
  }
}

template <int HDMAX>
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dq_kernel(Mat dq, Mat dout, Mat q, Mat k, Mat v, AttnShape a, const float* lse, const float* D,
                       const int32_t* qpos, const int32_t* kpos) {
  using W = Bwd<HDMAX>;
  constexpr int B = W::B, LD = W::LD, PER = W::PER;
  SS_DYNAMIC_SMEM(float, smem);
  float *Qs = smem, *dOs = Qs + B * LD, *Ks = dOs + B * LD, *Vs = Ks + B * LD, *Ps = Vs + B * LD,
        *dSs = Ps + B * (B + 1), *lse_s = dSs + B * (B + 1), *D_s = lse_s + B;
  int* qp = reinterpret_cast<int*>(D_s + B);
  int* kp = qp + B;
  const int hd = a.head_dim, h = int(blockIdx.y), kvh = h / (a.n_heads / a.n_kv_heads);
  const int64_t i0 = int64_t(blockIdx.x) * B;
  const int nq = int(min64(B, a.Tq - i0));
  stage<HDMAX>(Qs, q, i0, nq, int64_t(h) * hd, hd);
  stage<HDMAX>(dOs, dout, i0, nq, int64_t(h) * hd, hd);
  for (int i = threadIdx.x; i < B; i += kThreads) {
    qp[i] = i < nq ? qpos[i0 + i] : INT_MIN;
    lse_s[i] = i < nq ? lse[(i0 + i) * a.n_heads + h] : -INFINITY;
    D_s[i] = i < nq ? D[(i0 + i) * a.n_heads + h] : 0.0f;
  }
  float acc[PER];
  for (int e = 0; e < PER; ++e) acc[e] = 0.0f;
  __syncthreads();
  int qmax = INT_MIN;
  for (int i = 0; i < nq; ++i) qmax = imax(qmax, qp[i]);
  for (int64_t j0 = 0; j0 < a.Tk; j0 += B) {
    const int nk = int(min64(B, a.Tk - j0));
    int kmin = INT_MAX;
    for (int j = 0; j < nk; ++j) kmin = imin(kmin, kpos[j0 + j]);
    if (kmin > qmax) continue;  // the same for every thread
    __syncthreads();            // the previous tile is read
    stage<HDMAX>(Ks, k, j0, nk, int64_t(kvh) * hd, hd);
    stage<HDMAX>(Vs, v, j0, nk, int64_t(kvh) * hd, hd);
    for (int j = threadIdx.x; j < B; j += kThreads) kp[j] = j < nk ? kpos[j0 + j] : INT_MAX;
    __syncthreads();
    tile_p_ds<HDMAX>(a, Qs, dOs, Ks, Vs, lse_s, D_s, qp, kp, nq, nk, Ps, dSs);
    __syncthreads();
    for (int e = 0; e < PER; ++e) {
      const int idx = threadIdx.x + kThreads * e, i = idx / HDMAX, d = idx % HDMAX;
      if (d >= hd) continue;
      float s = 0;
      for (int j = 0; j < nk; ++j) s += dSs[i * (B + 1) + j] * Ks[j * LD + d];
      acc[e] += a.scale * s;
    }
  }
  for (int e = 0; e < PER; ++e) {
    const int idx = threadIdx.x + kThreads * e, i = idx / HDMAX, d = idx % HDMAX;
    if (d < hd && i < nq) put(dq, i0 + i, int64_t(h) * hd + d, acc[e]);
  }
}

template <int HDMAX>
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dkv_kernel(Mat dk, Mat dv, Mat dout, Mat q, Mat k, Mat v, AttnShape a, const float* lse, const float* D,
                        const int32_t* qpos, const int32_t* kpos) {
  using W = Bwd<HDMAX>;
  constexpr int B = W::B, LD = W::LD, PER = W::PER;
  SS_DYNAMIC_SMEM(float, smem);
  float *Qs = smem, *dOs = Qs + B * LD, *Ks = dOs + B * LD, *Vs = Ks + B * LD, *Ps = Vs + B * LD,
        *dSs = Ps + B * (B + 1), *lse_s = dSs + B * (B + 1), *D_s = lse_s + B;
  int* qp = reinterpret_cast<int*>(D_s + B);
  int* kp = qp + B;
  const int hd = a.head_dim, kvh = int(blockIdx.y), group = a.n_heads / a.n_kv_heads;
  const int64_t j0 = int64_t(blockIdx.x) * B;
  const int nk = int(min64(B, a.Tk - j0));
  stage<HDMAX>(Ks, k, j0, nk, int64_t(kvh) * hd, hd);
  stage<HDMAX>(Vs, v, j0, nk, int64_t(kvh) * hd, hd);
  for (int j = threadIdx.x; j < B; j += kThreads) kp[j] = j < nk ? kpos[j0 + j] : INT_MAX;
  float dk_acc[PER], dv_acc[PER];
  for (int e = 0; e < PER; ++e) dk_acc[e] = dv_acc[e] = 0.0f;
  __syncthreads();
  int kmin = INT_MAX;
  for (int j = 0; j < nk; ++j) kmin = imin(kmin, kp[j]);
  for (int h = kvh * group; h < (kvh + 1) * group; ++h)
    for (int64_t i0 = 0; i0 < a.Tq; i0 += B) {
      const int nq = int(min64(B, a.Tq - i0));
      int qmax = INT_MIN;
      for (int i = 0; i < nq; ++i) qmax = imax(qmax, qpos[i0 + i]);
      if (kmin > qmax) continue;
      __syncthreads();
      stage<HDMAX>(Qs, q, i0, nq, int64_t(h) * hd, hd);
      stage<HDMAX>(dOs, dout, i0, nq, int64_t(h) * hd, hd);
      for (int i = threadIdx.x; i < B; i += kThreads) {
        qp[i] = i < nq ? qpos[i0 + i] : INT_MIN;
        lse_s[i] = i < nq ? lse[(i0 + i) * a.n_heads + h] : -INFINITY;
        D_s[i] = i < nq ? D[(i0 + i) * a.n_heads + h] : 0.0f;
      }
      __syncthreads();
      tile_p_ds<HDMAX>(a, Qs, dOs, Ks, Vs, lse_s, D_s, qp, kp, nq, nk, Ps, dSs);
      __syncthreads();
      for (int e = 0; e < PER; ++e) {
        const int idx = threadIdx.x + kThreads * e, j = idx / HDMAX, d = idx % HDMAX;
        if (d >= hd) continue;
        float sv = 0, sk = 0;
        for (int i = 0; i < nq; ++i) {
          sv += Ps[i * (B + 1) + j] * dOs[i * LD + d];
          sk += dSs[i * (B + 1) + j] * Qs[i * LD + d];
        }
        dv_acc[e] += sv;
        dk_acc[e] += a.scale * sk;
      }
    }
  for (int e = 0; e < PER; ++e) {
    const int idx = threadIdx.x + kThreads * e, j = idx / HDMAX, d = idx % HDMAX;
    if (d < hd && j < nk) {
      put(dk, j0 + j, int64_t(kvh) * hd + d, dk_acc[e]);
      put(dv, j0 + j, int64_t(kvh) * hd + d, dv_acc[e]);
    }
  }
}

template <int HDMAX>
void launch_backward(const Mat& dq, const Mat& dk, const Mat& dv, const Mat& dout, const Mat& q, const Mat& k,
                     const Mat& v, const AttnShape& a, const float* lse, const float* D, const int32_t* qpos,
                     const int32_t* kpos, Stream s) {
  using W = Bwd<HDMAX>;
  auto* dq_kernel = &attn_bwd_dq_kernel<HDMAX>;
  auto* dkv_kernel = &attn_bwd_dkv_kernel<HDMAX>;
  allow_smem("attention_backward (dq)", dq_kernel, W::smem_bytes());
  allow_smem("attention_backward (dk, dv)", dkv_kernel, W::smem_bytes());
  SS_LAUNCH(dq_kernel, dim3(unsigned((a.Tq + W::B - 1) / W::B), unsigned(a.n_heads)), kThreads, W::smem_bytes(), s)(
      dq, dout, q, k, v, a, lse, D, qpos, kpos);
  check_launch("attention_backward (dq)");
  SS_LAUNCH(dkv_kernel, dim3(unsigned((a.Tk + W::B - 1) / W::B), unsigned(a.n_kv_heads)), kThreads, W::smem_bytes(),
            s)(dk, dv, dout, q, k, v, a, lse, D, qpos, kpos);
  check_launch("attention_backward (dk, dv)");
}

}  // namespace

void attention_backward(const Mat& dq, const Mat& dk, const Mat& dv, const Mat& dout, const Mat& q, const Mat& k,
                        const Mat& v, const Mat& o, const float* lse, const AttnShape& a, const int32_t* q_pos,
                        const int32_t* k_pos, Scratch& scratch, Stream s) {
  expect(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0 && a.head_dim > 0 && a.head_dim <= 256,
         "attention_backward", "heads must be a multiple of kv heads, head width 1 to 256");
  if (a.Tk > 0 && a.Tq == 0) {  // no query sees a key: their gradients are zero
    fill(dk, 0.0f, s);
    fill(dv, 0.0f, s);
    return;
  }
  if (a.Tq == 0) return;
  auto* D = static_cast<float*>(scratch.get(kScratchGrad, int64_t(sizeof(float)) * a.Tq * a.n_heads));
  SS_LAUNCH(attn_bwd_d_kernel, blocks_for(a.Tq * a.n_heads, kThreads), kThreads, 0, s)(dout, o, a, D);
  check_launch("attention_backward (D)");
  if (a.Tk == 0) {
    fill(dq, 0.0f, s);
    return;
  }
  const int hd = a.head_dim;
  if (hd <= 32) launch_backward<32>(dq, dk, dv, dout, q, k, v, a, lse, D, q_pos, k_pos, s);
  else if (hd <= 64) launch_backward<64>(dq, dk, dv, dout, q, k, v, a, lse, D, q_pos, k_pos, s);
  else if (hd <= 128) launch_backward<128>(dq, dk, dv, dout, q, k, v, a, lse, D, q_pos, k_pos, s);
  else launch_backward<256>(dq, dk, dv, dout, q, k, v, a, lse, D, q_pos, k_pos, s);
}

}  // namespace ss::SS_CUDA_NS
