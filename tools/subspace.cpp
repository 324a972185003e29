#include "subspace.h"

#include <cmath>
#include <random>

#include "common.h"

namespace dory::cli {

void orthonormalize(std::vector<double>& Q, int64_t n, int r) {
  for (int i = 0; i < r; ++i) {
    double* qi = Q.data() + i * n;
    for (int j = 0; j < i; ++j) {
      const double* qj = Q.data() + j * n;
      double d = 0;
      for (int64_t k = 0; k < n; ++k) d += qi[k] * qj[k];
      for (int64_t k = 0; k < n; ++k) qi[k] -= d * qj[k];
    }
    double nrm = 0;
    for (int64_t k = 0; k < n; ++k) nrm += qi[k] * qi[k];
    nrm = std::sqrt(nrm);
    for (int64_t k = 0; k < n; ++k) qi[k] = nrm > 0 ? qi[k] / nrm : 0.0;
  }
}

void topology(const std::vector<float>& X, int64_t d, const std::vector<bool>& take, int r,
              Backend& be, std::vector<float>* mean, std::vector<float>* basis) {
  const int64_t n = static_cast<int64_t>(take.size());
  std::vector<double> mu(d, 0.0);
  int64_t cnt = 0;
  for (int64_t i = 0; i < n; ++i)
    if (take[i]) {
      ++cnt;
      for (int64_t k = 0; k < d; ++k) mu[k] += X[i * d + k];
    }
  for (double& v : mu) v /= std::max<int64_t>(cnt, 1);
  // Covariance, rows of C split over the pool.
  std::vector<double> C(d * d, 0.0);
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < n; ++i)
    if (take[i]) rows.push_back(i);
  parallel_ranges(be, d, 8, [&](int64_t a0, int64_t a1) {
    std::vector<double> xc(d);
    for (int64_t i : rows) {
      for (int64_t k = 0; k < d; ++k) xc[k] = X[i * d + k] - mu[k];
      for (int64_t a = a0; a < a1; ++a) {
        const double xa = xc[a];
        double* Ca = C.data() + a * d;
        for (int64_t b = 0; b < d; ++b) Ca[b] += xa * xc[b];
      }
    }
  });
  r = static_cast<int>(std::min<int64_t>(r, d));
  std::vector<double> Q(r * d), Z(r * d);
  std::mt19937 rng(1);
  std::normal_distribution<double> nd;
  for (double& v : Q) v = nd(rng);
  orthonormalize(Q, d, r);
  for (int it = 0; it < 80; ++it) {
    parallel_ranges(be, r, 1, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t a = 0; a < d; ++a) {
          double s = 0;
          const double* Ca = C.data() + a * d;
          const double* q = Q.data() + j * d;
          for (int64_t b = 0; b < d; ++b) s += Ca[b] * q[b];
          Z[j * d + a] = s;
        }
    });
    Q.swap(Z);
    orthonormalize(Q, d, r);
  }
  mean->assign(mu.begin(), mu.end());
  basis->assign(Q.begin(), Q.end());
}

}  // namespace dory::cli
