#include "model/ops.h"

#include <cmath>

namespace dory {

void normalize(float* x, int64_t n) {
  double ss = 0;  // double: the norm is the one thing every layer depends on
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss + 1e-6));
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void ngpt_residual(float* x, float* y, const float* a, int64_t n) {
  normalize(x, n);
  normalize(y, n);
  for (int64_t i = 0; i < n; ++i) x[i] += a[i] * (y[i] - x[i]);
  normalize(x, n);
}

void linear_multi(ThreadPool& pool, const float* x, int64_t T, const std::vector<LinearOut>& outs) {
  const kern::KernelSet& k = kern::kernels();
  // Row blocks: small for one row (memory-bound, many tasks balance well),
  // a multiple of the 4-row micro-kernel for batches.
  const int64_t block = T == 1 ? 32 : 16;
  std::vector<int64_t> first_task(outs.size() + 1, 0);
  for (size_t i = 0; i < outs.size(); ++i)
    first_task[i + 1] = first_task[i] + (outs[i].w->rows + block - 1) / block;
  pool.run(first_task.back(), [&](int64_t task) {
    size_t i = 0;
    while (task >= first_task[i + 1]) ++i;
    const kern::Mat& w = *outs[i].w;
    const int64_t r0 = (task - first_task[i]) * block;
    const int64_t r1 = std::min(w.rows, r0 + block);
    if (T == 1) k.matvec(w, x, outs[i].y + r0, r0, r1);
    else k.matmat(w, x, T, w.cols, outs[i].y, w.rows, r0, r1);
  });
}

void linear(ThreadPool& pool, const kern::Mat& w, const float* x, int64_t T, float* y) {
  linear_multi(pool, x, T, {{&w, y}});
}

}  // namespace dory
