// The reference kernels: plain loops, any x86-64. Every SIMD set is tested
// against these.
#include <cstring>

#include "tensor/kernels.h"

namespace dory::kern {
namespace {

float load(const Mat& w, int64_t i) {
  const auto* b = static_cast<const uint8_t*>(w.data);
  if (w.dtype == DType::F32) {
    float f;
    std::memcpy(&f, b + i * 4, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, b + i * 2, 2);
  return w.dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

float row_dot(const Mat& w, int64_t r, const float* x) {
  float s = 0;
  for (int64_t c = 0; c < w.cols; ++c) s += load(w, r * w.cols + c) * x[c];
  return s;
}

void matvec(const Mat& w, const float* x, float* y, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) y[r - r0] = row_dot(w, r, x);
}

void matmat(const Mat& w, const float* x, int64_t T, int64_t ldx, float* y, int64_t ldy,
            int64_t r0, int64_t r1) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = r0; r < r1; ++r) y[t * ldy + r] = row_dot(w, r, x + t * ldx);
}

float dot(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

const KernelSet kScalar{"scalar", matvec, matmat, dot, axpy};

}  // namespace dory::kern
