// Causal grouped-query attention by position, blockwise with an online
// softmax (FlashAttention's recurrence, Dao et al. 2022, §3.1): no Tq x Tk
// matrix ever exists. Two kernels:
//  - attn_tiled: fp32 arithmetic on tiles staged in shared memory, for any
//    dtype and head width up to 256; its key range can be split over blocks
//    (flash-decoding) whose partials attn_combine merges by log-sum-exp, so a
//    few queries over a long cache still fill the GPU;
//  - attn_wmma: bf16/fp16 Q, K, V on tensor cores (WMMA 16x16x16, fp32
//    accumulation) for head widths 64 and 128 and 64 queries or more: S = Q K^T
//    per warp, the softmax in fp32, P rounded to the dtype for P V, as
//    FlashAttention does.
// Softmax statistics, lse and the merge are fp32 whatever the dtype.
#include "cuda/common.cuh"

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <mma.h>
#else
#include "cuda/emu/wmma.h"
#endif

#include <climits>

namespace ss::SS_CUDA_NS {
namespace {

constexpr int kThreads = 128;

// ---------------------------------------------------------------- tiled

// Tiles: BQ queries (kRowThreads threads per query row) by BK keys.
template <int HDMAX>
struct Tiled {
  static constexpr int BQ = 16, kRowThreads = kThreads / BQ, BK = HDMAX <= 128 ? 32 : 16;
  static constexpr int LD = HDMAX + 1;  // padded rows: no bank conflicts down a column
  static constexpr size_t smem_bytes() { return sizeof(float) * (size_t(BQ + 2 * BK) * LD + BQ * BK) + sizeof(int) * (BK + 2); }
};

// grid (query tiles, heads, key splits). One split: o and lse are written;
// several: this block's unnormalised output, max and sum go to `part`
// ([split][Tq][heads] x (head_dim + 2) floats) for attn_combine.
template <int HDMAX>
__global__ void __launch_bounds__(kThreads)
    attn_tiled_kernel(Mat o, Mat q, Mat k, Mat v, AttnShape a, const int32_t* qpos, const int32_t* kpos, float* lse,
                      float* part) {
  using Tl = Tiled<HDMAX>;
  constexpr int BQ = Tl::BQ, BK = Tl::BK, RT = Tl::kRowThreads, LD = Tl::LD, PER = HDMAX / RT;
  const int hd = a.head_dim, h = int(blockIdx.y), kvh = h / (a.n_heads / a.n_kv_heads);
  const int splits = int(gridDim.z), split = int(blockIdx.z);
  const int64_t q0 = int64_t(blockIdx.x) * BQ;
  const int64_t k_begin = a.Tk * split / splits, k_end = a.Tk * (split + 1) / splits;
  SS_DYNAMIC_SMEM(float, smem);
  float* Qs = smem;
  float* Ks = Qs + BQ * LD;
  float* Vs = Ks + BK * LD;
  float* Ps = Vs + BK * LD;
  int* kp = reinterpret_cast<int*>(Ps + BQ * BK);
  int* flags = kp + BK;  // [0]: the tile's largest query position, [1]: a key tile's smallest key position
  const int tid = int(threadIdx.x), r = tid / RT, sub = tid % RT;

  for (int i = tid; i < BQ * hd; i += kThreads) {
    const int rr = i / hd, d = i % hd;
    const int64_t qi = q0 + rr;
    Qs[rr * LD + d] = qi < a.Tq ? at(q, qi, int64_t(h) * hd + d) * a.scale : 0.0f;
  }
  const int64_t qi = q0 + r;
  const bool row_valid = qi < a.Tq;
  const int my_pos = row_valid ? qpos[qi] : INT_MIN;
  if (tid == 0) {
    int mx = INT_MIN;
    for (int rr = 0; rr < BQ && q0 + rr < a.Tq; ++rr) mx = imax(mx, qpos[q0 + rr]);
    flags[0] = mx;
  }

  float m = -INFINITY, l = 0.0f, acc[PER];
  for (int i = 0; i < PER; ++i) acc[i] = 0.0f;
  for (int64_t k0 = k_begin; k0 < k_end; k0 += BK) {
    const int nb = int(min64(BK, k_end - k0));
    __syncthreads();  // the previous tile is read
    for (int i = tid; i < BK * hd; i += kThreads) {
      const int kk = i / hd, d = i % hd;
      const bool ok = kk < nb;
      Ks[kk * LD + d] = ok ? at(k, k0 + kk, int64_t(kvh) * hd + d) : 0.0f;
      Vs[kk * LD + d] = ok ? at(v, k0 + kk, int64_t(kvh) * hd + d) : 0.0f;
    }
    for (int i = tid; i < BK; i += kThreads) kp[i] = i < nb ? kpos[k0 + i] : INT_MAX;
    __syncthreads();
    if (tid == 0) {
      int mn = INT_MAX;
      for (int i = 0; i < nb; ++i) mn = imin(mn, kp[i]);
      flags[1] = mn;
    }
    __syncthreads();
    if (flags[1] > flags[0]) continue;  // every key of the tile is in the future of every query

    constexpr int SK = BK / RT;  // scores per thread
    float s[SK];
    float mx = m;
    for (int j = 0; j < SK; ++j) {
      const int kk = sub + RT * j;
      float dot = 0.0f;
      for (int d = 0; d < hd; ++d) dot += Qs[r * LD + d] * Ks[kk * LD + d];
      const bool visible = row_valid && kk < nb && kp[kk] <= my_pos;
      s[j] = visible ? dot : -INFINITY;
      mx = fmaxf(mx, s[j]);
    }
    for (int off = RT / 2; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off, RT));
    float psum = 0.0f;
    for (int j = 0; j < SK; ++j) {
      const float p = s[j] == -INFINITY ? 0.0f : expf(s[j] - mx);
      Ps[r * BK + sub + RT * j] = p;
      psum += p;
    }
    for (int off = RT / 2; off > 0; off /= 2) psum += __shfl_xor_sync(0xffffffffu, psum, off, RT);
    if (mx != -INFINITY) {
      const float corr = expf(m - mx);
      l = l * corr + psum;
      m = mx;
      for (int i = 0; i < PER; ++i) acc[i] *= corr;
    }
    __syncwarp();  // the row's probabilities (written by lanes of this warp) are visible
    for (int kk = 0; kk < nb; ++kk) {
      const float p = Ps[r * BK + kk];
      if (p == 0.0f) continue;
      for (int i = 0; i < PER; ++i) {
        const int d = sub + RT * i;
        if (d < hd) acc[i] += p * Vs[kk * LD + d];
      }
    }
  }
  if (!row_valid) return;
  if (!part) {
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int i = 0; i < PER; ++i) {
      const int d = sub + RT * i;
      if (d < hd) put(o, qi, int64_t(h) * hd + d, acc[i] * inv);
    }
    if (lse && sub == 0) lse[qi * a.n_heads + h] = l > 0.0f ? m + logf(l) : -INFINITY;
    return;
  }
  float* pr = part + ((int64_t(split) * a.Tq + qi) * a.n_heads + h) * (hd + 2);
  for (int i = 0; i < PER; ++i) {
    const int d = sub + RT * i;
    if (d < hd) pr[d] = acc[i];
  }
  if (sub == 0) {
    pr[hd] = m;
    pr[hd + 1] = l;
  }
}

// A thread per (query, head, value): the splits' partials weighed by e^(m_s - max).
__global__ void attn_combine_kernel(Mat o, AttnShape a, int splits, const float* part, float* lse) {
  const int hd = a.head_dim;
  const int64_t n = a.Tq * a.n_heads * hd;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / hd;  // query * heads + head
    const int d = int(i % hd);
    const int64_t stride = a.Tq * a.n_heads * (hd + 2);
    float mx = -INFINITY;
    for (int s = 0; s < splits; ++s) {
      const float* pr = part + s * stride + row * (hd + 2);
      if (pr[hd + 1] > 0.0f) mx = fmaxf(mx, pr[hd]);
    }
    float sum = 0.0f, out = 0.0f;
    if (mx != -INFINITY)
      for (int s = 0; s < splits; ++s) {
        const float* pr = part + s * stride + row * (hd + 2);
        if (pr[hd + 1] <= 0.0f) continue;
        const float w = expf(pr[hd] - mx);
        sum += w * pr[hd + 1];
        out += w * pr[d];
      }
    const int64_t qi = row / a.n_heads;
    const int h = int(row % a.n_heads);
    put(o, qi, int64_t(h) * hd + d, sum > 0.0f ? out / sum : 0.0f);
    if (lse && d == 0) lse[row] = sum > 0.0f ? mx + logf(sum) : -INFINITY;
  }
}

// ---------------------------------------------------------------- decode

// A few queries over a long cache (decode). A block per (kv head, key split)
// reads each key's K and V once for every query and every head of its group
// (R = queries x group rows, at most MAXR). L = head_dim / VEC lanes share a
// key, each holding VEC values from one 16-byte load, so a warp takes 32 / L
// keys a step; each lane keeps an online softmax per row, merged across the
// warp's keys, then across warps, into o and lse (one split) or `part`.
constexpr int kDecodeMaxHd = 256;

template <DType DT, int MAXR>
__global__ void __launch_bounds__(kThreads)
    attn_decode_kernel(Mat o, Mat q, Mat k, Mat v, AttnShape a, const int32_t* qpos, const int32_t* kpos, float* lse,
                       float* part) {
  constexpr int VEC = DT == DType::F32 ? 4 : 8, kWarps = kThreads / 32;
  constexpr int64_t es = DT == DType::F32 ? 4 : 2;
  __shared__ float qs[MAXR * kDecodeMaxHd];  // scaled; row rr: query rr / G, head kvh * G + rr % G
  __shared__ int qp[MAXR];
  __shared__ float wm[kWarps][MAXR], wl[kWarps][MAXR];
  __shared__ float wacc[kWarps][MAXR * kDecodeMaxHd];
  const int hd = a.head_dim, L = hd / VEC, KPW = 32 / L;
  const int G = a.n_heads / a.n_kv_heads, R = int(a.Tq) * G;
  const int kvh = int(blockIdx.x), splits = int(gridDim.y), split = int(blockIdx.y);
  const int64_t k_begin = a.Tk * split / splits, k_end = a.Tk * (split + 1) / splits;
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, slot = lane / L, dc = lane % L;

  for (int i = tid; i < R * hd; i += kThreads) {
    const int rr = i / hd, d = i % hd;
    qs[rr * hd + d] = at(q, rr / G, int64_t(kvh * G + rr % G) * hd + d) * a.scale;
  }
  for (int i = tid; i < R; i += kThreads) qp[i] = qpos[i / G];
  __syncthreads();

  float m[MAXR], l[MAXR], acc[MAXR][VEC];
  for (int rr = 0; rr < MAXR; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
    for (int e = 0; e < VEC; ++e) acc[rr][e] = 0.0f;
  }
  const int64_t col = int64_t(kvh) * hd + dc * VEC;
  const char* kb = static_cast<const char*>(k.p) + col * es;
  const char* vb = static_cast<const char*>(v.p) + col * es;
  // Each step's K and V pieces are loaded while the step before is computed.
  const int64_t step = int64_t(kWarps) * KPW;
  Bytes16 kraw{0, 0, 0, 0}, vraw{0, 0, 0, 0};
  int kp_next = INT_MAX;
  auto fetch = [&](int64_t j0) {
    const int64_t j = j0 + slot;
    const bool have = j < k_end;
    const int64_t row = have ? j : k_begin;  // a lane past the end reads a real row and uses none of it
    kraw = load16(kb + row * k.ld * es);
    vraw = load16(vb + row * v.ld * es);
    kp_next = have ? kpos[j] : INT_MAX;
  };
  if (k_begin + int64_t(warp) * KPW < k_end) fetch(k_begin + int64_t(warp) * KPW);
  for (int64_t j0 = k_begin + int64_t(warp) * KPW; j0 < k_end; j0 += step) {
    float kf[VEC], vf[VEC];
    unpack16<DT>(kraw, kf);
    unpack16<DT>(vraw, vf);
    const int kp = kp_next;
    if (j0 + step < k_end) fetch(j0 + step);
    for (int rr = 0; rr < MAXR && rr < R; ++rr) {
      float sc = 0.0f;
      for (int e = 0; e < VEC; ++e) sc += qs[rr * hd + dc * VEC + e] * kf[e];
      for (int off = L / 2; off > 0; off /= 2) sc += __shfl_xor_sync(0xffffffffu, sc, off);
      if (kp > qp[rr]) continue;  // the same for the L lanes of this key
      if (sc > m[rr]) {
        const float c = expf(m[rr] - sc);
        l[rr] = l[rr] * c + 1.0f;
        for (int e = 0; e < VEC; ++e) acc[rr][e] = acc[rr][e] * c + vf[e];
        m[rr] = sc;
      } else {
        const float p = expf(sc - m[rr]);
        l[rr] += p;
        for (int e = 0; e < VEC; ++e) acc[rr][e] += p * vf[e];
      }
    }
  }
  // The warp's key slots into one (lanes L apart hold the same values' columns).
  for (int off = L; off < 32; off *= 2)
    for (int rr = 0; rr < MAXR && rr < R; ++rr) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m[rr], off), l2 = __shfl_xor_sync(0xffffffffu, l[rr], off);
      const float mx = fmaxf(m[rr], m2);
      const float c1 = m[rr] == -INFINITY ? 0.0f : expf(m[rr] - mx), c2 = m2 == -INFINITY ? 0.0f : expf(m2 - mx);
      l[rr] = l[rr] * c1 + l2 * c2;
      for (int e = 0; e < VEC; ++e) acc[rr][e] = acc[rr][e] * c1 + __shfl_xor_sync(0xffffffffu, acc[rr][e], off) * c2;
      m[rr] = mx;
    }
  if (slot == 0)
    for (int rr = 0; rr < MAXR && rr < R; ++rr) {
      for (int e = 0; e < VEC; ++e) wacc[warp][rr * hd + dc * VEC + e] = acc[rr][e];
      if (dc == 0) {
        wm[warp][rr] = m[rr];
        wl[warp][rr] = l[rr];
      }
    }
  __syncthreads();
  // The warps into one, a thread per (row, column).
  for (int i = tid; i < R * hd; i += kThreads) {
    const int rr = i / hd, d = i % hd;
    float mx = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, wm[w][rr]);
    float sum = 0.0f, out = 0.0f;
    if (mx != -INFINITY)
      for (int w = 0; w < kWarps; ++w) {
        if (wm[w][rr] == -INFINITY) continue;
        const float c = expf(wm[w][rr] - mx);
        sum += wl[w][rr] * c;
        out += wacc[w][rr * hd + d] * c;
      }
    const int64_t qi = rr / G;
    const int h = kvh * G + rr % G;
    if (!part) {
      put(o, qi, int64_t(h) * hd + d, sum > 0.0f ? out / sum : 0.0f);
      if (lse && d == 0) lse[qi * a.n_heads + h] = sum > 0.0f ? mx + logf(sum) : -INFINITY;
    } else {
      float* pr = part + ((int64_t(split) * a.Tq + qi) * a.n_heads + h) * (hd + 2);
      pr[d] = out;
      if (d == 0) {
        pr[hd] = mx;
        pr[hd + 1] = sum;
      }
    }
  }
}

// ------------------------------------------------------------------ wmma

namespace wmma = nvcuda::wmma;

template <int HD>
struct Wmma {
  static constexpr int BQ = 64, BK = 64;  // four warps of 16 query rows
  static constexpr int LDH = HD + 16;     // 16-bit rows (Q, K, V); keeps every fragment 32-byte aligned
  static constexpr int LDS = BK + 4;      // fp32 scores
  static constexpr int LDP = BK + 16;     // 16-bit probabilities
  // Q is staged where the scores go later (its fragments then live in
  // registers, as O's do): about 66 KB at width 128, so two blocks an SM, as
  // many as the registers allow (__launch_bounds__ below).
  static constexpr size_t qs_bytes = 2 * BQ * LDH > 4 * BQ * LDS ? 2 * BQ * LDH : 4 * BQ * LDS;
  static constexpr size_t q_off = 0, s_off = 0, k_off = qs_bytes, v_off = k_off + 2 * BK * LDH,
                          p_off = v_off + 2 * BK * LDH, stat_off = p_off + 2 * BQ * LDP;
  // per row: reference max, sum, correction, position; per key: position
  static constexpr size_t smem_bytes() { return stat_off + 4 * (4 * BQ + BK); }
};
// The running max a row's probabilities are taken against moves only when a
// tile's max passes it by more than this (natural log: e^8 ~ 3000, within
// every dtype's range), so O, held in registers, is rescaled rarely
// (FlashAttention-4's conditional rescaling); the result is the same.
constexpr float kRescaleMargin = 8.0f;

// A bf16 or fp16 value's bits from any storage dtype (the same dtype here: a copy).
SS_DEV uint16_t bits16(const Mat& m, int64_t r, int64_t c) {
  return static_cast<const uint16_t*>(m.p)[r * m.ld + c];
}
SS_DEV uint16_t round16(float v, DType dt) { return dt == DType::BF16 ? float_to_bf16(v) : float_to_f16(v); }

template <class T, int HD>
__global__ void __launch_bounds__(kThreads, 2)
    attn_wmma_kernel(Mat o, Mat q, Mat k, Mat v, AttnShape a, const int32_t* qpos, const int32_t* kpos, float* lse) {
  using W = Wmma<HD>;
  constexpr int BQ = W::BQ, BK = W::BK, LDH = W::LDH, LDS = W::LDS, LDP = W::LDP;
  SS_DYNAMIC_SMEM(unsigned char, smem);
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem + W::q_off);
  uint16_t* Ks = reinterpret_cast<uint16_t*>(smem + W::k_off);
  uint16_t* Vs = reinterpret_cast<uint16_t*>(smem + W::v_off);
  float* S = reinterpret_cast<float*>(smem + W::s_off);
  uint16_t* P = reinterpret_cast<uint16_t*>(smem + W::p_off);
  float* row_m = reinterpret_cast<float*>(smem + W::stat_off);
  float* row_l = row_m + BQ;
  float* row_corr = row_l + BQ;
  int* qp = reinterpret_cast<int*>(row_corr + BQ);
  int* kp = qp + BQ;
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int h = int(blockIdx.y), kvh = h / (a.n_heads / a.n_kv_heads);
  const int64_t q0 = int64_t(blockIdx.x) * BQ;
  const DType dt = q.dt;

  // Rows in 16-byte pieces where every view allows it (CH a row, PER a
  // thread a tile), else a value at a time.
  constexpr int CH = HD / 8, PER = BK * CH / kThreads;
  static_assert(BQ == BK && BK * CH % kThreads == 0, "tiles of whole pieces");
  const bool vec = aligned16(q) && aligned16(k) && aligned16(v);
  if (vec) {
    for (int c = 0; c < PER; ++c) {
      const int idx = tid + c * kThreads, rr = idx / CH, ch = idx % CH;
      const Bytes16 zero{0, 0, 0, 0};
      store16(Qs + rr * LDH + ch * 8, q0 + rr < a.Tq ? load16(static_cast<const uint16_t*>(q.p) + (q0 + rr) * q.ld +
                                                                int64_t(h) * HD + ch * 8)
                                                     : zero);
    }
  } else {
    for (int i = tid; i < BQ * HD; i += kThreads) {
      const int rr = i / HD, d = i % HD;
      Qs[rr * LDH + d] = q0 + rr < a.Tq ? bits16(q, q0 + rr, int64_t(h) * HD + d) : uint16_t(0);
    }
  }
  for (int i = tid; i < BQ; i += kThreads) {
    qp[i] = q0 + i < a.Tq ? qpos[q0 + i] : INT_MIN;
    row_m[i] = -INFINITY;
    row_l[i] = 0.0f;
  }
  // Every warp finds the same answers itself, so tiles are skipped without a
  // barrier: the block's largest query position, and whether a key tile
  // holds a key at or before it.
  int qmax = INT_MIN;
  for (int i = lane; i < BQ; i += 32)
    if (q0 + i < a.Tq) qmax = imax(qmax, qpos[q0 + i]);
  for (int off = 16; off > 0; off /= 2) qmax = imax(qmax, __shfl_xor_sync(0xffffffffu, qmax, off));
  auto next_visible = [&](int64_t k0) {
    for (; k0 < a.Tk; k0 += BK) {
      int mn = INT_MAX;
      for (int64_t i = k0 + lane; i < min64(k0 + BK, a.Tk); i += 32) mn = imin(mn, kpos[i]);
      for (int off = 16; off > 0; off /= 2) mn = imin(mn, __shfl_xor_sync(0xffffffffu, mn, off));
      if (mn <= qmax) break;
    }
    return k0;
  };
  // The next visible tile's K and V pieces are loaded into registers while
  // the current one is computed, then stored to shared memory.
  Bytes16 kreg[PER], vreg[PER];
  auto fetch = [&](int64_t k0) {
    if (!vec) return;
    const Bytes16 zero{0, 0, 0, 0};
#pragma unroll
    for (int c = 0; c < PER; ++c) {
      const int idx = tid + c * kThreads, kk = idx / CH, ch = idx % CH;
      const bool ok = k0 + kk < a.Tk;
      const int64_t col = int64_t(kvh) * HD + ch * 8;
      kreg[c] = ok ? load16(static_cast<const uint16_t*>(k.p) + (k0 + kk) * k.ld + col) : zero;
      vreg[c] = ok ? load16(static_cast<const uint16_t*>(v.p) + (k0 + kk) * v.ld + col) : zero;
    }
  };
  auto stash = [&](int64_t k0, int nb) {
    if (vec) {
#pragma unroll
      for (int c = 0; c < PER; ++c) {
        const int idx = tid + c * kThreads, kk = idx / CH, ch = idx % CH;
        store16(Ks + kk * LDH + ch * 8, kreg[c]);
        store16(Vs + kk * LDH + ch * 8, vreg[c]);
      }
    } else {
      for (int i = tid; i < BK * HD; i += kThreads) {
        const int kk = i / HD, d = i % HD;
        const bool ok = kk < nb;
        Ks[kk * LDH + d] = ok ? bits16(k, k0 + kk, int64_t(kvh) * HD + d) : uint16_t(0);
        Vs[kk * LDH + d] = ok ? bits16(v, k0 + kk, int64_t(kvh) * HD + d) : uint16_t(0);
      }
    }
    for (int i = tid; i < BK; i += kThreads) kp[i] = i < nb ? kpos[k0 + i] : INT_MAX;
  };

  // This warp's Q rows as fragments and its O rows as accumulators, in
  // registers for the whole key loop; Q's staging area becomes the scores'.
  const int r0 = warp * 16;
  __syncthreads();  // Q is staged
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qf[HD / 16];
  for (int kk = 0; kk < HD / 16; ++kk)
    wmma::load_matrix_sync(qf[kk], reinterpret_cast<const T*>(Qs + r0 * LDH + kk * 16), LDH);
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> of[HD / 16];
  for (int n = 0; n < HD / 16; ++n) wmma::fill_fragment(of[n], 0.0f);
  float* scratch = S + r0 * LDS;  // the warp's score rows, once read: a 16 x 16 block of O at a time

  int64_t k0 = next_visible(0);
  if (k0 < a.Tk) fetch(k0);
  while (k0 < a.Tk) {
    const int nb = int(min64(BK, a.Tk - k0));
    __syncthreads();  // the previous tile is read (and, the first time, every warp's Q fragments)
    stash(k0, nb);
    __syncthreads();
    const int64_t next = next_visible(k0 + BK);
    if (next < a.Tk) fetch(next);

    // S_w = Q_w K^T for this warp's 16 rows: the BK / 16 key blocks' products
    // in flight together.
    {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> sf[BK / 16];
      for (int n = 0; n < BK / 16; ++n) wmma::fill_fragment(sf[n], 0.0f);
      for (int kk = 0; kk < HD / 16; ++kk)
        for (int n = 0; n < BK / 16; ++n) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> kf;
          wmma::load_matrix_sync(kf, reinterpret_cast<const T*>(Ks + n * 16 * LDH + kk * 16), LDH);
          wmma::mma_sync(sf[n], qf[kk], kf, sf[n]);
        }
      for (int n = 0; n < BK / 16; ++n)
        wmma::store_matrix_sync(S + r0 * LDS + n * 16, sf[n], LDS, wmma::mem_row_major);
    }
    __syncwarp();
    // Online softmax, two lanes a row, each over half the tile's keys (BK =
    // 64), walked from a lane-rotated start so the lanes hit distinct banks.
    {
      const int row = r0 + lane / 2, half = lane % 2, qrow = qp[row];
      const float m_ref = row_m[row];
      float sv[32];
      float mx = -INFINITY;
#pragma unroll
      for (int t = 0; t < 32; ++t) {
        const int j = half * 32 + ((t + lane) & 31);
        const bool visible = j < nb && kp[j] <= qrow;
        sv[t] = visible ? S[row * LDS + j] * a.scale : -INFINITY;
        mx = fmaxf(mx, sv[t]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      // A new reference only past the margin (or for a row's first keys).
      const float ref = mx > m_ref + kRescaleMargin || m_ref == -INFINITY ? fmaxf(m_ref, mx) : m_ref;
      float psum = 0.0f;
#pragma unroll
      for (int t = 0; t < 32; ++t) {
        const int j = half * 32 + ((t + lane) & 31);
        const float p = sv[t] == -INFINITY ? 0.0f : expf(sv[t] - ref);
        psum += p;
        P[row * LDP + j] = round16(p, dt);
      }
      psum += __shfl_xor_sync(0xffffffffu, psum, 1);
      __syncwarp();  // both lanes of the row have read row_m before it changes
      if (half == 0) {
        const float corr = ref == m_ref || m_ref == -INFINITY ? 1.0f : expf(m_ref - ref);
        row_corr[row] = corr;
        row_l[row] = row_l[row] * corr + psum;
        row_m[row] = ref;
      }
    }
    __syncwarp();
    // O's rows rescaled where a reference moved: a block at a time through
    // the scratch (the scores are read by now).
    bool moved = false;
    for (int rr = 0; rr < 16; ++rr) moved = moved || row_corr[r0 + rr] != 1.0f;
    if (moved)
      for (int n = 0; n < HD / 16; ++n) {
        wmma::store_matrix_sync(scratch, of[n], LDS, wmma::mem_row_major);
        __syncwarp();
        for (int i = lane; i < 256; i += 32) scratch[(i / 16) * LDS + i % 16] *= row_corr[r0 + i / 16];
        __syncwarp();
        wmma::load_matrix_sync(of[n], scratch, LDS, wmma::mem_row_major);
        __syncwarp();
      }
    // O_w += P_w V: the HD / 16 output blocks' products in flight together,
    // each P fragment loaded once.
    for (int kk = 0; kk < BK / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> pf;
      wmma::load_matrix_sync(pf, reinterpret_cast<const T*>(P + r0 * LDP + kk * 16), LDP);
      for (int n = 0; n < HD / 16; ++n) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> vf;
        wmma::load_matrix_sync(vf, reinterpret_cast<const T*>(Vs + kk * 16 * LDH + n * 16), LDH);
        wmma::mma_sync(of[n], pf, vf, of[n]);
      }
    }
    k0 = next;
  }
  // O / l, a 16 x 16 block at a time through the warp's scratch.
  __syncthreads();  // (with no visible tile, every warp's Q fragments are loaded before the scratch is used)
  for (int n = 0; n < HD / 16; ++n) {
    wmma::store_matrix_sync(scratch, of[n], LDS, wmma::mem_row_major);
    __syncwarp();
    for (int i = lane; i < 256; i += 32) {
      const int rr = r0 + i / 16, d = n * 16 + i % 16;
      const int64_t qi = q0 + rr;
      const float l = row_l[rr];
      if (qi < a.Tq) put(o, qi, int64_t(h) * HD + d, l > 0.0f ? scratch[(i / 16) * LDS + i % 16] / l : 0.0f);
    }
    __syncwarp();
  }
  if (lse)
    for (int i = tid; i < BQ; i += kThreads)
      if (q0 + i < a.Tq) lse[(q0 + i) * a.n_heads + h] = row_l[i] > 0.0f ? row_m[i] + logf(row_l[i]) : -INFINITY;
}

// ------------------------------------------------------------------ merge

__global__ void attn_merge_kernel(Mat o, float* lse, Mat o2, const float* lse2, int n_heads, int head_dim) {
  const int64_t n = o.rows * n_heads * head_dim;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / head_dim;  // token * heads + head
    const int d = int(i % head_dim);
    const int64_t t = row / n_heads, c = (row % n_heads) * head_dim + d;
    const float l1 = lse[row], l2 = lse2[row], mx = fmaxf(l1, l2);
    if (mx == -INFINITY) continue;
    const float w1 = expf(l1 - mx), w2 = expf(l2 - mx), inv = 1.0f / (w1 + w2);
    put(o, t, c, (at(o, t, c) * w1 + at(o2, t, c) * w2) * inv);
  }
}

// lse is updated after every value of its row has been merged.
__global__ void attn_merge_lse_kernel(float* lse, const float* lse2, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float l1 = lse[i], l2 = lse2[i], mx = fmaxf(l1, l2);
    if (mx != -INFINITY) lse[i] = mx + logf(expf(l1 - mx) + expf(l2 - mx));
  }
}

template <int HDMAX>
void launch_tiled(const Mat& o, const Mat& q, const Mat& k, const Mat& v, const AttnShape& a, const int32_t* qpos,
                  const int32_t* kpos, float* lse, float* part, int splits, Stream s) {
  using Tl = Tiled<HDMAX>;
  auto* kernel = &attn_tiled_kernel<HDMAX>;
  SS_SMEM_LIMIT(kernel, Tl::smem_bytes());
  const dim3 grid(unsigned((a.Tq + Tl::BQ - 1) / Tl::BQ), unsigned(a.n_heads), unsigned(splits));
  SS_LAUNCH(kernel, grid, kThreads, Tl::smem_bytes(), s)(o, q, k, v, a, qpos, kpos, lse, part);
  check_launch("attention");
}

template <class T, int HD>
void launch_wmma(const Mat& o, const Mat& q, const Mat& k, const Mat& v, const AttnShape& a, const int32_t* qpos,
                 const int32_t* kpos, float* lse, Stream s) {
  using W = Wmma<HD>;
  auto* kernel = &attn_wmma_kernel<T, HD>;
  SS_SMEM_LIMIT(kernel, W::smem_bytes());
  const dim3 grid(unsigned((a.Tq + W::BQ - 1) / W::BQ), unsigned(a.n_heads));
  SS_LAUNCH(kernel, grid, kThreads, W::smem_bytes(), s)(o, q, k, v, a, qpos, kpos, lse);
  check_launch("attention (wmma)");
}

// The decode kernel takes R = Tq x group rows up to 8, K and V of one dtype
// in 16-byte aligned rows, and head widths that split evenly over a power of
// two of lanes (bf16/fp16: 8 to 256, fp32: 4 to 128).
bool decode_fits(const Mat& k, const Mat& v, const AttnShape& a) {
  if (k.dt != v.dt || k.dt == DType::I32 || !aligned16(k) || !aligned16(v)) return false;
  const int vec = k.dt == DType::F32 ? 4 : 8, L = a.head_dim / vec;
  return a.head_dim % vec == 0 && L >= 1 && L <= 32 && (L & (L - 1)) == 0 &&
         a.Tq * (a.n_heads / a.n_kv_heads) <= 8 && a.Tk > 0;
}

template <DType DT, int MAXR>
void launch_decode(const Mat& o, const Mat& q, const Mat& k, const Mat& v, const AttnShape& a, const int32_t* qpos,
                   const int32_t* kpos, float* lse, Scratch& scratch, Stream s) {
  // About 1024 blocks in all, at least 64 keys a split.
  const int splits = int(max64(1, min64(min64(256, a.Tk / 64), (1024 + a.n_kv_heads - 1) / a.n_kv_heads)));
  float* part = nullptr;
  if (splits > 1)
    part = static_cast<float*>(
        scratch.get(kScratchAttention, int64_t(sizeof(float)) * splits * a.Tq * a.n_heads * (a.head_dim + 2)));
  const dim3 grid(unsigned(a.n_kv_heads), unsigned(splits));
  auto* kernel = &attn_decode_kernel<DT, MAXR>;
  SS_LAUNCH(kernel, grid, kThreads, 0, s)(o, q, k, v, a, qpos, kpos, lse, part);
  check_launch("attention (decode)");
  if (splits > 1) {
    SS_LAUNCH(attn_combine_kernel, blocks_for(a.Tq * a.n_heads * a.head_dim, 256), 256, 0, s)(o, a, splits, part, lse);
    check_launch("attention (combine)");
  }
}

template <int MAXR>
void launch_decode_any(const Mat& o, const Mat& q, const Mat& k, const Mat& v, const AttnShape& a,
                       const int32_t* qpos, const int32_t* kpos, float* lse, Scratch& scratch, Stream s) {
  if (k.dt == DType::BF16) launch_decode<DType::BF16, MAXR>(o, q, k, v, a, qpos, kpos, lse, scratch, s);
  else if (k.dt == DType::F16) launch_decode<DType::F16, MAXR>(o, q, k, v, a, qpos, kpos, lse, scratch, s);
  else launch_decode<DType::F32, MAXR>(o, q, k, v, a, qpos, kpos, lse, scratch, s);
}

}  // namespace

void attention(const Mat& o, const Mat& q, const Mat& k, const Mat& v, const AttnShape& a, const int32_t* q_pos,
               const int32_t* k_pos, float* lse, Scratch& scratch, Stream s) {
  expect(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0 && a.head_dim > 0 && a.head_dim <= 256, "attention",
         "heads must be a multiple of kv heads, head width 1 to 256");
  if (a.Tq == 0) return;
  if (decode_fits(k, v, a)) {
    if (a.Tq * (a.n_heads / a.n_kv_heads) <= 2) launch_decode_any<2>(o, q, k, v, a, q_pos, k_pos, lse, scratch, s);
    else launch_decode_any<8>(o, q, k, v, a, q_pos, k_pos, lse, scratch, s);
    return;
  }
  const bool same16 = (q.dt == DType::BF16 || q.dt == DType::F16) && k.dt == q.dt && v.dt == q.dt;
  if (same16 && a.Tq >= 64 && a.Tk > 0 && (a.head_dim == 64 || a.head_dim == 128)) {
    if (q.dt == DType::BF16) {
      if (a.head_dim == 64) launch_wmma<__nv_bfloat16, 64>(o, q, k, v, a, q_pos, k_pos, lse, s);
      else launch_wmma<__nv_bfloat16, 128>(o, q, k, v, a, q_pos, k_pos, lse, s);
    } else {
      if (a.head_dim == 64) launch_wmma<half, 64>(o, q, k, v, a, q_pos, k_pos, lse, s);
      else launch_wmma<half, 128>(o, q, k, v, a, q_pos, k_pos, lse, s);
    }
    return;
  }
  // Split the keys when the (query tile, head) blocks alone would leave most
  // of a GPU idle: about 256 blocks in all, at least 256 keys a split.
  const int64_t tiles = (a.Tq + 15) / 16 * a.n_heads;
  int splits = 1;
  if (tiles < 128 && a.Tk >= 512) splits = int(min64(min64(64, a.Tk / 256), (256 + tiles - 1) / tiles));
  float* part = nullptr;
  if (splits > 1)
    part = static_cast<float*>(
        scratch.get(kScratchAttention, int64_t(sizeof(float)) * splits * a.Tq * a.n_heads * (a.head_dim + 2)));
  const int hd = a.head_dim;
  if (hd <= 32) launch_tiled<32>(o, q, k, v, a, q_pos, k_pos, lse, part, splits, s);
  else if (hd <= 64) launch_tiled<64>(o, q, k, v, a, q_pos, k_pos, lse, part, splits, s);
  else if (hd <= 128) launch_tiled<128>(o, q, k, v, a, q_pos, k_pos, lse, part, splits, s);
  else launch_tiled<256>(o, q, k, v, a, q_pos, k_pos, lse, part, splits, s);
  if (splits > 1) {
    SS_LAUNCH(attn_combine_kernel, blocks_for(a.Tq * a.n_heads * hd, 256), 256, 0, s)(o, a, splits, part, lse);
    check_launch("attention (combine)");
  }
}

void attention_merge(const Mat& o, float* lse, const Mat& o2, const float* lse2, int n_heads, int head_dim,
                     Stream s) {
  expect(o.cols == int64_t(n_heads) * head_dim && o2.rows == o.rows, "attention_merge", "shape mismatch");
  const int64_t n = o.rows * n_heads * head_dim;
  if (n == 0) return;
  SS_LAUNCH(attn_merge_kernel, blocks_for(n, 256), 256, 0, s)(o, lse, o2, lse2, n_heads, head_dim);
  check_launch("attention_merge");
  SS_LAUNCH(attn_merge_lse_kernel, blocks_for(o.rows * n_heads, 256), 256, 0, s)(lse, lse2, o.rows * n_heads);
  check_launch("attention_merge (lse)");
}

}  // namespace ss::SS_CUDA_NS
