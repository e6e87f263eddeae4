// Causal grouped-query attention by position, blockwise with an online
// softmax (FlashAttention's recurrence, Dao et al. 2022, §3.1): no Tq x Tk
// matrix ever exists. Two kernels:
//  - attn_tiled: fp32 arithmetic on tiles staged in shared memory, for any
//    dtype and head width up to 256; its key range can be split over blocks
//    (flash-decoding) whose partials attn_combine merges by log-sum-exp, so a
//    few queries over a long cache still fill the GPU;
//  - attn_mma: bf16/fp16 Q, K, V on tensor cores (mma.sync m16n8k16, fp32
//    accumulation) for head widths 64 and 128 and 64 queries or more, with
//    S, P and O in registers (FlashAttention-2): the softmax in fp32, P
//    rounded to the dtype for P V, as FlashAttention does.
// Softmax statistics, lse and the merge are fp32 whatever the dtype.
#include "cuda/common.cuh"

#include "cuda/mma.cuh"

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
// keys a step, and each lane has the K and V pieces of the next kDecodeDepth
// steps in flight. Each lane keeps an online softmax per row, merged across
// the warp's keys, then across warps, into o and lse (one split) or the
// split's partial in `part`. With several splits, the last block of a kv head
// to finish (a ticket per kv head, left at zero for the next launch) merges
// the partials: decode attention is one launch.
constexpr int kDecodeMaxHd = 256, kDecodeDepth = 4;

template <DType DT, int MAXR>
__global__ void __launch_bounds__(kThreads)
    attn_decode_kernel(Mat o, Mat q, Mat k, Mat v, AttnShape a, const int32_t* qpos, const int32_t* kpos, float* lse,
                       float* part, int* tickets) {
  pdl_begin();
  constexpr int VEC = DT == DType::F32 ? 4 : 8, kWarps = kThreads / 32, D = kDecodeDepth;
  constexpr int64_t es = DT == DType::F32 ? 4 : 2;
  __shared__ float qs[MAXR * kDecodeMaxHd];  // scaled; row rr: query rr / G, head kvh * G + rr % G
  __shared__ int qp[MAXR];
  __shared__ float wm[kWarps][MAXR], wl[kWarps][MAXR];
  __shared__ float wacc[kWarps][MAXR * kDecodeMaxHd];
  __shared__ int merges;  // this block is the last of its kv head: it merges the splits
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
  // A warp's steps are step = kWarps * KPW keys apart; the pieces of step
  // j0 + u * step wait in slot u of a ring of D (unrolled: registers).
  const int64_t step = int64_t(kWarps) * KPW, first = k_begin + int64_t(warp) * KPW;
  Bytes16 kraw[D], vraw[D];
  int kp_at[D];
  auto fetch = [&](int u, int64_t j0) {
    const int64_t j = j0 + slot;
    kp_at[u] = INT_MAX;
    if (j0 >= k_end) return;  // the same for the whole warp
    const bool have = j < k_end;
    const int64_t row = have ? j : k_begin;  // a lane past the end reads a real row and uses none of it
    kraw[u] = load16(kb + row * k.ld * es);
    vraw[u] = load16(vb + row * v.ld * es);
    if (have) kp_at[u] = kpos[j];
  };
#pragma unroll
  for (int u = 0; u < D; ++u) fetch(u, first + u * step);
  for (int64_t j0 = first; j0 < k_end; j0 += D * step) {
#pragma unroll
    for (int u = 0; u < D; ++u) {
      if (j0 + u * step >= k_end) break;  // warp-uniform
      float kf[VEC], vf[VEC];
      unpack16<DT>(kraw[u], kf);
      unpack16<DT>(vraw[u], vf);
      const int kp = kp_at[u];
      fetch(u, j0 + (u + D) * step);
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
  const int64_t stride = a.Tq * a.n_heads * (hd + 2);  // one split's partials
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
    if (splits == 1) {
      put(o, qi, int64_t(h) * hd + d, sum > 0.0f ? out / sum : 0.0f);
      if (lse && d == 0) lse[qi * a.n_heads + h] = sum > 0.0f ? mx + logf(sum) : -INFINITY;
    } else {
      float* pr = part + split * stride + (qi * a.n_heads + h) * (hd + 2);
      pr[d] = out;
      if (d == 0) {
        pr[hd] = mx;
        pr[hd + 1] = sum;
      }
    }
  }
  if (splits == 1) return;
  // Every thread's partials out before the ticket is taken; the last taker
  // sees every other block's (its fence after the atomic, before the barrier
  // that releases the block's reads).
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    merges = atomicAdd(&tickets[kvh], 1) == splits - 1;
    __threadfence();
  }
  __syncthreads();
  if (!merges) return;
  // The merge, in three passes so no thread waits on a chain of loads:
  // every split's (max, sum) of each row into shared memory (wacc is free
  // now: 2 R splits <= 2 MAXR 256 floats), a warp a row turns them into
  // weights e^(m_s - max) / sum (0 for splits that saw no key) and the
  // row's lse, then each output is one weighted pass over the splits.
  auto row_of = [&](int rr) { return (rr / G) * int64_t(a.n_heads) + kvh * G + rr % G; };  // query * heads + head
  float* sm = &wacc[0][0];
  float* sl = sm + R * splits;
  for (int i = tid; i < R * splits; i += kThreads) {
    const float* pr = part + (i % splits) * stride + row_of(i / splits) * (hd + 2);
    sm[i] = __ldcg(pr + hd);
    sl[i] = __ldcg(pr + hd + 1);
  }
  __syncthreads();
  for (int rr = warp; rr < R; rr += kWarps) {
    float mx = -INFINITY;
    for (int sp = lane; sp < splits; sp += 32)
      if (sl[rr * splits + sp] > 0.0f) mx = fmaxf(mx, sm[rr * splits + sp]);
    for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float sum = 0.0f;
    for (int sp = lane; sp < splits; sp += 32) {
      const float l = sl[rr * splits + sp];
      if (l > 0.0f) sum += expf(sm[rr * splits + sp] - mx) * l;
    }
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    for (int sp = lane; sp < splits; sp += 32) {
      const float l = sl[rr * splits + sp];
      sm[rr * splits + sp] = l > 0.0f && sum > 0.0f ? expf(sm[rr * splits + sp] - mx) / sum : 0.0f;
    }
    if (lse && lane == 0) lse[row_of(rr)] = sum > 0.0f ? mx + logf(sum) : -INFINITY;
  }
  __syncthreads();
  for (int i = tid; i < R * hd; i += kThreads) {
    const int rr = i / hd, d = i % hd;
    const int64_t row = row_of(rr);
    const float* w = sm + rr * splits;
    float out = 0.0f;
#pragma unroll 8
    for (int sp = 0; sp < splits; ++sp) out += w[sp] * __ldcg(part + sp * stride + row * (hd + 2) + d);
    put(o, row / a.n_heads, int64_t(row % a.n_heads) * hd + d, out);
  }
  if (tid == 0) tickets[kvh] = 0;
}

// ------------------------------------------------------------ tensor cores

// FlashAttention-2's forward (Dao 2023, §3.1) on mma.sync: each warp owns 16
// query rows, and its scores S = Q K^T, the probabilities P and its O
// accumulators stay in registers for the whole key loop (mma.cuh gives the
// layouts). Shared memory holds Q once and two K/V tiles: the one
// being computed and the next visible one, copied by cp.async meanwhile.
template <int HD>
struct Mma {
  static constexpr int BQ = 64, BK = 64;  // four warps of 16 query rows; 64 keys a tile
  static constexpr int LD = HD + 8;       // rows padded by 16 bytes: ldmatrix's 8 rows fall in distinct banks
  static constexpr size_t tile_bytes = size_t(BQ) * LD * 2;
  // Q, then K and V of stage 0, then of stage 1: 87 KB at width 128, so two
  // blocks an SM on an H100 or H200 (228 KB), one on an A100 (164 KB)
  static constexpr size_t smem_bytes() { return 5 * tile_bytes; }
};
static_assert(Mma<64>::BQ == Mma<64>::BK, "Q and the K/V tiles are staged by one loop");

constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// A bf16 or fp16 value's bits (the storage dtype is the operands').
SS_DEV uint16_t bits16(const Mat& m, int64_t r, int64_t c) {
  return static_cast<const uint16_t*>(m.p)[r * m.ld + c];
}

template <class T, int HD>
__global__ void __launch_bounds__(kThreads, 2)
    attn_mma_kernel(Mat o, Mat q, Mat k, Mat v, AttnShape a, const int32_t* qpos, const int32_t* kpos, float* lse) {
  using M = Mma<HD>;
  constexpr int BQ = M::BQ, BK = M::BK, LD = M::LD, CH = HD / 8, PER = BK * CH / kThreads;
  static_assert(BK * CH % kThreads == 0 && HD % 32 == 0, "tiles of whole 16-byte pieces");
  SS_DYNAMIC_SMEM(uint16_t, Qs);
  auto kbuf = [&](int st) { return Qs + (BQ + 2 * st * BK) * LD; };
  auto vbuf = [&](int st) { return Qs + (BQ + (2 * st + 1) * BK) * LD; };
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int h = int(blockIdx.y), kvh = h / (a.n_heads / a.n_kv_heads);
  // The last query tiles first: under causal positions they see the most keys.
  const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * BQ;
  const bool vec = aligned16(q) && aligned16(k) && aligned16(v);

  // Rows row0.. row0 + 63 (zeros past `rows`), columns col0.. col0 + HD - 1,
  // into a tile: by cp.async in 16-byte pieces where every view allows it.
  auto stage = [&](uint16_t* dst, const Mat& m, int64_t row0, int64_t rows, int64_t col0) {
    if (vec) {
#pragma unroll
      for (int c = 0; c < PER; ++c) {
        const int idx = tid + c * kThreads, rr = idx / CH, ch = idx % CH;
        const bool ok = row0 + rr < rows;
        const uint16_t* src = static_cast<const uint16_t*>(m.p) + (ok ? (row0 + rr) * m.ld + col0 + ch * 8 : 0);
        cp_async16(dst + rr * LD + ch * 8, src, ok);
      }
    } else {
      for (int i = tid; i < BK * HD; i += kThreads) {
        const int rr = i / HD, d = i % HD;
        dst[rr * LD + d] = row0 + rr < rows ? bits16(m, row0 + rr, col0 + d) : uint16_t(0);
      }
    }
  };

  // This lane's rows (g and g + 8 of the warp's 16); a row past the end sees no key.
  const int64_t qi0 = q0 + warp * 16 + g, qi1 = qi0 + 8;
  const int qp0 = qi0 < a.Tq ? qpos[qi0] : INT_MIN, qp1 = qi1 < a.Tq ? qpos[qi1] : INT_MIN;
  // Every warp finds these itself, so tiles are skipped without a barrier:
  // the block's largest query position (a key tile none of whose keys is at
  // or before it is skipped unloaded), and the warp's smallest (a tile whose
  // keys all are at or before it needs no mask).
  int qmax = INT_MIN;
  for (int i = lane; i < BQ; i += 32)
    if (q0 + i < a.Tq) qmax = imax(qmax, qpos[q0 + i]);
  int wmin = imin(qp0, qp1);
  for (int off = 16; off > 0; off /= 2) {
    qmax = imax(qmax, __shfl_xor_sync(0xffffffffu, qmax, off));
    wmin = imin(wmin, __shfl_xor_sync(0xffffffffu, wmin, off));
  }
  // The first visible tile from k0 on, and its largest key position (past the end: INT_MAX).
  auto next_visible = [&](int64_t k0, int& kmax) {
    for (; k0 < a.Tk; k0 += BK) {
      int mn = INT_MAX, mx = INT_MIN;
      for (int64_t i = k0 + lane; i < k0 + BK; i += 32) {
        const int p = i < a.Tk ? kpos[i] : INT_MAX;
        mn = imin(mn, p);
        mx = imax(mx, p);
      }
      for (int off = 16; off > 0; off /= 2) {
        mn = imin(mn, __shfl_xor_sync(0xffffffffu, mn, off));
        mx = imax(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      }
      kmax = mx;
      if (mn <= qmax) break;
    }
    return k0;
  };

  stage(Qs, q, q0, a.Tq, int64_t(h) * HD);
  int kmax = INT_MAX;
  int64_t k0 = next_visible(0, kmax);
  if (k0 < a.Tk) {
    stage(kbuf(0), k, k0, a.Tk, int64_t(kvh) * HD);
    stage(vbuf(0), v, k0, a.Tk, int64_t(kvh) * HD);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  // This lane's row address for ldmatrix of the warp's Q fragments: read
  // from shared memory per key tile, as FlashAttention-2 does, since keeping
  // them in registers (32 at width 128) spills.
  const uint16_t* qrow = Qs + (warp * 16 + lane % 8 + (lane / 8) % 2 * 8) * LD + lane / 16 * 8;
  float of[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) of[n][0] = of[n][1] = of[n][2] = of[n][3] = 0.0f;
  // Running maxima in log2 units (the scores carry scale x log2 e, for
  // exp2), and this lane's part of each row's sum.
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  const float scale2 = a.scale * kLog2e;
  int st = 0;
  while (k0 < a.Tk) {
    int next_kmax = INT_MAX;
    const int64_t next = next_visible(k0 + BK, next_kmax);
    if (next < a.Tk) {
      stage(kbuf(st ^ 1), k, next, a.Tk, int64_t(kvh) * HD);
      stage(vbuf(st ^ 1), v, next, a.Tk, int64_t(kvh) * HD);
    }
    cp_async_commit();
    const uint16_t* Kt = kbuf(st);
    const uint16_t* Vt = vbuf(st);

    // S = Q K^T, 32 columns of Q and K at a time (two k-steps): Q's two A
    // fragments, then per 8-key tile an ldmatrix x4 of K giving both B's.
    float s[BK / 8][4];
#pragma unroll
    for (int n = 0; n < BK / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD / 32; ++kk) {
      uint32_t qa[4], qb[4];
      ldmatrix_x4(qa, qrow + kk * 32, false);
      ldmatrix_x4(qb, qrow + kk * 32 + 16, false);
#pragma unroll
      for (int n = 0; n < BK / 8; ++n) {
        uint32_t b[4];
        ldmatrix_x4(b, Kt + (n * 8 + lane % 8) * LD + kk * 32 + lane / 8 * 8, false);
        mma_16816<T>(s[n], qa, b[0], b[1]);
        mma_16816<T>(s[n], qb, b[2], b[3]);
      }
    }

    // The online softmax: a row's max over the four lanes holding it.
    const bool mask = kmax > wmin;
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int n = 0; n < BK / 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v0 = s[n][e] * scale2, v1 = s[n][2 + e] * scale2;
        if (mask) {
          const int64_t j = k0 + n * 8 + 2 * t + e;
          const int kp = j < a.Tk ? kpos[j] : INT_MAX;
          if (kp > qp0) v0 = -INFINITY;
          if (kp > qp1) v1 = -INFINITY;
        }
        s[n][e] = v0;
        s[n][2 + e] = v1;
        mx0 = fmaxf(mx0, v0);
        mx1 = fmaxf(mx1, v1);
      }
    for (int off = 1; off < 4; off *= 2) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
    }
    // Rows that have seen no key yet keep a zero base (their scores are all -inf).
    const float c0 = mx0 == -INFINITY ? 1.0f : exp2f(m0 - mx0), c1 = mx1 == -INFINITY ? 1.0f : exp2f(m1 - mx1);
    const float b0 = mx0 == -INFINITY ? 0.0f : mx0, b1 = mx1 == -INFINITY ? 0.0f : mx1;
    m0 = mx0;
    m1 = mx1;
    l0 *= c0;
    l1 *= c1;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      of[n][0] *= c0;
      of[n][1] *= c0;
      of[n][2] *= c1;
      of[n][3] *= c1;
    }
    // P, rounded to the dtype for P V (the sums keep fp32), as the A
    // fragments of the 16-key steps: tiles 2j and 2j + 1 make step j.
    uint32_t pf[BK / 16][4];
#pragma unroll
    for (int n = 0; n < BK / 8; ++n) {
      const float p00 = exp2f(s[n][0] - b0), p01 = exp2f(s[n][1] - b0);
      const float p10 = exp2f(s[n][2] - b1), p11 = exp2f(s[n][3] - b1);
      l0 += p00 + p01;
      l1 += p10 + p11;
      pf[n / 2][2 * (n % 2)] = pack_pair<T>(p00, p01);
      pf[n / 2][2 * (n % 2) + 1] = pack_pair<T>(p10, p11);
    }
    // O += P V: V's rows transposed by ldmatrix into the B fragments of two
    // 8-column tiles of O at once.
#pragma unroll
    for (int j = 0; j < BK / 16; ++j)
#pragma unroll
      for (int n = 0; n < HD / 16; ++n) {
        uint32_t b[4];
        ldmatrix_x4(b, Vt + (j * 16 + lane % 8 + (lane / 8) % 2 * 8) * LD + n * 16 + lane / 16 * 8, true);
        mma_16816<T>(of[2 * n], pf[j], b[0], b[1]);
        mma_16816<T>(of[2 * n + 1], pf[j], b[2], b[3]);
      }

    cp_async_wait<0>();
    __syncthreads();  // the next tile has landed, and no warp reads this one any more
    st ^= 1;
    k0 = next;
    kmax = next_kmax;
  }

  for (int off = 1; off < 4; off *= 2) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) {
    const int64_t col = int64_t(h) * HD + n * 8 + 2 * t;
    if (qi0 < a.Tq) {
      put(o, qi0, col, of[n][0] * inv0);
      put(o, qi0, col + 1, of[n][1] * inv0);
    }
    if (qi1 < a.Tq) {
      put(o, qi1, col, of[n][2] * inv1);
      put(o, qi1, col + 1, of[n][3] * inv1);
    }
  }
  if (lse && t == 0) {
    if (qi0 < a.Tq) lse[qi0 * a.n_heads + h] = l0 > 0.0f ? m0 * kLn2 + logf(l0) : -INFINITY;
    if (qi1 < a.Tq) lse[qi1 * a.n_heads + h] = l1 > 0.0f ? m1 * kLn2 + logf(l1) : -INFINITY;
  }
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
  allow_smem("attention", kernel, Tl::smem_bytes());
  const dim3 grid(unsigned((a.Tq + Tl::BQ - 1) / Tl::BQ), unsigned(a.n_heads), unsigned(splits));
  SS_LAUNCH(kernel, grid, kThreads, Tl::smem_bytes(), s)(o, q, k, v, a, qpos, kpos, lse, part);
  check_launch("attention");
}

template <class T, int HD>
void launch_mma(const Mat& o, const Mat& q, const Mat& k, const Mat& v, const AttnShape& a, const int32_t* qpos,
                const int32_t* kpos, float* lse, Stream s) {
  using M = Mma<HD>;
  auto* kernel = &attn_mma_kernel<T, HD>;
  allow_smem("attention (tensor cores)", kernel, M::smem_bytes());
  const dim3 grid(unsigned((a.Tq + M::BQ - 1) / M::BQ), unsigned(a.n_heads));
  SS_LAUNCH(kernel, grid, kThreads, M::smem_bytes(), s)(o, q, k, v, a, qpos, kpos, lse);
  check_launch("attention (tensor cores)");
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
  auto* kernel = &attn_decode_kernel<DT, MAXR>;
  // One wave of blocks (occupancy times SMs: a second, partial wave would
  // double the time), at least 64 keys a split.
  static const int resident = resident_blocks(kernel, kThreads, 0);
  const int splits = int(max64(1, min64(min64(256, a.Tk / 64), max64(1, resident / a.n_kv_heads))));
  float* part = nullptr;
  int* tickets = nullptr;
  if (splits > 1) {
    part = static_cast<float*>(
        scratch.get(kScratchAttention, int64_t(sizeof(float)) * splits * a.Tq * a.n_heads * (a.head_dim + 2)));
    tickets = scratch.counters(a.n_kv_heads);
  }
  const dim3 grid(unsigned(a.n_kv_heads), unsigned(splits));
  launch_dependent("attention (decode)", kernel, grid, kThreads, 0, s, o, q, k, v, a, qpos, kpos, lse, part, tickets);
  check_launch("attention (decode)");
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
    const int64_t rows = a.Tq * (a.n_heads / a.n_kv_heads);
    if (rows == 1) launch_decode_any<1>(o, q, k, v, a, q_pos, k_pos, lse, scratch, s);
    else if (rows == 2) launch_decode_any<2>(o, q, k, v, a, q_pos, k_pos, lse, scratch, s);
    else if (rows <= 4) launch_decode_any<4>(o, q, k, v, a, q_pos, k_pos, lse, scratch, s);
    else launch_decode_any<8>(o, q, k, v, a, q_pos, k_pos, lse, scratch, s);
    return;
  }
  const bool same16 = (q.dt == DType::BF16 || q.dt == DType::F16) && k.dt == q.dt && v.dt == q.dt;
  if (same16 && a.Tq >= 64 && a.Tk > 0 && (a.head_dim == 64 || a.head_dim == 128)) {
    if (q.dt == DType::BF16) {
      if (a.head_dim == 64) launch_mma<__nv_bfloat16, 64>(o, q, k, v, a, q_pos, k_pos, lse, s);
      else launch_mma<__nv_bfloat16, 128>(o, q, k, v, a, q_pos, k_pos, lse, s);
    } else {
      if (a.head_dim == 64) launch_mma<half, 64>(o, q, k, v, a, q_pos, k_pos, lse, s);
      else launch_mma<half, 128>(o, q, k, v, a, q_pos, k_pos, lse, s);
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
