// AVX2 + FMA + F16C kernels (compiled with those flags; entered only after a
// runtime check).
#include <immintrin.h>

#include "tensor/kernels_quant_simd.h"

namespace dory::kern {
namespace {

struct Avx2 {
  using reg = __m256;
  static constexpr int W = 8;
  static constexpr int kGemmNT = 6;  // input rows per tile of the float GEMM (2*NT accumulators)
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
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static reg div(reg a, reg b) { return _mm256_div_ps(a, b); }
  static reg min(reg a, reg b) { return _mm256_min_ps(a, b); }  // b where either is NaN
  static reg max(reg a, reg b) { return _mm256_max_ps(a, b); }
  static reg round(reg a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // 2^k for whole k in [-126, 127]
  static reg pow2i(reg k) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23));
  }
  static reg load_n(const float* p, int64_t n) {  // n < W floats, zeros after
    alignas(32) float b[8] = {};
    for (int64_t i = 0; i < n; ++i) b[i] = p[i];
    return _mm256_load_ps(b);
  }
  static void store_n(float* p, reg v, int64_t n) {
    alignas(32) float b[8];
    _mm256_store_ps(b, v);
    for (int64_t i = 0; i < n; ++i) p[i] = b[i];
  }
  static void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
  static float hsum(reg v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // r[i] = row i of an 8 x 8 block -> r[k] = column k.
  static void transpose(reg* r) {
    reg t[8], u[8];
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 2; ++g) {  // u[4g + c]: column c (+4 in the high half) of rows 4g..4g+3
      u[4 * g + 0] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
      u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
      u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
      u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
    }
    for (int c = 0; c < 4; ++c) {
      r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
      r[c + 4] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
  }
};

// The u8 x s8 dot step: maddubs + madd (no VNNI), or AVX-VNNI's VEX vpdpbusd
// (and vpdpwssd, the int16 pair step of the GEMM).
// The latter is written in inline assembly, so this file needs no -mavxvnni
// and the instruction is only reached through kAvx2Vnni, after the runtime check.
struct Dp {
  static constexpr bool kVnni = false;
  static constexpr int kSlot = 0;
  using G = qk::qg::G256<Dp>;
  static __m256i dpbusd(__m256i acc, __m256i, __m256i) { return acc; }  // unused
  static __m256i dpwssd(__m256i acc, __m256i, __m256i) { return acc; }  // unused
  template <bool Q8>
  static float a32_row(const uint8_t* row, const uint8_t* act, int64_t n) {
    return qk::dot_a32_row<Dp, Q8>(row, act, n);
  }
  template <int K>
  static float k_row(const uint8_t* row, const uint8_t* act, int64_t n) {
    return qk::k_row256<K>(row, act, n);
  }
};
struct DpVnni {
  static constexpr bool kVnni = true;
  static constexpr int kSlot = 1;
  using G = qk::qg::G256<DpVnni>;
  static __m256i dpbusd(__m256i acc, __m256i u, __m256i s) {
    asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
    return acc;
  }
  static __m256i dpwssd(__m256i acc, __m256i u, __m256i s) {
    asm("%{vex%} vpdpwssd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
    return acc;
  }
  template <bool Q8>
  static float a32_row(const uint8_t* row, const uint8_t* act, int64_t n) {
    return qk::dot_a32_row<DpVnni, Q8>(row, act, n);
  }
  template <int K>
  static float k_row(const uint8_t* row, const uint8_t* act, int64_t n) {
    return qk::k_row256<K>(row, act, n);
  }
};

}  // namespace

const KernelSet kAvx2 = make_qset<Avx2, Dp>("avx2");
const KernelSet kAvx2Vnni = make_qset<Avx2, DpVnni>("avx2vnni");

}  // namespace dory::kern
