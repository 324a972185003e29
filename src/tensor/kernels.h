// Compute kernels, one set per instruction set, chosen once at startup from
// what the CPU reports (scalar, AVX2+FMA+F16C, AVX2 with AVX-VNNI, AVX-512,
// AVX-512 with VNNI). Model code calls them through kernels(); tests call each
// set directly.
//
// Weight types: F32, F16, BF16 (float products) and Q8_0, Q4_0, Q4_K, Q5_K,
// Q6_K (tensor/quant.h; cols must be whole blocks). The quantized types use
// integer dot products: each matvec/matmat quantizes its input rows to int8
// once (blocks of 32 with a float scale for Q8_0/Q4_0, ggml's Q8_K blocks of
// 256 for the K types; the same bytes on every ISA) and remembers the last
// input it quantized per thread, so the row blocks of one product, and
// products that share an input, quantize it once per thread. Large batches
// dequantize tiles to float instead (kQuantFloatMatmatT below).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace dory::kern {

// A row-major weight matrix [rows x cols] in place in mapped memory; each row
// is row_bytes(dtype, cols) bytes.
struct Mat {
  DType dtype;
  const void* data;
  int64_t rows, cols;
};

// Bytes of a matrix (rows x row_bytes): what one product reads.
uint64_t mat_bytes(const Mat& m);

struct KernelSet {
  const char* name;
  // y[r - r0] = W[r] . x  for r in [r0, r1)
  void (*matvec)(const Mat& w, const float* x, float* y, int64_t r0, int64_t r1);
  // Y[t*ldy + r] = W[r] . X[t*ldx]  for t in [0, T), r in [r0, r1)
  void (*matmat)(const Mat& w, const float* x, int64_t T, int64_t ldx, float* y, int64_t ldy,
                 int64_t r0, int64_t r1);
  float (*dot)(const float* a, const float* b, int64_t n);
  void (*axpy)(float a, const float* x, float* y, int64_t n);  // y += a*x
  // n elements (whole blocks) of any weight type to float; every set gives the
  // same bits as dequantize_row (tensor/quant.h).
  void (*to_f32)(DType t, const void* src, float* dst, int64_t n);
};

// Quantized weights, batched: T < kQuantFloatMatmatT input rows go through the
// integer-dot path row by row (the same results as T matvecs); from this T on,
// tiles of 4 weight rows x 512 columns are dequantized to float once and reused
// by the float micro-kernel (no int8 rounding of the input). Measured on Zen 5,
// one thread, 4096x2560: int8 is 1.3-2.5x faster at T = 4, 1.0-1.35x at T = 16-32,
// even at T = 64 with AVX-512 (the float path is faster there with AVX2). The
// scalar set follows the same rule.
constexpr int64_t kQuantFloatMatmatT = 64;

extern const KernelSet kScalar;
extern const KernelSet kAvx2;
extern const KernelSet kAvx2Vnni;    // AVX2 + AVX-VNNI (vpdpbusd, VEX)
extern const KernelSet kAvx512;
extern const KernelSet kAvx512Vnni;  // AVX-512 + AVX512_VNNI

// The sets this CPU can run, best last.
std::vector<const KernelSet*> supported();
// The active set: the best supported, or DORY_ISA=scalar|avx2|avx2vnni|avx512|avx512vnni
// if set.
const KernelSet& active();
inline const KernelSet& kernels() { return active(); }

namespace detail {
// Per-thread scratch of the integer-dot kernels (owned by kernels.cpp, so no
// ISA-specific code touches a std:: container): a copy of the last input a
// set quantized, to recognise it, and its quantized form.
struct ActScratch {
  int tag;              // which set and activation format made buf; -1: none
  int64_t rows, cols;   // of the input
  float* src;           // rows*cols floats, a copy of the input
  uint64_t src_cap;     // floats
  uint8_t* buf;         // the quantized input, 64-byte aligned
  uint64_t buf_cap;     // bytes
};
constexpr int kActSlots = 8;
ActScratch& act_scratch(int slot);  // this thread's, slot < kActSlots
// Makes room (contents lost); sets tag = -1.
void act_reserve(ActScratch& s, uint64_t src_floats, uint64_t buf_bytes);
}  // namespace detail

}  // namespace dory::kern
