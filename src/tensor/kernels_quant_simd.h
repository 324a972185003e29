// Integer-dot kernels for the quantized weight types, in 256-bit AVX2
// intrinsics, instantiated per ISA in kernels_avx2.cpp / kernels_avx512.cpp
// (which compiles them with AVX-512VL, so 32 registers). As in kernels_simd.h,
// everything sits in an unnamed namespace and calls no inline function shared
// with other files (only non-inline functions and intrinsics).
//
// A policy class D gives the u8 x s8 dot step, the scratch slot, and the row
// kernel of the Q8_0/Q4_0 types (the AVX-512 sets have a 512-bit one):
//   static __m256i dpbusd(__m256i acc, __m256i u, __m256i s);  // acc + sum of 4 u*s per i32 lane
//   static constexpr bool kVnni;   // dpbusd is one instruction (no int16 saturation)
//   static constexpr int kSlot;    // 0..3, which pair of scratch slots this set uses
//   template <bool Q8> static float a32_row(const uint8_t* row, const uint8_t* act, int64_t n);
//   template <int K> static float k_row(const uint8_t* row, const uint8_t* act, int64_t n);  // K: 4, 5, 6
//
// Input rows are quantized once (tensor/quant.h: A32 for Q8_0/Q4_0, Q8K for the
// K types) into a per-set layout, bit-identical in value to the scalar reference:
//   A32:  qs[n] | d[n/32] floats | ns4[n/4] int32: -(sum of each 4 consecutive q)
//   Q8K:  qs[n] | d[n/256] floats | bsums[n/16] int16 | bsum32[n/32] int16
// ns4 turns an unsigned-weight product into a signed one inside the dot
// instruction's accumulator: (q - 8).a = q.a + 8*ns4 for Q4_0, and with VNNI
// (w + 128).a + 128*ns4 = w.a for Q8_0.
#pragma once
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "tensor/kernels_simd.h"

namespace dory::kern {
namespace {

namespace qk {

enum ActKind { kA32 = 0, kQ8K = 1 };

inline int act_kind(DType d) { return d == DType::Q8_0 || d == DType::Q4_0 ? kA32 : kQ8K; }

inline uint64_t round64(uint64_t b) { return (b + 63) / 64 * 64; }

// Offsets inside one quantized row of n elements.
struct ActLayout {
  uint64_t d, extra, extra2, bytes;
  ActLayout(int kind, int64_t n) {
    d = round64(n);
    if (kind == kA32) {
      extra = round64(d + n / 32 * 4);  // ns4
      extra2 = extra;
      bytes = round64(extra + n);       // n/4 int32
    } else {
      extra = round64(d + n / 256 * 4);   // bsums
      extra2 = round64(extra + n / 16 * 2);  // bsum32
      bytes = round64(extra2 + n / 32 * 2);
    }
  }
};

inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hsum4(__m128 s) {
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float half_to_f32(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Quantizes m = 32*k floats with one scale (d = max|x|/127, q = rne(x * (1/d)),
// exactly the scalar rule), writing q to qs; returns d.
inline float quant_run(const float* x, int k, int8_t* qs) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 mx = _mm256_setzero_ps();
  for (int i = 0; i < 4 * k; ++i) mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(x + 8 * i), absmask));
  const float amax = hmax8(mx);
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const __m256 v = _mm256_set1_ps(id);
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int b = 0; b < k; ++b) {
    const float* xb = x + 32 * b;
    const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb), v));
    const __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 8), v));
    const __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 16), v));
    const __m256i q3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 24), v));
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + 32 * b), _mm256_permutevar8x32_epi32(p, perm));
  }
  return d;
}

// Sums of each 4 consecutive int8 of 32 (8 int32 lanes).
inline __m256i sum4(__m256i q) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
}

inline void quantize_act(int kind, const float* x, int64_t n, uint8_t* out) {
  const ActLayout L(kind, n);
  auto* qs = reinterpret_cast<int8_t*>(out);
  auto* d = reinterpret_cast<float*>(out + L.d);
  if (kind == kA32) {
    auto* ns4 = reinterpret_cast<__m256i*>(out + L.extra);
    for (int64_t b = 0; b < n / 32; ++b) {
      d[b] = quant_run(x + 32 * b, 1, qs + 32 * b);
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * b));
      _mm256_storeu_si256(ns4 + b, _mm256_sub_epi32(_mm256_setzero_si256(), sum4(q)));
    }
    return;
  }
  auto* bs = reinterpret_cast<int16_t*>(out + L.extra);
  auto* b32 = reinterpret_cast<int16_t*>(out + L.extra2);
  for (int64_t b = 0; b < n / 256; ++b) {
    d[b] = quant_run(x + 256 * b, 8, qs + 256 * b);
    for (int c = 0; c < 8; ++c) {
      const __m256i g = sum4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 256 * b + 32 * c)));
      // lanes 0-3: first 16 elements, 4-7: next 16.
      __m128i s = _mm_hadd_epi32(_mm256_castsi256_si128(g), _mm256_extracti128_si256(g, 1));
      s = _mm_hadd_epi32(s, s);  // [s16a, s16b, s16a, s16b]
      const int s0 = _mm_cvtsi128_si32(s), s1 = _mm_extract_epi32(s, 1);
      bs[16 * b + 2 * c] = static_cast<int16_t>(s0);
      bs[16 * b + 2 * c + 1] = static_cast<int16_t>(s1);
      b32[8 * b + c] = static_cast<int16_t>(s0 + s1);
    }
  }
}

// ---------------------------------------------------------------------------
// Dot products of R weight rows with one quantized input row; out[i] = rows[i] . x.

// One block of 32: the i32 lane sums of w . a (Q8_0: w signed; Q4_0: nibbles
// minus 8 through the -8*sum4 accumulator start).
template <class D>
inline __m256i block_q8_0(const uint8_t* p, __m256i av, __m256i ns4) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
  if constexpr (D::kVnni)
    return D::dpbusd(_mm256_slli_epi32(ns4, 7), _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80))), av);
  else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(av, w)), _mm256_set1_epi16(1));
}

template <class D>
inline __m256i dp_small(__m256i acc, __m256i u, __m256i s) {
  // u <= 63: the int16 pair sums of maddubs cannot saturate.
  if constexpr (D::kVnni) return D::dpbusd(acc, u, s);
  else return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

template <class D>
inline __m256i block_q4_0(const uint8_t* p, __m256i av, __m256i ns4) {
  const __m128i nb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2));
  const __m256i u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(nb, 4), nb), _mm256_set1_epi8(0x0F));
  return dp_small<D>(_mm256_slli_epi32(ns4, 3), u, av);
}

// One row of Q8_0 / Q4_0 (kBytes 34 / 18), two blocks per step on independent
// accumulators. Rows go one at a time: one sequential stream for the
// prefetcher (interleaving rows of 1-3 KiB measured 2-4x slower from DRAM).
template <class D, bool Q8>
inline float dot_a32_row(const uint8_t* row, const uint8_t* act, int64_t n) {
  constexpr int kBytes = Q8 ? 34 : 18;
  const ActLayout L(kA32, n);
  const auto* ad = reinterpret_cast<const float*>(act + L.d);
  const auto* ns4 = reinterpret_cast<const __m256i*>(act + L.extra);
  const auto* aq = reinterpret_cast<const __m256i*>(act);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  const int64_t nb = n / 32;
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    const uint8_t* p0 = row + kBytes * b;
    const uint8_t* p1 = p0 + kBytes;
    const __m256i av0 = _mm256_load_si256(aq + b), av1 = _mm256_load_si256(aq + b + 1);
    const __m256i s0 = _mm256_loadu_si256(ns4 + b), s1 = _mm256_loadu_si256(ns4 + b + 1);
    const __m256i i0 = Q8 ? block_q8_0<D>(p0, av0, s0) : block_q4_0<D>(p0, av0, s0);
    const __m256i i1 = Q8 ? block_q8_0<D>(p1, av1, s1) : block_q4_0<D>(p1, av1, s1);
    acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_set1_ps(half_to_f32(p0) * ad[b]), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_set1_ps(half_to_f32(p1) * ad[b + 1]), acc1);
  }
  if (b < nb) {
    const uint8_t* p = row + kBytes * b;
    const __m256i av = _mm256_load_si256(aq + b), s4 = _mm256_loadu_si256(ns4 + b);
    const __m256i is = Q8 ? block_q8_0<D>(p, av, s4) : block_q4_0<D>(p, av, s4);
    acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_set1_ps(half_to_f32(p) * ad[b]), acc0);
  }
  return hsum8(_mm256_add_ps(acc0, acc1));
}

// Shuffle masks broadcasting int16 lane j of a 128-bit half to the whole half.
inline __m256i lane16(int lo, int hi) {
  return _mm256_setr_epi8(2 * lo, 2 * lo + 1, 2 * lo, 2 * lo + 1, 2 * lo, 2 * lo + 1, 2 * lo, 2 * lo + 1,
                          2 * lo, 2 * lo + 1, 2 * lo, 2 * lo + 1, 2 * lo, 2 * lo + 1, 2 * lo, 2 * lo + 1,
                          2 * hi, 2 * hi + 1, 2 * hi, 2 * hi + 1, 2 * hi, 2 * hi + 1, 2 * hi, 2 * hi + 1,
                          2 * hi, 2 * hi + 1, 2 * hi, 2 * hi + 1, 2 * hi, 2 * hi + 1, 2 * hi, 2 * hi + 1);
}

// The 8 six-bit scales and mins of a Q4_K/Q5_K super-block as bytes
// (sc in *sc, m in *mn, sub-block j in byte j): scale_min_k4 for all j at once.
inline void unpack_scales_k4(const uint8_t* s, uint64_t* sc, uint64_t* mn) {
  uint32_t w0, w1, w2;
  std::memcpy(&w0, s, 4);
  std::memcpy(&w1, s + 4, 4);
  std::memcpy(&w2, s + 8, 4);
  const uint32_t sc_lo = w0 & 0x3f3f3f3fu, mn_lo = w1 & 0x3f3f3f3fu;
  const uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u);
  const uint32_t mn_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u);
  *sc = sc_lo | static_cast<uint64_t>(sc_hi) << 32;
  *mn = mn_lo | static_cast<uint64_t>(mn_hi) << 32;
}

template <int K>
inline __m256i shl16(__m256i v) {
  if constexpr (K > 0) return _mm256_slli_epi16(v, K);
  else if constexpr (K < 0) return _mm256_srli_epi16(v, -K);
  else return v;
}

// Q4_K (Q5 = false) and Q5_K, one row.
template <bool Q5>
inline float dot_k45_row(const uint8_t* row, const uint8_t* act, int64_t n) {
  const ActLayout L(kQ8K, n);
  const auto* ad = reinterpret_cast<const float*>(act + L.d);
  const auto* b32 = reinterpret_cast<const int16_t*>(act + L.extra2);
  constexpr int kBytes = Q5 ? 176 : 144;
  const __m256i m4 = _mm256_set1_epi8(0x0F), m10 = _mm256_set1_epi8(0x10);
  __m256 acc = _mm256_setzero_ps();
  __m128 accm = _mm_setzero_ps();
  for (int64_t sb = 0; sb < n / 256; ++sb) {
    const uint8_t* p = row + kBytes * sb;
    const int8_t* a = reinterpret_cast<const int8_t*>(act) + 256 * sb;
    uint64_t sc, mn;
    unpack_scales_k4(p + 4, &sc, &mn);
    const __m128i mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(mn)));
    const __m128i msum = _mm_madd_epi16(mins, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b32 + 8 * sb)));
    const __m256i scv = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(sc))));
    const uint8_t* qs = p + (Q5 ? 48 : 16);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (Q5) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
    __m256i is = _mm256_setzero_si256();
    auto chunk = [&](auto cc) {
      constexpr int c = decltype(cc)::value;
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
      __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      if constexpr (Q5) {
        lo = _mm256_or_si256(lo, _mm256_and_si256(shl16<4 - 2 * c>(qh), m10));
        hi = _mm256_or_si256(hi, _mm256_and_si256(shl16<3 - 2 * c>(qh), m10));
      }
      const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 64 * c));
      const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 64 * c + 32));
      const __m256i s0 = _mm256_shuffle_epi8(scv, lane16(2 * c, 2 * c));
      const __m256i s1 = _mm256_shuffle_epi8(scv, lane16(2 * c + 1, 2 * c + 1));
      is = _mm256_add_epi32(is, _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a0), s0));
      is = _mm256_add_epi32(is, _mm256_madd_epi16(_mm256_maddubs_epi16(hi, a1), s1));
    };
    chunk(std::integral_constant<int, 0>{});
    chunk(std::integral_constant<int, 1>{});
    chunk(std::integral_constant<int, 2>{});
    chunk(std::integral_constant<int, 3>{});
    const float da = ad[sb];
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_set1_ps(half_to_f32(p) * da), acc);
    accm = _mm_fmadd_ps(_mm_cvtepi32_ps(msum), _mm_set1_ps(half_to_f32(p + 2) * da), accm);
  }
  return hsum8(acc) - hsum4(accm);
}

inline float dot_q6_K_row(const uint8_t* row, const uint8_t* act, int64_t n) {
  const ActLayout L(kQ8K, n);
  const auto* ad = reinterpret_cast<const float*>(act + L.d);
  const auto* bs = reinterpret_cast<const int16_t*>(act + L.extra);
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < n / 256; ++sb) {
    const uint8_t* p = row + 210 * sb;
    const int8_t* a = reinterpret_cast<const int8_t*>(act) + 256 * sb;
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192)));
    // sum_k sc_k * bsum_k: the -32 offset of every code, applied once.
    const __m256i bias = _mm256_madd_epi16(sc16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs + 16 * sb)));
    __m256i is = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(bias, 5));
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = p + 64 * h;
      const __m256i L0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i L1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      const __m256i H = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * h));
      const __m256i u[4] = {
          _mm256_or_si256(_mm256_and_si256(L0, m4), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30)),
          _mm256_or_si256(_mm256_and_si256(L1, m4), _mm256_and_si256(_mm256_slli_epi16(H, 2), m30)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L0, 4), m4), _mm256_and_si256(H, m30)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L1, 4), m4),
                          _mm256_and_si256(_mm256_srli_epi16(H, 2), m30))};
      // This half's 8 scales as int16 in both 128-bit halves.
      const __m256i scv = h == 0 ? _mm256_permute2x128_si256(sc16, sc16, 0x00)
                                 : _mm256_permute2x128_si256(sc16, sc16, 0x11);
      for (int g = 0; g < 4; ++g) {
        const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 128 * h + 32 * g));
        const __m256i s = _mm256_shuffle_epi8(scv, lane16(2 * g, 2 * g + 1));
        is = _mm256_add_epi32(is, _mm256_madd_epi16(_mm256_maddubs_epi16(u[g], av), s));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_set1_ps(half_to_f32(p + 208) * ad[sb]), acc);
  }
  return hsum8(acc);
}

// The 256-bit K-type row kernels by bit count.
template <int K>
inline float k_row256(const uint8_t* row, const uint8_t* act, int64_t n) {
  if constexpr (K == 6) return dot_q6_K_row(row, act, n);
  else return dot_k45_row<K == 5>(row, act, n);
}

template <class D, int R>
inline void dot_rows(DType t, const uint8_t* const* rows, const uint8_t* act, int64_t n, float* out) {
  switch (t) {
    case DType::Q8_0:
      for (int i = 0; i < R; ++i) out[i] = D::template a32_row<true>(rows[i], act, n);
      break;
    case DType::Q4_0:
      for (int i = 0; i < R; ++i) out[i] = D::template a32_row<false>(rows[i], act, n);
      break;
    case DType::Q4_K:
      for (int i = 0; i < R; ++i) out[i] = D::template k_row<4>(rows[i], act, n);
      break;
    case DType::Q5_K:
      for (int i = 0; i < R; ++i) out[i] = D::template k_row<5>(rows[i], act, n);
      break;
    case DType::Q6_K:
      for (int i = 0; i < R; ++i) out[i] = D::template k_row<6>(rows[i], act, n);
      break;
    default: break;
  }
}

// ---------------------------------------------------------------------------
// Dequantization to float, 256-bit, bit-identical to dequantize_row: every
// product of a half scale (11 significant bits) and the small integers is exact
// in single precision, so each value is one correctly rounded operation
// whatever the order or fusion (see tensor/quant.h).

// nb whole blocks of type t starting at p (a row segment) to y.
inline void dequant_blocks(DType t, const uint8_t* p, float* y, int64_t nb) {
  switch (t) {
    case DType::Q8_0:
      for (int64_t b = 0; b < nb; ++b, p += 34, y += 32) {
        const __m256 d = _mm256_set1_ps(half_to_f32(p));
        for (int i = 0; i < 4; ++i) {
          const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 2 + 8 * i)));
          _mm256_storeu_ps(y + 8 * i, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
        }
      }
      break;
    case DType::Q4_0:
      for (int64_t b = 0; b < nb; ++b, p += 18, y += 32) {
        const __m256 d = _mm256_set1_ps(half_to_f32(p));
        const __m128i n = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2));
        const __m128i m4 = _mm_set1_epi8(0x0F), e8 = _mm_set1_epi8(8);
        const __m128i lo = _mm_sub_epi8(_mm_and_si128(n, m4), e8);
        const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(n, 4), m4), e8);
        const __m128i v[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int i = 0; i < 4; ++i)
          _mm256_storeu_ps(y + 8 * i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v[i])), d));
      }
      break;
    case DType::Q4_K:
    case DType::Q5_K: {
      const bool q5 = t == DType::Q5_K;
      const int bytes = q5 ? 176 : 144;
      for (int64_t b = 0; b < nb; ++b, p += bytes, y += 256) {
        const float d = half_to_f32(p), dmin = half_to_f32(p + 2);
        uint64_t sc, mn;
        unpack_scales_k4(p + 4, &sc, &mn);
        const uint8_t* qs = p + (q5 ? 48 : 16);
        const __m256i qh = q5 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)) : _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) {
          const int c = j / 2;
          const __m256 d1 = _mm256_set1_ps(d * static_cast<float>((sc >> (8 * j)) & 0xFF));
          const __m256 m1 = _mm256_set1_ps(dmin * static_cast<float>((mn >> (8 * j)) & 0xFF));
          __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
          if (j % 2) q = _mm256_srli_epi16(q, 4);
          q = _mm256_and_si256(q, _mm256_set1_epi8(0x0F));
          if (q5) {
            // bit j of qh[l] -> bit 4 of byte l
            const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j)), _mm256_set1_epi8(1));
            q = _mm256_or_si256(q, _mm256_slli_epi16(bit, 4));
          }
          for (int i = 0; i < 4; ++i) {
            const __m256i q32 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                reinterpret_cast<const __m128i*>(reinterpret_cast<const uint8_t*>(&q) + 8 * i)));
            _mm256_storeu_ps(y + 32 * j + 8 * i, _mm256_sub_ps(_mm256_mul_ps(d1, _mm256_cvtepi32_ps(q32)), m1));
          }
        }
      }
      break;
    }
    case DType::Q6_K:
      for (int64_t b = 0; b < nb; ++b, p += 210, y += 256) {
        const float d = half_to_f32(p + 208);
        const auto* sc = reinterpret_cast<const int8_t*>(p + 192);
        const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30), e32 = _mm256_set1_epi8(32);
        for (int h = 0; h < 2; ++h) {
          const uint8_t* ql = p + 64 * h;
          const __m256i L0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
          const __m256i L1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
          const __m256i H = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * h));
          __m256i u[4] = {
              _mm256_or_si256(_mm256_and_si256(L0, m4), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30)),
              _mm256_or_si256(_mm256_and_si256(L1, m4), _mm256_and_si256(_mm256_slli_epi16(H, 2), m30)),
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L0, 4), m4), _mm256_and_si256(H, m30)),
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L1, 4), m4),
                              _mm256_and_si256(_mm256_srli_epi16(H, 2), m30))};
          for (int g = 0; g < 4; ++g) {
            const __m256i v = _mm256_sub_epi8(u[g], e32);
            for (int i = 0; i < 4; ++i) {
              const __m256 ds = _mm256_set1_ps(d * static_cast<float>(sc[8 * h + 2 * g + i / 2]));
              const __m256i q32 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                  reinterpret_cast<const __m128i*>(reinterpret_cast<const uint8_t*>(&v) + 8 * i)));
              _mm256_storeu_ps(y + 128 * h + 32 * g + 8 * i, _mm256_mul_ps(ds, _mm256_cvtepi32_ps(q32)));
            }
          }
        }
      }
      break;
    default: break;
  }
}

// The quantized form of T input rows (stride ldx), from this thread's scratch
// when the same input was quantized last time; *stride: bytes per row.
template <class D>
inline const uint8_t* quantized_input(DType t, const float* x, int64_t T, int64_t ldx, int64_t n,
                                      uint64_t* stride) {
  const int kind = act_kind(t);
  detail::ActScratch& s = detail::act_scratch(2 * D::kSlot + kind);
  const uint64_t st = ActLayout(kind, n).bytes;
  *stride = st;
  if (s.tag == kind && s.rows == T && s.cols == n) {
    bool same = true;
    for (int64_t r = 0; r < T && same; ++r) same = std::memcmp(s.src + r * n, x + r * ldx, n * 4) == 0;
    if (same) return s.buf;
  }
  detail::act_reserve(s, static_cast<uint64_t>(T * n), T * st);
  for (int64_t r = 0; r < T; ++r) {
    std::memcpy(s.src + r * n, x + r * ldx, n * 4);
    quantize_act(kind, x + r * ldx, n, s.buf + r * st);
  }
  s.tag = kind;
  s.rows = T;
  s.cols = n;
  return s.buf;
}

inline uint64_t qrow_bytes(DType t, int64_t cols) {
  switch (t) {
    case DType::Q8_0: return cols / 32 * 34;
    case DType::Q4_0: return cols / 32 * 18;
    case DType::Q4_K: return cols / 256 * 144;
    case DType::Q5_K: return cols / 256 * 176;
    default: return cols / 256 * 210;
  }
}

template <class D>
void matvec_q(const Mat& w, const float* x, float* y, int64_t r0, int64_t r1) {
  uint64_t st;
  const uint8_t* a = quantized_input<D>(w.dtype, x, 1, w.cols, w.cols, &st);
  const auto* base = static_cast<const uint8_t*>(w.data);
  const uint64_t rb = qrow_bytes(w.dtype, w.cols);
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    const uint8_t* rows[4] = {base + r * rb, base + (r + 1) * rb, base + (r + 2) * rb, base + (r + 3) * rb};
    dot_rows<D, 4>(w.dtype, rows, a, w.cols, y + (r - r0));
  }
  for (; r < r1; ++r) {
    const uint8_t* row = base + r * rb;
    dot_rows<D, 1>(w.dtype, &row, a, w.cols, y + (r - r0));
  }
}

// Batched: every input row quantized once; blocks of 4 weight rows (a few KiB,
// in L1) against each input row in turn.
template <class D>
void matmat_q(const Mat& w, const float* x, int64_t T, int64_t ldx, float* y, int64_t ldy, int64_t r0,
              int64_t r1) {
  uint64_t st;
  const uint8_t* a = quantized_input<D>(w.dtype, x, T, ldx, w.cols, &st);
  const auto* base = static_cast<const uint8_t*>(w.data);
  const uint64_t rb = qrow_bytes(w.dtype, w.cols);
  for (int64_t r = r0; r < r1; r += 4) {
    const int nr = static_cast<int>(r1 - r < 4 ? r1 - r : 4);
    const uint8_t* rows[4];
    for (int i = 0; i < nr; ++i) rows[i] = base + (r + i) * rb;
    for (int64_t t = 0; t < T; ++t) {
      float part[4];
      if (nr == 4) dot_rows<D, 4>(w.dtype, rows, a + t * st, w.cols, part);
      else
        for (int i = 0; i < nr; ++i) dot_rows<D, 1>(w.dtype, rows + i, a + t * st, w.cols, part + i);
      for (int i = 0; i < nr; ++i) y[t * ldy + r + i] = part[i];
    }
  }
}

// Batched, float path: blocks of 4 weight rows x 512 columns dequantized to
// float on the stack once, then the float micro-kernel of kernels_simd.h
// against every input row (what matmat_t does for F16/BF16).
template <class V>
void matmat_qf(const Mat& w, const float* x, int64_t T, int64_t ldx, float* y, int64_t ldy, int64_t r0,
               int64_t r1) {
  constexpr int64_t kKc = 512;
  constexpr int kR = 4;
  alignas(64) float buf[kR][kKc];
  const auto* base = static_cast<const uint8_t*>(w.data);
  const int64_t n = w.cols;
  const uint64_t rb = qrow_bytes(w.dtype, n);
  const int be = w.dtype == DType::Q8_0 || w.dtype == DType::Q4_0 ? 32 : 256;
  const uint64_t bb = qrow_bytes(w.dtype, be);
  for (int64_t r = r0; r < r1; r += kR) {
    const int nr = static_cast<int>(r1 - r < kR ? r1 - r : kR);
    for (int64_t c0 = 0; c0 < n; c0 += kKc) {
      const int64_t kc = n - c0 < kKc ? n - c0 : kKc;
      const uint8_t* rows[kR];
      for (int i = 0; i < nr; ++i) {
        dequant_blocks(w.dtype, base + (r + i) * rb + c0 / be * bb, buf[i], kc / be);
        rows[i] = reinterpret_cast<const uint8_t*>(buf[i]);
      }
      for (int64_t t = 0; t < T; ++t) {
        float part[kR];
        const float* xt = x + t * ldx + c0;
        if (nr == kR) rows_dot<V, kR>(DType::F32, rows, xt, kc, part);
        else
          for (int i = 0; i < nr; ++i) rows_dot<V, 1>(DType::F32, rows + i, xt, kc, part + i);
        float* yt = y + t * ldy + r;
        for (int i = 0; i < nr; ++i) yt[i] = c0 == 0 ? part[i] : yt[i] + part[i];
      }
    }
  }
}

}  // namespace qk

// A kernel set: the float kernels of kernels_simd.h over V, the integer-dot
// kernels above over D.
template <class V, class D>
void matvec_all(const Mat& w, const float* x, float* y, int64_t r0, int64_t r1) {
  if (w.dtype >= DType::Q8_0) qk::matvec_q<D>(w, x, y, r0, r1);
  else matvec_t<V>(w, x, y, r0, r1);
}

template <class V, class D>
void matmat_all(const Mat& w, const float* x, int64_t T, int64_t ldx, float* y, int64_t ldy, int64_t r0,
                int64_t r1) {
  if (w.dtype >= DType::Q8_0) {
    if (T >= kQuantFloatMatmatT) qk::matmat_qf<V>(w, x, T, ldx, y, ldy, r0, r1);
    else qk::matmat_q<D>(w, x, T, ldx, y, ldy, r0, r1);
  }
  else matmat_t<V>(w, x, T, ldx, y, ldy, r0, r1);
}

template <class V>
void to_f32_all(DType t, const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  if (t >= DType::Q8_0) qk::dequant_blocks(t, p, dst, n / (t == DType::Q8_0 || t == DType::Q4_0 ? 32 : 256));
  else to_f32<V>(t, p, dst, n);
}

template <class V, class D>
constexpr KernelSet make_qset(const char* name) {
  return KernelSet{name, matvec_all<V, D>, matmat_all<V, D>, dot_t<V>, axpy_t<V>, to_f32_all<V>};
}

}  // namespace
}  // namespace dory::kern
