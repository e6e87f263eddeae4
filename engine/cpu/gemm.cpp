#include <cblas.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu/kernels.h"

namespace ss::cpu {

// y = x · w^T (+ y): x [M,K] and w [N,K] are row-major, as HF stores weights
// ([out_features, in_features]), so the weight is used transposed in place.
void matmul(const Tensor& y, const Tensor& x, const Tensor& w, bool accumulate) {
  const int M = int(x.rows()), K = int(x.cols()), N = int(w.rows());
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x.data<float>(), int(x.ld()),
              w.data<float>(), int(w.ld()), accumulate ? 1.0f : 0.0f, y.data<float>(), int(y.ld()));
}

void set_threads(int n) {
  openblas_set_num_threads(n);
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
}

int threads() { return openblas_get_num_threads(); }

}  // namespace ss::cpu
