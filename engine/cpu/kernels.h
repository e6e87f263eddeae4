// The cpu backend's kernels: OpenBLAS for GEMMs, the rest written here.
// Each has a float64 reference in tests/reference.h that it is checked against.
#pragma once

#include <cmath>
#include <span>

#include "core/backend.h"

namespace ss::cpu {

void matmul(const Tensor& y, const Tensor& x, const Tensor& w, bool accumulate);
void rmsnorm(const Tensor& y, const Tensor& x, const Tensor& z, const Tensor& w, float eps, int64_t group);
void rope(const Tensor& x, int n_heads, int head_dim, std::span<const int32_t> pos, float theta);
void attention(const Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v, const AttentionArgs& a,
               const Tensor& lse);
void attention_merge(const Tensor& o, const Tensor& lse, const Tensor& o2, const Tensor& lse2, int n_heads,
                     int head_dim);
void conv1d_causal(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& state,
                   bool silu);
void ssd_scan(const SsdArgs& a);
void selective_scan(const SelectiveScanArgs& a);
void ssd_state_correction(const SsdArgs& a);
void selective_state_correction(const SelectiveScanArgs& a);
void gated_norm_sumsq(const Tensor& ss, const Tensor& x, const Tensor& z, int64_t local_group, int64_t slot0);
void gated_rmsnorm_apply(const Tensor& y, const Tensor& x, const Tensor& z, const Tensor& w, const Tensor& ss, float eps,
                         int64_t local_group, int64_t total_group, int64_t slot0);

inline float silu(float v) { return v / (1.0f + std::exp(-v)); }
inline float softplus(float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); }

// Threads for the hand-written kernels and OpenBLAS (1 per MPI rank).
void set_threads(int n);
int threads();

}  // namespace ss::cpu
