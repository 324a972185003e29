// AVX-512 (F, BW, VL, DQ) kernels (compiled with those flags; entered only
// after a runtime check).
#include <immintrin.h>

#include "tensor/kernels_simd.h"

namespace dory::kern {
namespace {

struct Avx512 {
  using reg = __m512;
  static constexpr int W = 16;
  static reg zero() { return _mm512_setzero_ps(); }
  static reg set1(float a) { return _mm512_set1_ps(a); }
  static reg load_f32(const float* p) { return _mm512_loadu_ps(p); }
  static reg load_bf16(const uint8_t* p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static reg load_f16(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  static float hsum(reg v) { return _mm512_reduce_add_ps(v); }
};

}  // namespace

const KernelSet kAvx512 = make_set<Avx512>("avx512");

}  // namespace dory::kern
