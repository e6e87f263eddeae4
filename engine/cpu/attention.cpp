#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/kernels.h"

namespace ss::cpu {
namespace {
constexpr int kQueryBlock = 128;
constexpr int kKeyBlock = 512;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Rows [r0, r0 + n) and columns [c0, c0 + w) of a 2-D tensor as fp32: a
// pointer into the tensor when f32 (leading dimension its ld), else the tile
// widened into `buf` (leading dimension w).
const float* tile_f32(const Tensor& t, int64_t r0, int64_t n, int64_t c0, int64_t w,
                      std::vector<float>& buf, int64_t& ld) {
  if (t.dtype() == DType::F32) {
    ld = t.ld();
    return t.data<float>() + r0 * t.ld() + c0;
  }
  buf.resize(size_t(n * w));
  const int64_t es = dtype_size(t.dtype());
  for (int64_t r = 0; r < n; ++r)
    widen(static_cast<const char*>(t.row_ptr(r0 + r)) + c0 * es, t.dtype(), w, buf.data() + r * w);
  ld = w;
  return buf.data();
}
// Decode's inner loops for a head width that is a multiple of 8 (AVX2): the
// scores of one query head over a block of keys, four keys a reduction; and
// the output's update acc = corr acc + sum_j p_j v_j with acc in registers.
inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
inline __m256 load8(const uint16_t* p) {  // bf16, widened in registers
  return _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}

// Keys per block of the decode path; the kernels' score rows are this long.
constexpr int kDecodeBlock = 32;

// <q, k> over HD values, k in fp32 or bf16: the tails of block_scores.
template <int HD, class E>
float dot_row(const float* q, const E* k) {
  __m256 acc = _mm256_setzero_ps();
  for (int d = 0; d < HD / 8; ++d) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * d), load8(k + 8 * d), acc);
  return hsum8(acc);
}

// sc[h * kDecodeBlock + k] = scale * (the sum of a[h][k]'s lanes), for
// four heads h and two keys k. Per 128-bit lane, hadd(hadd(x0, x1),
// hadd(x2, x3)) holds the lane sums of x0..x3: lanes [h0k0, h0k1, h1k0,
// h1k1] and [h2k0, h2k1, h3k0, h3k1].
inline void store_pair_scores(const __m256 (&a)[4][2], float scale, float* sc) {
  const __m256 h01 = _mm256_hadd_ps(_mm256_hadd_ps(a[0][0], a[0][1]), _mm256_hadd_ps(a[1][0], a[1][1]));
  const __m256 h23 = _mm256_hadd_ps(_mm256_hadd_ps(a[2][0], a[2][1]), _mm256_hadd_ps(a[3][0], a[3][1]));
  alignas(16) float s01[4], s23[4];
  _mm_store_ps(s01, _mm_add_ps(_mm256_castps256_ps128(h01), _mm256_extractf128_ps(h01, 1)));
  _mm_store_ps(s23, _mm_add_ps(_mm256_castps256_ps128(h23), _mm256_extractf128_ps(h23, 1)));
  const float* sums[4] = {s01, s01 + 2, s23, s23 + 2};
  for (int h = 0; h < 4; ++h) {
    sc[h * kDecodeBlock] = sums[h][0] * scale;
    sc[h * kDecodeBlock + 1] = sums[h][1] * scale;
  }
}

// The scores of G query heads that share a K head (GQA's group) over a
// block of keys: each K row is loaded (and widened) once for the whole
// group, two keys at a time against every head's query.
// sc[g * kBlock + j] = scale * <q_g, k_j>.
template <int HD, class E>
void block_scores(const float* q, int G, const void* const* rows, int64_t off, int nb, float scale,
                  float* sc) {
  auto krow = [rows, off](int j) { return static_cast<const E*>(rows[j]) + off; };
  int g = 0;
  for (; g + 4 <= G; g += 4) {
    const float* q0 = q + g * HD;
    int j = 0;
    for (; j + 2 <= nb; j += 2) {
      __m256 a[4][2];
      for (auto& r : a) r[0] = r[1] = _mm256_setzero_ps();
      for (int d = 0; d < HD / 8; ++d) {
        const __m256 k0 = load8(krow(j) + 8 * d), k1 = load8(krow(j + 1) + 8 * d);
        for (int h = 0; h < 4; ++h) {
          const __m256 qv = _mm256_loadu_ps(q0 + h * HD + 8 * d);
          a[h][0] = _mm256_fmadd_ps(qv, k0, a[h][0]);
          a[h][1] = _mm256_fmadd_ps(qv, k1, a[h][1]);
        }
      }
      store_pair_scores(a, scale, sc + g * kDecodeBlock + j);
    }
    for (; j < nb; ++j)  // an odd last key
      for (int h = 0; h < 4; ++h) sc[(g + h) * kDecodeBlock + j] = dot_row<HD>(q0 + h * HD, krow(j)) * scale;
  }
  for (; g < G; ++g)  // a group that is not a multiple of 4: one head at a time
    for (int j = 0; j < nb; ++j) sc[g * kDecodeBlock + j] = dot_row<HD>(q + g * HD, krow(j)) * scale;
}
// acc_g = corr_g acc_g + sum_j p_gj v_j for the G heads of a group: 16
// columns of every head's output in registers at a time, each V row loaded
// (and widened) once for the group.
template <int HD, class E>
void block_accumulate(float* acc, int G, const float* corr, const float* p, const void* const* rows,
                      int64_t off, int nb) {
  constexpr int kHeads = 4;
  for (int g0 = 0; g0 < G; g0 += kHeads) {
    const int gn = std::min(kHeads, G - g0);
    for (int d = 0; d < HD / 8; d += 2) {
      __m256 av[kHeads][2];
      for (int h = 0; h < gn; ++h) {
        const __m256 c = _mm256_set1_ps(corr[g0 + h]);
        av[h][0] = _mm256_mul_ps(_mm256_loadu_ps(acc + (g0 + h) * HD + 8 * d), c);
        av[h][1] = _mm256_mul_ps(_mm256_loadu_ps(acc + (g0 + h) * HD + 8 * d + 8), c);
      }
      for (int j = 0; j < nb; ++j) {
        const E* vr = static_cast<const E*>(rows[j]) + off + 8 * d;
        const __m256 v0 = load8(vr), v1 = load8(vr + 8);
        for (int h = 0; h < gn; ++h) {
          const __m256 pj = _mm256_set1_ps(p[(g0 + h) * kDecodeBlock + j]);
          av[h][0] = _mm256_fmadd_ps(pj, v0, av[h][0]);
          av[h][1] = _mm256_fmadd_ps(pj, v1, av[h][1]);
        }
      }
      for (int h = 0; h < gn; ++h) {
        _mm256_storeu_ps(acc + (g0 + h) * HD + 8 * d, av[h][0]);
        _mm256_storeu_ps(acc + (g0 + h) * HD + 8 * d + 8, av[h][1]);
      }
    }
  }
}

// The same two kernels on 16 lanes, for CPUs with AVX-512 (chosen at run
// time; the engine is built for AVX2): half the FMAs, loads and widenings a
// key. Each (head, key) accumulator is folded to 8 lanes and summed as above.
#define SS_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))
// GCC 12 takes the intrinsics' own placeholder operands (_mm512_undefined_*)
// for uninitialised variables.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
SS_AVX512 inline __m512 load16(const float* p) {
  return _mm512_loadu_ps(p);
}
SS_AVX512 inline __m512 load16(const uint16_t* p) {  // bf16, widened in registers
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
SS_AVX512 inline __m256 fold(__m512 v) {
  return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
}

template <int HD, class E>
SS_AVX512 void block_scores16(const float* q, int G, const void* const* rows, int64_t off, int nb, float scale,
                              float* sc) {
  static_assert(HD % 16 == 0);
  auto krow = [rows, off](int j) { return static_cast<const E*>(rows[j]) + off; };
  int g = 0;
  for (; g + 4 <= G; g += 4) {
    const float* q0 = q + g * HD;
    int j = 0;
    for (; j + 2 <= nb; j += 2) {
      __m512 a[4][2];
      for (auto& r : a) r[0] = r[1] = _mm512_setzero_ps();
      for (int d = 0; d < HD / 16; ++d) {
        const __m512 k0 = load16(krow(j) + 16 * d), k1 = load16(krow(j + 1) + 16 * d);
        for (int h = 0; h < 4; ++h) {
          const __m512 qv = _mm512_loadu_ps(q0 + h * HD + 16 * d);
          a[h][0] = _mm512_fmadd_ps(qv, k0, a[h][0]);
          a[h][1] = _mm512_fmadd_ps(qv, k1, a[h][1]);
        }
      }
      __m256 a8[4][2];
      for (int h = 0; h < 4; ++h) a8[h][0] = fold(a[h][0]), a8[h][1] = fold(a[h][1]);
      store_pair_scores(a8, scale, sc + g * kDecodeBlock + j);
    }
    for (; j < nb; ++j)
      for (int h = 0; h < 4; ++h) sc[(g + h) * kDecodeBlock + j] = dot_row<HD>(q0 + h * HD, krow(j)) * scale;
  }
  for (; g < G; ++g)
    for (int j = 0; j < nb; ++j) sc[g * kDecodeBlock + j] = dot_row<HD>(q + g * HD, krow(j)) * scale;
}

template <int HD, class E>
SS_AVX512 void block_accumulate16(float* acc, int G, const float* corr, const float* p, const void* const* rows,
                                  int64_t off, int nb) {
  static_assert(HD % 32 == 0);
  constexpr int kHeads = 4;
  for (int g0 = 0; g0 < G; g0 += kHeads) {
    const int gn = std::min(kHeads, G - g0);
    for (int d = 0; d < HD / 16; d += 2) {
      __m512 av[kHeads][2];
      for (int h = 0; h < gn; ++h) {
        const __m512 c = _mm512_set1_ps(corr[g0 + h]);
        av[h][0] = _mm512_mul_ps(_mm512_loadu_ps(acc + (g0 + h) * HD + 16 * d), c);
        av[h][1] = _mm512_mul_ps(_mm512_loadu_ps(acc + (g0 + h) * HD + 16 * d + 16), c);
      }
      for (int j = 0; j < nb; ++j) {
        const E* vr = static_cast<const E*>(rows[j]) + off + 16 * d;
        const __m512 v0 = load16(vr), v1 = load16(vr + 16);
        for (int h = 0; h < gn; ++h) {
          const __m512 pj = _mm512_set1_ps(p[(g0 + h) * kDecodeBlock + j]);
          av[h][0] = _mm512_fmadd_ps(pj, v0, av[h][0]);
          av[h][1] = _mm512_fmadd_ps(pj, v1, av[h][1]);
        }
      }
      for (int h = 0; h < gn; ++h) {
        _mm512_storeu_ps(acc + (g0 + h) * HD + 16 * d, av[h][0]);
        _mm512_storeu_ps(acc + (g0 + h) * HD + 16 * d + 16, av[h][1]);
      }
    }
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// The largest of a block's kDecodeBlock scores.
inline float block_max(const float* s) {
  __m256 m = _mm256_loadu_ps(s);
  for (int j = 8; j < kDecodeBlock; j += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(s + j));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
}
// s_j <- exp(s_j - mx) over a block (0 where s_j is -inf: a hidden key or
// the tail of a short block), and their sum.
inline float block_exp(float* s, float mx) {
  const __m256 vmx = _mm256_set1_ps(mx), ninf = _mm256_set1_ps(kNegInf);
  __m256 sum = _mm256_setzero_ps();
  for (int j = 0; j < kDecodeBlock; j += 8) {
    const __m256 x = _mm256_loadu_ps(s + j);
    const __m256 e = _mm256_andnot_ps(_mm256_cmp_ps(x, ninf, _CMP_EQ_OQ), exp8(_mm256_sub_ps(x, vmx)));
    _mm256_storeu_ps(s + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  return hsum8(sum);
}

// The register kernels for a head width and the K/V rows' storage (fp32, or
// bf16 read in place), chosen once per call; empty for other widths, which
// take the generic loops over fp32 rows.
struct DecodeKernels {
  void (*scores)(const float*, int, const void* const*, int64_t, int, float, float*) = nullptr;
  void (*accumulate)(float*, int, const float*, const float*, const void* const*, int64_t, int) = nullptr;
};
template <int HD, class E>
DecodeKernels kernels_for() {
  if (cpu_has_avx512()) return {&block_scores16<HD, E>, &block_accumulate16<HD, E>};
  return {&block_scores<HD, E>, &block_accumulate<HD, E>};
}
DecodeKernels decode_kernels(int hd, bool bf16_rows) {
  if (hd == 64) return bf16_rows ? kernels_for<64, uint16_t>() : kernels_for<64, float>();
  if (hd == 128) return bf16_rows ? kernels_for<128, uint16_t>() : kernels_for<128, float>();
  return {};
}

}  // namespace

// A few queries (decode) over many keys, split over the keys as
// flash-decoding does: each thread takes a range of keys, reads every K and V
// row of it once (widened once for all heads), keeps per (query, head) a
// running max, sum and output, and the partials are merged by log-sum-exp.
static void attention_few_queries(const Tensor& o, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const AttentionArgs& a, const Tensor& lse) {
  const int64_t Tq = q.rows(), Tk = k.rows();
  const int nh = a.n_heads, hd = a.head_dim, group = a.n_heads / a.n_kv_heads;
  const int64_t pairs = Tq * nh;
  std::vector<float> qf(size_t(pairs * hd));
  for (int64_t i = 0; i < Tq; ++i)
    widen(q.row_ptr(i), q.dtype(), int64_t(nh) * hd, qf.data() + i * nh * hd);
  const int parts = int(std::max<int64_t>(1, std::min<int64_t>(threads(), Tk / 64)));
  // Per part and (query, head): max, sum, and the unnormalised output.
  std::vector<float> pm(size_t(parts * pairs), kNegInf), pl(size_t(parts * pairs), 0.0f),
      pacc(size_t(parts * pairs * hd), 0.0f);
#pragma omp parallel for schedule(static) if (parts > 1)
  for (int part = 0; part < parts; ++part) {
    const int64_t j0 = Tk * part / parts, j1 = Tk * (part + 1) / parts;
    float* m = pm.data() + part * pairs;
    float* l = pl.data() + part * pairs;
    float* acc = pacc.data() + part * pairs * hd;
    const int64_t hkv = k.cols();
    // A block of keys at a time: its K and V rows read once for every head
    // (widened once when not fp32), the scores of each (query, head) over the
    // block, one softmax correction per block, the exponentials vectorised.
    constexpr int kBlock = kDecodeBlock;
    const bool f32 = k.dtype() == DType::F32 && v.dtype() == DType::F32;
    // bf16 K and V at the head widths with a register kernel are read in
    // place; other dtypes and widths are widened a block at a time.
    const bool bf16_rows = k.dtype() == DType::BF16 && v.dtype() == DType::BF16;
    const DecodeKernels kern = decode_kernels(hd, bf16_rows);
    const bool raw16 = bf16_rows && kern.scores;  // read in place
    std::vector<float> kb(f32 || raw16 ? 0 : static_cast<size_t>(kBlock * hkv)), vb(kb.size());
    const void* krow[kBlock];
    const void* vrow[kBlock];
    std::vector<float> sc(static_cast<size_t>(group * kBlock)), corr(static_cast<size_t>(group));  // per head of a group
    std::vector<char> visible(size_t(Tq), 0);
    for (int64_t b0 = j0; b0 < j1; b0 += kBlock) {
      const int nb = int(std::min<int64_t>(kBlock, j1 - b0));
      for (int jj = 0; jj < nb; ++jj) {
        if (f32 || raw16) {
          krow[jj] = k.row_ptr(b0 + jj);
          vrow[jj] = v.row_ptr(b0 + jj);
          continue;
        }
        widen(k.row_ptr(b0 + jj), k.dtype(), hkv, kb.data() + jj * hkv);
        widen(v.row_ptr(b0 + jj), v.dtype(), hkv, vb.data() + jj * hkv);
        krow[jj] = kb.data() + jj * hkv;
        vrow[jj] = vb.data() + jj * hkv;
      }
      // The next block's K and V rows are fetched while this one is computed
      // (with the first block, that one too): in decode they come from
      // memory, the weights streamed since then having evicted them.
      const int64_t row_bytes = hkv * dtype_size(k.dtype());
      for (int64_t j = b0 == j0 ? b0 : b0 + nb; j < std::min(j1, b0 + nb + kBlock); ++j)
        for (int64_t c = 0; c < row_bytes; c += 64) {
          _mm_prefetch(static_cast<const char*>(k.row_ptr(j)) + c, _MM_HINT_T0);
          _mm_prefetch(static_cast<const char*>(v.row_ptr(j)) + c, _MM_HINT_T0);
        }
      // Whether every key of the block is visible to query i (decode's usual
      // case: the whole cache lies in its past), so no key needs its mask.
      for (int64_t i = 0; i < Tq; ++i) {
        visible[size_t(i)] = true;
        for (int jj = 0; jj < nb; ++jj) visible[size_t(i)] = visible[size_t(i)] && a.k_pos[b0 + jj] <= a.q_pos[i];
      }
      // One K/V head at a time with its group of query heads: the kernels
      // read each K and V row once for the whole group.
      for (int64_t i = 0; i < Tq; ++i)
        for (int g = 0; g < nh / group; ++g) {
          const int64_t ih0 = i * nh + int64_t(g) * group, off = int64_t(g) * hd;
          if (kern.scores) kern.scores(qf.data() + ih0 * hd, group, krow, off, nb, a.scale, sc.data());
          for (int h = 0; h < group; ++h) {
            const int64_t ih = ih0 + h;
            const float* qh = qf.data() + ih * hd;
            float* sh = sc.data() + h * kDecodeBlock;
            if (!kern.scores)
              for (int jj = 0; jj < nb; ++jj) {
                const float* kh = static_cast<const float*>(krow[jj]) + off;
                float dot = 0;
#pragma omp simd reduction(+ : dot)
                for (int d = 0; d < hd; ++d) dot += qh[d] * kh[d];
                sh[jj] = dot * a.scale;
              }
            // Keys this query may not see (and a short block's tail) score -inf.
            if (!visible[size_t(i)])
              for (int jj = 0; jj < nb; ++jj)
                if (a.k_pos[b0 + jj] > a.q_pos[i]) sh[jj] = kNegInf;
            std::fill(sh + nb, sh + kDecodeBlock, kNegInf);
            const float mx = std::max(m[ih], block_max(sh));
            if (mx == kNegInf) {  // nothing visible yet: the output stays as it is
              corr[size_t(h)] = 1.0f;
              std::fill_n(sh, kDecodeBlock, 0.0f);
              continue;
            }
            const float c = fast_exp(m[ih] - mx);
            m[ih] = mx;
            l[ih] = l[ih] * c + block_exp(sh, mx);
            corr[size_t(h)] = c;
            if (kern.accumulate) continue;
            float* ar = acc + ih * hd;
            for (int d = 0; d < hd; ++d) ar[d] *= c;
            for (int jj = 0; jj < nb; ++jj) {
              const float p = sh[jj];
              const float* vh = static_cast<const float*>(vrow[jj]) + off;
#pragma omp simd
              for (int d = 0; d < hd; ++d) ar[d] += p * vh[d];
            }
          }
          if (kern.accumulate) kern.accumulate(acc + ih0 * hd, group, corr.data(), sc.data(), vrow, off, nb);
        }
    }
  }
  std::vector<float> out(size_t(int64_t(nh) * hd));
  for (int64_t i = 0; i < Tq; ++i) {
    for (int h = 0; h < nh; ++h) {
      const int64_t ih = i * nh + h;
      float mx = kNegInf;
      for (int part = 0; part < parts; ++part) mx = std::max(mx, pm[size_t(part * pairs + ih)]);
      float* orow = out.data() + int64_t(h) * hd;
      std::fill_n(orow, hd, 0.0f);
      float sum = 0;
      if (mx != kNegInf)
        for (int part = 0; part < parts; ++part) {
          const float w = pl[size_t(part * pairs + ih)] > 0
                              ? std::exp(pm[size_t(part * pairs + ih)] - mx)
                              : 0.0f;
          sum += w * pl[size_t(part * pairs + ih)];
          const float* ar = pacc.data() + (part * pairs + ih) * hd;
          for (int d = 0; d < hd; ++d) orow[d] += w * ar[d];
        }
      const float inv = sum > 0 ? 1.0f / sum : 0.0f;
      for (int d = 0; d < hd; ++d) orow[d] *= inv;
      if (lse.defined()) lse.data<float>()[ih] = sum > 0 ? mx + std::log(sum) : kNegInf;
    }
    narrow(out.data(), int64_t(nh) * hd, o.dtype(), o.row_ptr(i));
  }
}

// Causal attention with an online softmax over key blocks (the FlashAttention
// recurrence, Dao et al. 2022, §3.1): per query block only a
// kQueryBlock × kKeyBlock score tile exists at a time. Key blocks no query of
// the block can see are skipped, and a block's tile ends at its last key some
// query of the block can see. Keys need not come in position order: gathered
// from sequence ranks they come rank by rank, each rank's chunks in order
// (zigzag on 2 ranks: positions 0-127, 384-511, then 128-383). So a key block
// is split into runs of ascending positions, and each run's tile ends at its
// own last visible key; with keys in order a run is the whole block. Trimmed
// only at the block's end, a zigzag rank 1 computed 40% more scores than
// rank 0 and its attention took up to twice as long, where the split exists
// to even them out. The tile GEMMs run on oneDNN's bf16 kernel
// when Q, K and V are bf16, else on OpenBLAS over fp32 tiles (fp16 tiles
// widened). The softmax and its statistics are fp32 whatever the dtype; a
// few queries (decode) take the key-split path above.
void attention(const Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v,
               const AttentionArgs& a, const Tensor& lse) {
  const int64_t Tq = q.rows(), Tk = k.rows();
  if (Tq <= 4) {
    attention_few_queries(o, q, k, v, a, lse);
    return;
  }
  const int hd = a.head_dim, group = a.n_heads / a.n_kv_heads;
  // Runs of keys in ascending position, none across a key block's end:
  // [first key, end), its first key's position the smallest of the run.
  struct KeyRun {
    int64_t j0, end;
  };
  std::vector<KeyRun> runs;
  for (int64_t j = 0; j < Tk; ++j)
    if (j % kKeyBlock == 0 || a.k_pos[j] < a.k_pos[j - 1]) runs.push_back({j, j + 1});
    else runs.back().end = j + 1;

  // (head, query block) tiles run in parallel, each with single-threaded
  // GEMMs: many small GEMMs use the cores better side by side than one after
  // another with OpenBLAS splitting each.
  const int64_t n_qb = (Tq + kQueryBlock - 1) / kQueryBlock;
  const int64_t tiles = int64_t(a.n_heads) * n_qb;
  const int blas_threads = threads();
  const bool parallel = tiles > 1 && blas_threads > 1 && Tq * Tk >= (1 << 16);
  if (parallel) openblas_set_num_threads(1);
#pragma omp parallel if (parallel)
  {
    std::vector<float> S(size_t(kQueryBlock) * kKeyBlock), acc(size_t(kQueryBlock) * hd);
    std::vector<float> m(kQueryBlock), l(kQueryBlock), qbuf, kbuf, vbuf,
        obuf(static_cast<size_t>(hd));
    // bf16 Q, K and V: both tile GEMMs on the bf16 kernel, the probabilities
    // rounded to bf16 for the second as FlashAttention does (P·V in bf16,
    // accumulated in fp32).
    const bool bf16 =
        q.dtype() == DType::BF16 && k.dtype() == DType::BF16 && v.dtype() == DType::BF16 && bf16_gemm_available();
    std::vector<uint16_t> P(bf16 ? size_t(kQueryBlock) * kKeyBlock : 0);
    auto at = [](const Tensor& t, int64_t r, int64_t c) {
      return static_cast<const char*>(t.row_ptr(r)) + c * dtype_size(t.dtype());
    };
#pragma omp for schedule(dynamic)
    for (int64_t tile = 0; tile < tiles; ++tile) {
      const int h = int(tile / n_qb);
      const int64_t i0 = (tile % n_qb) * kQueryBlock;
      const int kvh = h / group;
      const int bq = int(std::min<int64_t>(kQueryBlock, Tq - i0));
      int64_t ldq = 0, ldk = 0, ldv = 0;
      const float* qh = bf16 ? nullptr : tile_f32(q, i0, bq, int64_t(h) * hd, hd, qbuf, ldq);
      int32_t qmax = std::numeric_limits<int32_t>::min();
      for (int i = 0; i < bq; ++i) qmax = std::max(qmax, a.q_pos[i0 + i]);
      std::fill(m.begin(), m.end(), kNegInf);
      std::fill(l.begin(), l.end(), 0.0f);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (const KeyRun& run : runs) {
        const int64_t j0 = run.j0;
        if (a.k_pos[j0] > qmax) continue;
        // Keys after the run's last one some query here can see are masked
        // for every query: the tile ends there (on the causal diagonal a
        // query block computes a quarter to all of the key block, not all).
        const int bk = int(std::upper_bound(a.k_pos.begin() + j0, a.k_pos.begin() + run.end, qmax) -
                           (a.k_pos.begin() + j0));
        if (bf16) {
          tile_gemm_bf16(bq, bk, hd, at(q, i0, int64_t(h) * hd), q.ld(), false,
                         at(k, j0, int64_t(kvh) * hd), k.ld(), true, S.data(), kKeyBlock, a.scale,
                         false);
        } else {
          const float* kh = tile_f32(k, j0, bk, int64_t(kvh) * hd, hd, kbuf, ldk);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bq, bk, hd, a.scale, qh, int(ldq),
                      kh, int(ldk), 0.0f, S.data(), kKeyBlock);
        }
        for (int i = 0; i < bq; ++i) {
          float* s = S.data() + size_t(i) * kKeyBlock;
          const int32_t qp = a.q_pos[i0 + i];
          float mx = m[i];
          for (int j = 0; j < bk; ++j) {
            if (a.k_pos[j0 + j] > qp) s[j] = kNegInf;
            mx = std::max(mx, s[j]);
          }
          if (mx == kNegInf) {  // nothing visible yet in this row
            for (int j = 0; j < bk; ++j) s[j] = 0.0f;
            continue;
          }
          const float corr = fast_exp(m[i] - mx);
          float sum = 0;
#pragma omp simd reduction(+ : sum)
          for (int j = 0; j < bk; ++j) {
            s[j] = fast_exp(s[j] - mx);
            sum += s[j];
          }
          l[i] = l[i] * corr + sum;
          m[i] = mx;
          float* ar = acc.data() + size_t(i) * hd;
          for (int d = 0; d < hd; ++d) ar[d] *= corr;
        }
        if (bf16) {
          for (int i = 0; i < bq; ++i)
            narrow(S.data() + size_t(i) * kKeyBlock, bk, DType::BF16,
                   P.data() + size_t(i) * kKeyBlock);
          tile_gemm_bf16(bq, hd, bk, P.data(), kKeyBlock, false, at(v, j0, int64_t(kvh) * hd),
                         v.ld(), false, acc.data(), hd, 1.0f, true);
        } else {
          const float* vh = tile_f32(v, j0, bk, int64_t(kvh) * hd, hd, vbuf, ldv);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bq, hd, bk, 1.0f, S.data(),
                      kKeyBlock, vh, int(ldv), 1.0f, acc.data(), hd);
        }
      }
      for (int i = 0; i < bq; ++i) {
        const bool f32 = o.dtype() == DType::F32;
        float* orow = f32 ? o.data<float>() + (i0 + i) * o.ld() + int64_t(h) * hd : obuf.data();
        const float inv = l[i] > 0 ? 1.0f / l[i] : 0.0f;
        for (int d = 0; d < hd; ++d) orow[d] = acc[size_t(i) * hd + d] * inv;
        if (!f32)
          narrow(orow, hd, o.dtype(),
                 static_cast<char*>(o.row_ptr(i0 + i)) + int64_t(h) * hd * dtype_size(o.dtype()));
        if (lse.defined())
          lse.data<float>()[(i0 + i) * a.n_heads + h] = l[i] > 0 ? m[i] + std::log(l[i]) : kNegInf;
      }
    }
  }
  if (parallel) openblas_set_num_threads(blas_threads);
}

// Combines two partial attentions over disjoint key sets:
// o = (e^{lse1} o1 + e^{lse2} o2) / (e^{lse1} + e^{lse2}), lse = log(e^{lse1} + e^{lse2}).
void attention_merge(const Tensor& o, const Tensor& lse, const Tensor& o2, const Tensor& lse2,
                     int n_heads, int head_dim) {
  const int64_t T = o.rows();
  for (int64_t t = 0; t < T; ++t) {
    float* orow = row_out(o, t, 3);
    if (o.dtype() != DType::F32) widen(o.row_ptr(t), o.dtype(), o.cols(), orow);
    const float* o2row = row_f32(o2, t, 0);
    for (int h = 0; h < n_heads; ++h) {
      float& l1 = lse.data<float>()[t * n_heads + h];
      const float l2 = lse2.data<float>()[t * n_heads + h];
      const float mx = std::max(l1, l2);
      if (mx == kNegInf) continue;
      const float w1 = std::exp(l1 - mx), w2 = std::exp(l2 - mx), inv = 1.0f / (w1 + w2);
      float* a = orow + int64_t(h) * head_dim;
      const float* b = o2row + int64_t(h) * head_dim;
      for (int d = 0; d < head_dim; ++d) a[d] = (a[d] * w1 + b[d] * w2) * inv;
      l1 = mx + std::log(w1 + w2);
    }
    store_row(o, t, orow);
  }
}

}  // namespace ss::cpu
