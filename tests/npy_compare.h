// Comparing logits arrays (.npy) row by row, for the suites that run the
// engine and read its --logits-out.
#pragma once

#include <cmath>
#include <utility>

#include "io/npy.h"

// Relative L2 error of each last-axis row of `got` against `want`; the worst
// row and its index, or (inf, -1) when the shapes differ. NaN counts as the worst.
inline std::pair<double, int64_t> worst_row(const ss::NpyArray& got, const ss::NpyArray& want) {
  if (got.shape != want.shape || want.shape.empty()) return {INFINITY, -1};
  const int64_t cols = want.shape.back();
  const int64_t rows = int64_t(want.data.size()) / cols;
  double worst = 0;
  int64_t at = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double diff = 0, norm = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double a = got.data[size_t(r * cols + c)], b = want.data[size_t(r * cols + c)];
      diff += (a - b) * (a - b);
      norm += b * b;
    }
    const double rel = std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
    if (!(rel <= worst)) {
      worst = rel;
      at = r;
      if (std::isnan(rel)) break;
    }
  }
  return {worst, at};
}
