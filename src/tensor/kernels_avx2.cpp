// AVX2 + FMA + F16C kernels (compiled with those flags; entered only after a
// runtime check).
#include <immintrin.h>

#include "tensor/kernels_simd.h"

namespace dory::kern {
namespace {

struct Avx2 {
  using reg = __m256;
  static constexpr int W = 8;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg set1(float a) { return _mm256_set1_ps(a); }
  static reg load_f32(const float* p) { return _mm256_loadu_ps(p); }
  static reg load_bf16(const uint8_t* p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static reg load_f16(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
  static float hsum(reg v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};

}  // namespace

const KernelSet kAvx2 = make_set<Avx2>("avx2");

}  // namespace dory::kern
