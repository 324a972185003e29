// Compute kernels, one set per instruction set, chosen once at startup from
// what the CPU reports (scalar, AVX2+FMA+F16C, AVX-512). Model code calls
// them through kernels(); tests call each set directly.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace dory::kern {

// A row-major weight matrix [rows x cols] in place in mapped memory.
struct Mat {
  DType dtype;
  const void* data;
  int64_t rows, cols;
};

struct KernelSet {
  const char* name;
  // y[r - r0] = W[r] . x  for r in [r0, r1)
  void (*matvec)(const Mat& w, const float* x, float* y, int64_t r0, int64_t r1);
  // Y[t*ldy + r] = W[r] . X[t*ldx]  for t in [0, T), r in [r0, r1)
  void (*matmat)(const Mat& w, const float* x, int64_t T, int64_t ldx, float* y, int64_t ldy,
                 int64_t r0, int64_t r1);
  float (*dot)(const float* a, const float* b, int64_t n);
  void (*axpy)(float a, const float* x, float* y, int64_t n);  // y += a*x
};

extern const KernelSet kScalar;
extern const KernelSet kAvx2;
extern const KernelSet kAvx512;

// The sets this CPU can run, best last.
std::vector<const KernelSet*> supported();
// The active set: the best supported, or DORY_ISA=scalar|avx2|avx512 if set.
const KernelSet& active();
inline const KernelSet& kernels() { return active(); }

}  // namespace dory::kern
