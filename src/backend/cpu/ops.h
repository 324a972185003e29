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

// Per-row adapter scales for the products this thread runs next: row t of a product scales
// adapter a's term by scales[t * n + a] x its alpha / rank (LoraDelta::base) instead of its
// --lora scale. Null: every row takes the --lora scale. Held while the guard lives.
class LoraRowScales {
 public:
  LoraRowScales(const float* scales, int n);
  ~LoraRowScales();
  LoraRowScales(const LoraRowScales&) = delete;
  LoraRowScales& operator=(const LoraRowScales&) = delete;

 private:
  const float* prev_;
  int prev_n_;
};

}  // namespace dory
