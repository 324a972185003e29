// Row-wise building blocks shared by the attention and MLP layers.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/cpu/pool.h"
#include "tensor/kernels.h"

namespace dory {

// n(x) = x / sqrt(sum x^2 + 1e-6), in place over n floats.
void normalize(float* x, int64_t n);
// The nGPT residual on one row: x <- n(n(x) + a * (n(y) - n(x))); y is clobbered.
void ngpt_residual(float* x, float* y, const float* a, int64_t n);

// Y[T x rows] = X[T x cols] W^T: a fused matrix-vector product for one row,
// a batched product otherwise. Rows are split over the pool.
void linear(ThreadPool& pool, const kern::Mat& w, const float* x, int64_t T, float* y);

// Several projections of the same input in one parallel pass (q, k, v, g;
// gate and up).
struct LinearOut {
  const kern::Mat* w;
  float* y;
};
void linear_multi(ThreadPool& pool, const float* x, int64_t T, const std::vector<LinearOut>& outs);

}  // namespace dory
