// AVX-512 (F, BW, VL, DQ) kernels (compiled with those flags; entered only
// after a runtime check).
#include <immintrin.h>

#include "tensor/kernels_quant_simd.h"

namespace dory::kern {
namespace {

struct Avx512 {
  using reg = __m512;
  static constexpr int W = 16;
  static constexpr int kGemmNT = 12;  // input rows per tile of the float GEMM (2*NT accumulators)
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
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg div(reg a, reg b) { return _mm512_div_ps(a, b); }
  static reg min(reg a, reg b) { return _mm512_min_ps(a, b); }  // b where either is NaN
  static reg max(reg a, reg b) { return _mm512_max_ps(a, b); }
  static reg round(reg a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // 2^k for whole k in [-126, 127]
  static reg pow2i(reg k) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23));
  }
  static reg load_n(const float* p, int64_t n) {  // n < W floats, zeros after
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p);
  }
  static void store_n(float* p, reg v, int64_t n) { _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1), v); }
  static void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  static float hsum(reg v) { return _mm512_reduce_add_ps(v); }
  // r[i] = row i of a 16 x 16 block -> r[k] = column k.
  static void transpose(reg* r) {
    reg t[16], u[16];
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 4; ++g) {  // u[4g + c]: column c (+4, +8, +12 in 128-bit lanes 1-3) of rows 4g..4g+3
      u[4 * g + 0] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
      u[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
      u[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
      u[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
    }
    for (int c = 0; c < 4; ++c) {
      const reg a = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88), b = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
      const reg e = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD), f = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
      r[c] = _mm512_shuffle_f32x4(a, b, 0x88);
      r[c + 8] = _mm512_shuffle_f32x4(a, b, 0xDD);
      r[c + 4] = _mm512_shuffle_f32x4(e, f, 0x88);
      r[c + 12] = _mm512_shuffle_f32x4(e, f, 0xDD);
    }
  }
};

// The 16 halves d of 16 consecutive Q8_0 / Q4_0 blocks at p. A block is 17 / 9
// 16-bit words, so two-source word permutes over loads of the blocks pick
// them out (a gather measured 2x slower on Zen 5). Reads only the 16 blocks.
template <bool Q8>
inline __m256i block_halves16(const uint8_t* p) {
  auto ld = [](const uint8_t* q) { return _mm512_loadu_si512(q); };
  if constexpr (!Q8) {
    // 8 blocks = 144 bytes; block k's d is word 9k of the 128 bytes at p.
    const __m512i i0 = _mm512_setr_epi32(0 | 9 << 16, 18 | 27 << 16, 36 | 45 << 16, 54 | 63 << 16, 0, 0, 0, 0, 0,
                                         0, 0, 0, 0, 0, 0, 0);
    const __m512i i1 = _mm512_setr_epi32(0, 0, 0, 0, 0 | 9 << 16, 18 | 27 << 16, 36 | 45 << 16, 54 | 63 << 16, 0,
                                         0, 0, 0, 0, 0, 0, 0);
    const __m512i h0 = _mm512_permutex2var_epi16(ld(p), i0, ld(p + 64));
    const __m512i h1 = _mm512_permutex2var_epi16(ld(p + 144), i1, ld(p + 208));
    return _mm512_castsi512_si256(_mm512_mask_blend_epi16(0xFF00, h0, h1));
  } else {
    // 4 blocks = 136 bytes; block k's d is word 17k of the 128 bytes at p.
    __m512i h = _mm512_setzero_si512();
    for (int g = 0; g < 4; ++g) {
      const __m512i idx = _mm512_mask_set1_epi64(_mm512_setzero_si512(), 1 << g,
                                                 static_cast<long long>(0 | 17ull << 16 | 34ull << 32 | 51ull << 48));
      const __m512i hg = _mm512_permutex2var_epi16(ld(p + 136 * g), idx, ld(p + 136 * g + 64));
      h = _mm512_mask_blend_epi16(0xFu << (4 * g), h, hg);
    }
    return _mm512_castsi512_si256(h);
  }
}

// Q8_0 / Q4_0 rows, 512-bit, against the A32 input (qk::ActLayout). Per group
// of 16 blocks the 16 scales d_w * d_x are one vector, spread to each block's
// lanes by a permute; the 256-bit code does the last < 16 blocks.
//   Q8_0: two blocks a vector (32 code bytes each).
//   Q4_0: four blocks a vector, 128-bit lane j = block j's 16 code bytes; the
//   low nibbles meet the first 16 inputs of each block and the high ones the
//   last 16 (the input's nib section); the -8 of every code is the input's q4c
//   (a float per block) times the 16 blocks' d, one FMA per group. (It was a
//   64-byte int32 vector per 4 blocks, added in the dot instruction: 4B Q4_0
//   decode at 2 threads, both forms alternating every 7 products in one run,
//   GB/s of the products: 37.30 -> 37.70, 40.81 -> 41.10, 42.34 -> 42.90,
//   43.48 -> 44.29, 43.85 -> 44.49; the loads, not the arithmetic, are what
//   these rows are short of: from L2 on one thread a model of this loop went
//   35-37 -> 46 GB/s without that load.) Two blocks a
//   vector, as Q8_0, took 8 vector operations per 2 blocks against 11 per 4 here:
//   one thread, 256 x 2560 in L2, 36 -> 42.5 GB/s.
template <class D, bool Q8>
float a32_row512(const uint8_t* row, const uint8_t* act, int64_t n) {
  constexpr int kB = Q8 ? 34 : 18;
  const qk::ActLayout L(qk::kA32, n);
  const auto* ad = reinterpret_cast<const float*>(act + L.d);
  const auto* ns4 = reinterpret_cast<const int32_t*>(act + L.extra);
  const int64_t nb = n / 32;
  const __m512i ones = _mm512_set1_epi16(1);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  __m512 accc = _mm512_setzero_ps();  // Q4_0: the -8 corrections
  const auto* q4c = reinterpret_cast<const float*>(act + L.q4c);
  int64_t b = 0;
  for (; b + 16 <= nb; b += 16) {
    const uint8_t* p = row + kB * b;
    stream_ahead<16 * kB>(p);
    const __m512 dw = _mm512_cvtph_ps(block_halves16<Q8>(p));
    const __m512 s16 = _mm512_mul_ps(dw, _mm512_loadu_ps(ad + b));
    if constexpr (!Q8) accc = _mm512_fmadd_ps(dw, _mm512_loadu_ps(q4c + b), accc);
    if constexpr (Q8) {
      const __m512i x80 = _mm512_set1_epi8(static_cast<char>(0x80));
      for (int k = 0; k < 16; k += 2) {
        const uint8_t* p0 = p + kB * k;
        const __m512i av = _mm512_load_si512(act + 32 * (b + k));
        const __m512i w = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p0 + 2))),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p0 + kB + 2)), 1);
        __m512i is;
        if constexpr (D::kVnni) {
          // (w + 128).a - 128.a, the correction by a second dot product
          // rather than from the input's ns4: loading ns4 doubled the input
          // bytes the row reads from L1, and on rows of 7168 (the MLP's down
          // projection) the input no longer stayed there. Two threads,
          // 1 GiB of rows from memory, the two forms alternating (GB/s): 7168
          // columns 36.0 -> 46.6, 38.2 -> 47.5, 37.4 -> 49.4; 4096 51.0 ->
          // 51.8, 47.8 -> 50.6; 2560 50.4 -> 51.4, 52.5 -> 52.2.
          is = _mm512_sub_epi32(D::dpbusd512(_mm512_setzero_si512(), _mm512_xor_si512(w, x80), av),
                                D::dpbusd512(_mm512_setzero_si512(), x80, av));
        } else {
          const __m512i sa = _mm512_mask_sub_epi8(av, _mm512_movepi8_mask(w), _mm512_setzero_si512(), av);
          is = _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(w), sa), ones);
        }
        const __m512i sel = _mm512_set_epi32(k + 1, k + 1, k + 1, k + 1, k + 1, k + 1, k + 1, k + 1, k, k, k, k,
                                             k, k, k, k);
        acc[(k / 2) % 4] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_permutexvar_ps(sel, s16), acc[(k / 2) % 4]);
      }
    } else {
      const __m512i m4 = _mm512_set1_epi8(0x0F);
      const auto* q4 = reinterpret_cast<const __m512i*>(act + L.nib) + 2 * (b / 4);
      for (int g = 0; g < 4; ++g) {
        const uint8_t* pg = p + kB * 4 * g + 2;
        __m512i wv = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pg)));
        wv = _mm512_inserti32x4(wv, _mm_loadu_si128(reinterpret_cast<const __m128i*>(pg + kB)), 1);
        wv = _mm512_inserti32x4(wv, _mm_loadu_si128(reinterpret_cast<const __m128i*>(pg + 2 * kB)), 2);
        wv = _mm512_inserti32x4(wv, _mm_loadu_si128(reinterpret_cast<const __m128i*>(pg + 3 * kB)), 3);
        const __m512i lo = _mm512_and_si512(wv, m4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(wv, 4), m4);
        const __m512i alo = _mm512_load_si512(q4 + 2 * g), ahi = _mm512_load_si512(q4 + 2 * g + 1);
        __m512i is;
        if constexpr (D::kVnni) {
          is = D::dpbusd512(D::dpbusd512(_mm512_setzero_si512(), lo, alo), hi, ahi);
        } else {
          is = _mm512_add_epi32(_mm512_madd_epi16(_mm512_maddubs_epi16(lo, alo), ones),
                                _mm512_madd_epi16(_mm512_maddubs_epi16(hi, ahi), ones));
        }
        const int j = 4 * g;
        const __m512i sel = _mm512_set_epi32(j + 3, j + 3, j + 3, j + 3, j + 2, j + 2, j + 2, j + 2, j + 1, j + 1,
                                             j + 1, j + 1, j, j, j, j);
        acc[g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_permutexvar_ps(sel, s16), acc[g]);
      }
    }
  }
  float tail = 0;
  if (b < nb) {
    // The rest on the 256-bit path (same integers, same per-block scale).
    __m256 t = _mm256_setzero_ps();
    for (; b < nb; ++b) {
      const uint8_t* p = row + kB * b;
      const __m256i av = _mm256_load_si256(reinterpret_cast<const __m256i*>(act + 32 * b));
      const __m256i s4 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ns4 + 8 * b));
      const __m256i is = Q8 ? qk::block_q8_0<D>(p, av) : qk::block_q4_0<D>(p, av, s4);
      t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_set1_ps(qk::half_to_f32(p) * ad[b]), t);
    }
    tail = qk::hsum8(t);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]))) + tail +
         (Q8 ? 0.0f : _mm512_reduce_add_ps(accc));
}

template <int K>
inline __m512i shl16_512(__m512i v) {
  if constexpr (K > 0) return _mm512_slli_epi16(v, K);
  else if constexpr (K < 0) return _mm512_srli_epi16(v, -K);
  else return v;
}

// int16 lane indices: lanes 16h..16h+15 take lane a (h = 0) or b (h = 1).
inline __m512i idx16x2(int a, int b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(static_cast<short>(a))),
                            _mm256_set1_epi16(static_cast<short>(b)), 1);
}
// int16 lane indices: lanes 8i..8i+7 take lane first + i (i = 0..3).
inline __m512i idx16x4(int first) {
  return _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_set_m128i(_mm_set1_epi16(static_cast<short>(first + 1)),
                                              _mm_set1_epi16(static_cast<short>(first)))),
      _mm256_set_m128i(_mm_set1_epi16(static_cast<short>(first + 3)), _mm_set1_epi16(static_cast<short>(first + 2))),
      1);
}

// A Q4_K / Q5_K super-block at p: its 8 sub-block scales (int16 lanes 0-7 of
// sc16) and its mins times the input's 32-element sums (b32: the super-block's
// 8 int16); add() folds the sub-block-scaled integer sums `is` and the mins into
// the row's float accumulators with d and dmin times the input scale da.
struct K45Scales {
  __m512i sc16;
  __m128i msum;
  K45Scales(const uint8_t* p, const int16_t* b32) {
    uint64_t sc, mn;
    qk::unpack_scales_k4(p + 4, &sc, &mn);
    const __m128i mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(mn)));
    msum = _mm_madd_epi16(mins, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b32)));
    sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(sc))));
  }
  void add(const uint8_t* p, float da, __m512i is, __m512& acc, __m128& accm) const {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_set1_ps(qk::half_to_f32(p) * da), acc);
    accm = _mm_fmadd_ps(_mm_cvtepi32_ps(msum), _mm_set1_ps(qk::half_to_f32(p + 2) * da), accm);
  }
};

// Q4_K / Q5_K rows, 512-bit: a 64-element chunk (two sub-blocks: the low and
// the high nibbles of 32 bytes) per vector; sub-block scales by int16 permute.
template <bool Q5>
float k45_row512(const uint8_t* row, const uint8_t* act, int64_t n) {
  const qk::ActLayout L(qk::kQ8K, n);
  const auto* ad = reinterpret_cast<const float*>(act + L.d);
  const auto* b32 = reinterpret_cast<const int16_t*>(act + L.extra2);
  constexpr int kBytes = Q5 ? 176 : 144;
  const __m512i m4 = _mm512_set1_epi8(0x0F), m10 = _mm512_set1_epi8(0x10);
  __m512 acc = _mm512_setzero_ps();
  __m128 accm = _mm_setzero_ps();
  for (int64_t sb = 0; sb < n / 256; ++sb) {
    const uint8_t* p = row + kBytes * sb;
    stream_ahead<kBytes, _MM_HINT_NTA>(p);
    const int8_t* a = reinterpret_cast<const int8_t*>(act) + 256 * sb;
    const K45Scales ks(p, b32 + 8 * sb);
    const __m512i sc16 = ks.sc16;
    const uint8_t* qs = p + (Q5 ? 48 : 16);
    __m512i H = _mm512_setzero_si512();
    if constexpr (Q5) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
      H = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 1), 1);  // [qh | qh >> 1]
    }
    __m512i is = _mm512_setzero_si512();
    auto chunk = [&](auto cc) {
      constexpr int c = decltype(cc)::value;
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
      __m512i z = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1), m4);
      // Q5: bit 2c of qh (low half) / 2c+1 (high half, already >> 1) to bit 4.
      if constexpr (Q5) z = _mm512_or_si512(z, _mm512_and_si512(shl16_512<4 - 2 * c>(H), m10));
      const __m512i av = _mm512_loadu_si512(a + 64 * c);
      const __m512i s = _mm512_permutexvar_epi16(idx16x2(2 * c, 2 * c + 1), sc16);
      is = _mm512_add_epi32(is, _mm512_madd_epi16(_mm512_maddubs_epi16(z, av), s));
    };
    chunk(std::integral_constant<int, 0>{});
    chunk(std::integral_constant<int, 1>{});
    chunk(std::integral_constant<int, 2>{});
    chunk(std::integral_constant<int, 3>{});
    ks.add(p, ad[sb], is, acc, accm);
  }
  return _mm512_reduce_add_ps(acc) - qk::hsum4(accm);
}

// The 64 bytes at q, M bytes past a 64-byte boundary (0 < M < 64, a multiple
// of 4), from the two aligned lines they span (one valignd) instead of a load
// across the lines. Reads the rest of those two lines too, bytes that may lie
// outside the caller's buffer but never on another page; hence no ASan checks
// here (and, in an ASan build only, no inlining).
template <int M>
__attribute__((no_sanitize_address)) inline __m512i load_lines(const uint8_t* q) {
  return _mm512_alignr_epi32(_mm512_load_si512(q - M + 64), _mm512_load_si512(q - M), M / 4);
}

// The heads of four consecutive Q4_K / Q5_K super-blocks at p (kBytes apart:
// d, dmin and the 12 bytes of 6-bit scales and mins, 16 bytes at a 16-byte
// aligned offset), unpacked in vector registers: W[0] holds the int16 scales
// (lanes 0-7) and mins (8-15) of the first super-block and those of the second
// (16-23, 24-31), W[1] the third and fourth; dd = d_k * da_k (lane 2k) and
// dmin_k * da_k (lane 2k + 1), da the input scales. The same values as
// K45Scales per super-block; done once for four, the scalar unpacking and the
// half conversions of each super-block (~30 of its ~75 instructions) become ~8.
template <int kBytes>
struct K45Heads4 {
  __m512i W[2];
  __m512 dd;  // lanes 0-7
  K45Heads4(const uint8_t* p, const float* da) {
    auto ld = [&](int k) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kBytes * k)); };
    const __m512i V = _mm512_inserti32x4(
        _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(ld(0)), ld(1), 1), ld(2), 2), ld(3), 3);
    // Per 128-bit lane (head bytes h: scale bytes s = h + 4): scales 0-3 are
    // s[0-3] & 63 and 4-7 (s[8-11] & 15) | (s[0-3] >> 6) << 4; mins 0-3 are
    // s[4-7] & 63 and 4-7 (s[8-11] >> 4) | (s[4-7] >> 6) << 4 (ggml's get_scale_min_k4).
    const __m512i A = _mm512_shuffle_epi8(
        V, _mm512_broadcast_i32x4(_mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15)));
    const __m512i B = _mm512_shuffle_epi8(
        V, _mm512_broadcast_i32x4(_mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11)));
    const __m512i m1 = _mm512_broadcast_i32x4(_mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
    const __m512i m2 = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
    const __m512i m3 = _mm512_broadcast_i32x4(
        _mm_setr_epi8(0, 0, 0, 0, 0x30, 0x30, 0x30, 0x30, 0, 0, 0, 0, 0x30, 0x30, 0x30, 0x30));
    const __m512i R = _mm512_or_si512(_mm512_or_si512(_mm512_and_si512(A, m1), _mm512_and_si512(_mm512_srli_epi16(A, 4), m2)),
                                      _mm512_and_si512(_mm512_srli_epi16(B, 2), m3));
    W[0] = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(R));
    W[1] = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(R, 1));
    // dword 4k of V = sb k's d | dmin << 16
    const __m128i h = _mm512_castsi512_si128(
        _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), V));
    const __m256 da2 = _mm256_permutexvar_ps(_mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), _mm256_castps128_ps256(_mm_loadu_ps(da)));
    dd = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_cvtph_ps(h), da2));
  }
};

// Q4_K / Q5_K rows with VNNI: the 64 code bytes of two chunks per step, low
// nibbles (sub-blocks 4p, 4p+2) and high (4p+1, 4p+3) against the input's nib
// section (Q5_K: each with its bit of qh, from [qh | qh >> 2] for the low
// nibbles and [qh >> 1 | qh >> 3] for the high); each dot instruction's int32
// lanes (|sum| <= 4*31*127, an int16) are packed to int16, scaled by the
// sub-block scales and added in one vpdpwssd (madd + add, no saturation). The
// same integers as k45_row512's maddubs steps; Q4_K 8 vector operations per
// 128 elements against 12 (one thread, 256 x 2560 in L2: 24.7 -> 37.5 GB/s
// with madd + add, ~1% more with vpdpwssd). Super-blocks go four at a time
// with their heads unpacked together (K45Heads4; the mins' products summed in
// a vector of four super-blocks' lanes), the rest one at a time (K45Scales).
// Fewer instructions per byte also stream faster: Q4_K 256 x 2560 in L2, one
// thread, 37.7-38.0 -> 46.1-47.6 GB/s; from memory at 2 threads, alternating
// with the one-at-a-time kernel (4 runs): 31.6/34.5/34.0/33.3 -> 35.2/37.4/
// 38.2/37.8 GB/s, i.e. 70-74% -> 79-82% of plain aligned loads of the same bytes;
// in 4B-shaped Q4_K_M decode (2 threads, both kernels alternating every 7
// products in one run), the Q4_K products 37.1 -> 38.1 and 37.6 -> 38.6 GB/s.
//
// R0 >= 0: the row starts 16 * R0 bytes past a 64-byte boundary, so each
// 64-byte code load M = (16 * R0 + its offset) % 64 bytes past one is known
// when compiling, and is made from the two aligned lines it spans (valignd)
// rather than one load across them: 4B-shaped Q4_K_M decode at 2 threads,
// both forms alternating every 7 products in one run, GB/s of all products
// (80% of the bytes Q4_K): 51.6 -> 52.9, 47.7 -> 48.7, 49.0 -> 50.2, 49.5 ->
// 51.2, 60.8 -> 61.3. R0 = -1: unaligned loads (rows not 16-byte aligned).
template <class D, bool Q5, int R0>
float k45_row512_vnni(const uint8_t* row, const uint8_t* act, int64_t n) {
  constexpr int kBytes = Q5 ? 176 : 144;
  const qk::ActLayout L(qk::kQ8K, n);
  const auto* ad = reinterpret_cast<const float*>(act + L.d);
  const auto* b32 = reinterpret_cast<const int16_t*>(act + L.extra2);
  const uint8_t* nib = act + L.nib;
  // int16 lane -> sub-block: 128-bit lane k of packs(lo, hi) holds 4 sums of lo
  // then 4 of hi, of the pair's first chunk (k < 2) or its second; + 16: the
  // second super-block of a K45Heads4 register.
  alignas(64) static const int16_t kIdx[2][32] = {
      {0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 2, 2, 2, 2, 3, 3, 3, 3},
      {4, 4, 4, 4, 5, 5, 5, 5, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7, 6, 6, 6, 6, 7, 7, 7, 7}};
  // the mins of four super-blocks from K45Heads4's W[0] (0-31) and W[1] (32-63)
  alignas(64) static const int16_t kMins[32] = {8,  9,  10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31,
                                                40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63};
  const __m512i idx0 = _mm512_load_si512(kIdx[0]), idx1 = _mm512_load_si512(kIdx[1]);
  const __m512i m4 = _mm512_set1_epi8(0x0F), m10 = _mm512_set1_epi8(0x10);
  // The integer sum of super-block sb at p, its sub-block scales int16 lanes
  // off..off+7 of sc.
  auto sums = [&](const uint8_t* p, int64_t sb, __m512i sc, int off, auto mc) {
    constexpr int M = decltype(mc)::value;
    __m512i Hlo = _mm512_setzero_si512(), Hhi = _mm512_setzero_si512();
    if constexpr (Q5) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
      Hlo = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
      Hhi = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_srli_epi16(qh, 1)), _mm256_srli_epi16(qh, 3), 1);
    }
    __m512i is = _mm512_setzero_si512();
    for (int pr = 0; pr < 2; ++pr) {
      const uint8_t* qa = p + (Q5 ? 48 : 16) + 64 * pr;
      __m512i q;
      if constexpr (M < 0) q = _mm512_loadu_si512(qa);
      else if constexpr (M == 0) q = _mm512_load_si512(qa);
      else q = load_lines<M>(qa);
      __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
      if constexpr (Q5) {
        // bit 4*pr of Hlo / Hhi to bit 4
        lo = _mm512_or_si512(lo, _mm512_and_si512(pr ? Hlo : _mm512_slli_epi16(Hlo, 4), m10));
        hi = _mm512_or_si512(hi, _mm512_and_si512(pr ? Hhi : _mm512_slli_epi16(Hhi, 4), m10));
      }
      const uint8_t* a = nib + 256 * sb + 128 * pr;
      const __m512i dlo = D::dpbusd512(_mm512_setzero_si512(), lo, _mm512_load_si512(a));
      const __m512i dhi = D::dpbusd512(_mm512_setzero_si512(), hi, _mm512_load_si512(a + 64));
      const __m512i ix = _mm512_add_epi16(pr ? idx1 : idx0, _mm512_set1_epi16(static_cast<short>(off)));
      is = D::dpwssd512(is, _mm512_packs_epi32(dlo, dhi), _mm512_permutexvar_epi16(ix, sc));
    }
    return is;
  };
  __m512 acc = _mm512_setzero_ps(), accm4 = _mm512_setzero_ps();
  __m128 accm = _mm_setzero_ps();
  const int64_t nsb = n / 256;
  int64_t sb = 0;
  for (; sb + 4 <= nsb; sb += 4) {
    const uint8_t* p = row + kBytes * sb;
    const K45Heads4<kBytes> H(p, ad + sb);
    // mins . bsum32 of each super-block k in int32 lanes 4k..4k+3, times dmin_k * da_k
    const __m512i ms = _mm512_madd_epi16(_mm512_permutex2var_epi16(H.W[0], _mm512_load_si512(kMins), H.W[1]),
                                         _mm512_loadu_si512(b32 + 8 * sb));
    const __m512 dm = _mm512_permutexvar_ps(_mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7, 7), H.dd);
    accm4 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ms), dm, accm4);
    auto step = [&](auto kc) {
      constexpr int k = decltype(kc)::value;
      constexpr int M = R0 < 0 ? -1 : (16 * R0 + kBytes * k + (Q5 ? 48 : 16)) % 64;
      stream_ahead<kBytes, _MM_HINT_NTA>(p + kBytes * k);
      const __m512i is = sums(p + kBytes * k, sb + k, H.W[k / 2], 16 * (k % 2), std::integral_constant<int, M>{});
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_permutexvar_ps(_mm512_set1_epi32(2 * k), H.dd), acc);
    };
    step(std::integral_constant<int, 0>{});
    step(std::integral_constant<int, 1>{});
    step(std::integral_constant<int, 2>{});
    step(std::integral_constant<int, 3>{});
  }
  for (; sb < nsb; ++sb) {
    const uint8_t* p = row + kBytes * sb;
    stream_ahead<kBytes, _MM_HINT_NTA>(p);
    const K45Scales ks(p, b32 + 8 * sb);
    ks.add(p, ad[sb], sums(p, sb, ks.sc16, 0, std::integral_constant<int, -1>{}), acc, accm);
  }
  return _mm512_reduce_add_ps(acc) - qk::hsum4(accm) - _mm512_reduce_add_ps(accm4);
}

// Q6_K rows, 512-bit: 64 elements per vector (ql's 64 bytes of a half give the
// low nibbles of elements 0-63 and the high nibbles of 64-127).
// With VNNI (D::kVnni), as k45_row512_vnni: one dot instruction per 64
// elements (|lane sum| <= 4*63*127, an int16), packed, then scaled and added
// in one vpdpwssd; 15 vector operations per 128 elements against 18.
template <class D>
inline float q6k_row512(const uint8_t* row, const uint8_t* act, int64_t n) {
  const qk::ActLayout L(qk::kQ8K, n);
  const auto* ad = reinterpret_cast<const float*>(act + L.d);
  const auto* bs = reinterpret_cast<const int16_t*>(act + L.extra);
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  alignas(64) static const int16_t kIdx[2][32] = {
      {0, 0, 0, 0, 4, 4, 4, 4, 1, 1, 1, 1, 5, 5, 5, 5, 2, 2, 2, 2, 6, 6, 6, 6, 3, 3, 3, 3, 7, 7, 7, 7},
      {8, 8, 8, 8, 12, 12, 12, 12, 9, 9, 9, 9, 13, 13, 13, 13, 10, 10, 10, 10, 14, 14, 14, 14, 11, 11, 11, 11, 15, 15, 15, 15}};
  const __m512i idx0 = _mm512_load_si512(kIdx[0]), idx1 = _mm512_load_si512(kIdx[1]);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < n / 256; ++sb) {
    const uint8_t* p = row + 210 * sb;
    stream_ahead<210, _MM_HINT_NTA>(p);
    const int8_t* a = reinterpret_cast<const int8_t*>(act) + 256 * sb;
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192)));
    const __m512i sc16 = _mm512_castsi256_si512(s16);
    // sum_k sc_k * bsum_k: the -32 offset of every code, applied once.
    const __m256i bias = _mm256_madd_epi16(s16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs + 16 * sb)));
    __m512i is = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(bias, 5)));
    for (int h = 0; h < 2; ++h) {
      const __m512i Lq = _mm512_loadu_si512(p + 64 * h);
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * h));
      const __m512i Hz = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);  // [qh | qh >> 2]
      const __m512i ulo = _mm512_or_si512(_mm512_and_si512(Lq, m4), _mm512_and_si512(_mm512_slli_epi16(Hz, 4), m30));
      const __m512i uhi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(Lq, 4), m4), _mm512_and_si512(Hz, m30));
      const __m512i alo = _mm512_loadu_si512(a + 128 * h), ahi = _mm512_loadu_si512(a + 128 * h + 64);
      if constexpr (D::kVnni) {
        // 128-bit lane k of packs(lo, hi): 4 sums of sub-block 8h+k, then 4 of 8h+4+k.
        const __m512i dlo = D::dpbusd512(_mm512_setzero_si512(), ulo, alo);
        const __m512i dhi = D::dpbusd512(_mm512_setzero_si512(), uhi, ahi);
        const __m512i s = _mm512_permutexvar_epi16(h ? idx1 : idx0, sc16);
        is = D::dpwssd512(is, _mm512_packs_epi32(dlo, dhi), s);
      } else {
        const __m512i slo = _mm512_permutexvar_epi16(idx16x4(8 * h), sc16);
        const __m512i shi = _mm512_permutexvar_epi16(idx16x4(8 * h + 4), sc16);
        is = _mm512_add_epi32(is, _mm512_madd_epi16(_mm512_maddubs_epi16(ulo, alo), slo));
        is = _mm512_add_epi32(is, _mm512_madd_epi16(_mm512_maddubs_epi16(uhi, ahi), shi));
      }
    }
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_set1_ps(qk::half_to_f32(p + 208) * ad[sb]), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// 512-bit vector ops of the tiled GEMM (kernels_quant_simd.h, qk::qg): panels
// of 16 weight rows, 8 input rows per tile (8 int32 accumulators + 8 float
// sums + operands of 32 registers). With VNNI the input's dword is an
// embedded broadcast ({1to16}) of the dot instruction itself, so a dot step
// costs one instruction and no shuffle.
template <bool Vnni>
struct G512 {
  static constexpr int L = 16;
  static constexpr int NT = 8;
  static constexpr bool kVnni = Vnni;
  using vi = __m512i;
  using vf = __m512;
  static vi zero() { return _mm512_setzero_si512(); }
  static vf zerof() { return _mm512_setzero_ps(); }
  static vi load(const void* p) { return _mm512_load_si512(p); }
  static void store(void* p, vi v) { _mm512_store_si512(p, v); }
  static vi bcast(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
  }
  static vi set8(char c) { return _mm512_set1_epi8(c); }
  static vi and_(vi a, vi b) { return _mm512_and_si512(a, b); }
  static vi or_(vi a, vi b) { return _mm512_or_si512(a, b); }
  static vi xor_(vi a, vi b) { return _mm512_xor_si512(a, b); }
  template <int K>
  static vi srli16(vi v) { return _mm512_srli_epi16(v, K); }
  template <int K>
  static vi slli16(vi v) { return _mm512_slli_epi16(v, K); }
  static vi add(vi a, vi b) { return _mm512_add_epi32(a, b); }
  static vi mullo(vi a, vi b) { return _mm512_mullo_epi32(a, b); }
  static vi dot4(vi acc, vi u, const void* p) {
    if constexpr (Vnni) {
      asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*static_cast<const int32_t*>(p)));
      return acc;
    } else {
      return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, bcast(p)), _mm512_set1_epi16(1)));
    }
  }
  static vi dot4s(vi acc, vi w, const void* p) {
    const vi s = bcast(p);
    const vi sw = _mm512_mask_sub_epi8(s, _mm512_movepi8_mask(w), _mm512_setzero_si512(), s);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(w), sw), _mm512_set1_epi16(1)));
  }
  static vi dot2w(vi acc, vi w, const void* p) {
    if constexpr (Vnni) {
      asm("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*static_cast<const int32_t*>(p)));
      return acc;
    } else {
      return _mm512_add_epi32(acc, _mm512_madd_epi16(w, bcast(p)));
    }
  }
  static vf cvt(vi v) { return _mm512_cvtepi32_ps(v); }
  static vf mul_b(vf a, const float* p) { return _mm512_mul_ps(a, _mm512_set1_ps(*p)); }
  static vf fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
  static vf fnma(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
  static vf cvtph(const uint16_t* h) { return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(h))); }
  static vf loadf_al(const float* p) { return _mm512_load_ps(p); }
  static void storef_al(float* p, vf v) { _mm512_store_ps(p, v); }
  static vf loadf(const float* p, int n) {
    return n == L ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p);
  }
  static void storef(float* p, vf v, int n) {
    if (n == L) _mm512_storeu_ps(p, v);
    else _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1), v);
  }
  static vi set32(int32_t v) { return _mm512_set1_epi32(v); }
  static vi sub32(vi a, vi b) { return _mm512_sub_epi32(a, b); }
  template <int K>
  static vi srli32(vi v) { return _mm512_srli_epi32(v, K); }
  template <int K>
  static vi slli32(vi v) { return _mm512_slli_epi32(v, K); }
  template <int K>
  static vi srai32(vi v) { return _mm512_srai_epi32(v, K); }
  static vi row_index(int64_t stride) {
    return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                              _mm512_set1_epi32(static_cast<int>(stride)));
  }
  static vi gather(const uint8_t* p, vi idx) { return _mm512_i32gather_epi32(idx, p, 1); }
  // The halves in the low 16 bits of each lane, to float.
  static vf half_lo(vi v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)); }
  // 16 rows (stride apart) x 8 dwords at p -> out[g] = dword g of every row:
  // rows i and i + 8 share a register, then an 8x8 transpose per 256-bit half.
  static void tr8(const uint8_t* p, int64_t stride, vi* out) {
    vi r[8], t[8], u[8];
    for (int i = 0; i < 8; ++i)
      r[i] = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i * stride))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + (i + 8) * stride)), 1);
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {
      u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
      u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
      u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
      u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    // 128-bit lanes [a0 b0 a2 b2] and [a1 b1 a3 b3] of u[g], u[4 + g].
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    for (int g = 0; g < 4; ++g) {
      out[g] = _mm512_permutex2var_epi64(u[g], lo, u[4 + g]);
      out[g + 4] = _mm512_permutex2var_epi64(u[g], hi, u[4 + g]);
    }
  }
  // 16 rows x 4 dwords -> out[0..3]: rows i, i+4, i+8, i+12 share a register,
  // then a 4x4 transpose per 128-bit lane.
  static void tr4(const uint8_t* p, int64_t stride, vi* out) {
    auto ld = [&](int i) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i * stride)); };
    vi z[4];
    for (int i = 0; i < 4; ++i)
      z[i] = _mm512_inserti32x4(
          _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(ld(i)), ld(i + 4), 1), ld(i + 8), 2),
          ld(i + 12), 3);
    const vi t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    const vi t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    out[0] = _mm512_unpacklo_epi64(t0, t2);
    out[1] = _mm512_unpackhi_epi64(t0, t2);
    out[2] = _mm512_unpacklo_epi64(t1, t3);
    out[3] = _mm512_unpackhi_epi64(t1, t3);
  }
};

// The u8 x s8 dot step: maddubs + madd (no VNNI), or AVX512_VNNI's EVEX
// vpdpbusd, in inline assembly so this file needs no -mavx512vnni; it is only
// reached through kAvx512Vnni, after the runtime check.
struct Dp {
  static constexpr bool kVnni = false;
  static constexpr int kSlot = 2;
  using G = G512<false>;
  static __m256i dpbusd(__m256i acc, __m256i, __m256i) { return acc; }  // unused
  static __m512i dpbusd512(__m512i acc, __m512i, __m512i) { return acc; }  // unused
  static __m512i dpwssd512(__m512i acc, __m512i, __m512i) { return acc; }  // unused
  template <bool Q8>
  static float a32_row(const uint8_t* row, const uint8_t* act, int64_t n) {
    return a32_row512<Dp, Q8>(row, act, n);
  }
  template <int K>
  static float k_row(const uint8_t* row, const uint8_t* act, int64_t n) {
    if constexpr (K == 6) return q6k_row512<Dp>(row, act, n);
    else return k45_row512<K == 5>(row, act, n);
  }
};
struct DpVnni {
  static constexpr bool kVnni = true;
  static constexpr int kSlot = 3;
  using G = G512<true>;
  static __m256i dpbusd(__m256i acc, __m256i u, __m256i s) {
    asm("%{evex%} vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
    return acc;
  }
  static __m512i dpbusd512(__m512i acc, __m512i u, __m512i s) {
    asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
    return acc;
  }
  // acc + madd(a, b) in one instruction (no saturation: the same integers).
  static __m512i dpwssd512(__m512i acc, __m512i a, __m512i b) {
    asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
  }
  template <bool Q8>
  static float a32_row(const uint8_t* row, const uint8_t* act, int64_t n) {
    return a32_row512<DpVnni, Q8>(row, act, n);
  }
  template <int K>
  static float k_row(const uint8_t* row, const uint8_t* act, int64_t n) {
    if constexpr (K == 6) return q6k_row512<DpVnni>(row, act, n);
    else {
      const uintptr_t a = reinterpret_cast<uintptr_t>(row);
      if (a % 16) return k45_row512_vnni<DpVnni, K == 5, -1>(row, act, n);
      switch (a % 64 / 16) {
        case 0: return k45_row512_vnni<DpVnni, K == 5, 0>(row, act, n);
        case 1: return k45_row512_vnni<DpVnni, K == 5, 1>(row, act, n);
        case 2: return k45_row512_vnni<DpVnni, K == 5, 2>(row, act, n);
        default: return k45_row512_vnni<DpVnni, K == 5, 3>(row, act, n);
      }
    }
  }
};

// ---------------------------------------------------------------------------
// avx512bf16 (kernels.h): BF16 weights in a batch by vdpbf16ps, whose dword
// lanes hold a pair of bf16 and which adds both products of a pair into a
// float lane. The float GEMM's scheme (panel_gemm, kernels_simd.h) on pairs: a
// panel of 32 rows x kKc columns is transposed (no conversion: the file's bf16
// pairs are dwords) so that P.w[j] holds pair j of every row, and the input,
// rounded to bf16 once per product (its batch form: per row ceil(n/2) dwords of
// pairs, padded to 16), is one broadcast dword per pair. One instruction then
// does 32 multiply-adds where FMA does 16. The instructions are compiled by
// attribute and reached only through kAvx512Bf16, after the runtime check.
namespace bf {

inline int64_t stride(int64_t n) { return ((n + 1) / 2 + 15) / 16 * 16; }  // dwords a row

// One input row to bf16 pairs (round to nearest even), zeros to the stride.
__attribute__((target("avx512bf16"))) void to_pairs(const float* x, int64_t n, uint32_t* out) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    _mm512_storeu_si512(out + i / 2, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i)));
  if (i < n) {  // the rest, masked: the padding dwords come out zero
    const int64_t rest = n - i, lo = rest < 16 ? rest : 16;
    const __m512 a = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << lo) - 1), x + i);
    const __m512 b = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << (rest - lo)) - 1), x + i + 16);
    _mm512_storeu_si512(out + i / 2, (__m512i)_mm512_cvtne2ps_pbh(b, a));
  }
}

struct Gemm {
  using In = uint32_t;                                     // the input's bf16 pairs
  static constexpr int L = 32, kKc = 512, kNT = 12;        // a panel: 256 pairs x 32 dwords, 32 KiB
  struct alignas(64) Panel {
    uint32_t w[kKc / 2][L];
  };
  static int64_t at(int64_t c) { return c / 2; }  // chunks start at even columns

  // Rows [p, p + nr) x columns [c0, c0 + kc) of w into P; lanes past nr and the
  // column past an odd n are zero.
  static void pack(const Mat& w, int64_t p, int nr, int64_t c0, int kc, Panel& P) {
    const auto* base = static_cast<const uint16_t*>(w.data);
    int k = 0;
    for (; k + 32 <= kc; k += 32)
      for (int h = 0; h < L; h += 16) {
        __m512 r[16];
        for (int i = 0; i < 16; ++i)
          r[i] = h + i < nr ? _mm512_loadu_ps(reinterpret_cast<const float*>(base + (p + h + i) * w.cols + c0 + k))
                            : _mm512_setzero_ps();
        Avx512::transpose(r);
        for (int j = 0; j < 16; ++j) _mm512_store_ps(reinterpret_cast<float*>(P.w[k / 2 + j] + h), r[j]);
      }
    for (; k < kc; k += 2)
      for (int i = 0; i < L; ++i) {
        uint32_t v = 0;
        if (i < nr) {
          const uint16_t* row = base + (p + i) * w.cols + c0;
          v = row[k];
          if (k + 1 < kc) v |= static_cast<uint32_t>(row[k + 1]) << 16;
        }
        P.w[k / 2][i] = v;
      }
  }

  // NT input rows (row t's pairs of this chunk at x + t*ldx) against the chunk's
  // (kc + 1) / 2 pairs; acc[t] (32 floats) holds the sums of the chunks before
  // (unless first).
  template <int NT>
  __attribute__((target("avx512bf16"))) static void tile(const Panel& P, int kc, const uint32_t* x, int64_t ldx,
                                                        float* acc, bool first) {
    __m512 a0[NT], a1[NT];
    for (int t = 0; t < NT; ++t) {
      a0[t] = first ? _mm512_setzero_ps() : _mm512_load_ps(acc + t * L);
      a1[t] = first ? _mm512_setzero_ps() : _mm512_load_ps(acc + t * L + 16);
    }
    for (int j = 0; j < (kc + 1) / 2; ++j) {
      const __m512bh w0 = (__m512bh)_mm512_load_si512(P.w[j]), w1 = (__m512bh)_mm512_load_si512(P.w[j] + 16);
      for (int t = 0; t < NT; ++t) {
        const __m512bh xb = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[t * ldx + j]));
        a0[t] = _mm512_dpbf16_ps(a0[t], w0, xb);
        a1[t] = _mm512_dpbf16_ps(a1[t], w1, xb);
      }
    }
    for (int t = 0; t < NT; ++t) {
      _mm512_store_ps(acc + t * L, a0[t]);
      _mm512_store_ps(acc + t * L + 16, a1[t]);
    }
  }
};

uint64_t batch_bytes(DType t, int64_t T, int64_t n) {
  return t == DType::BF16 ? static_cast<uint64_t>(T * stride(n) * 4) : qk::batch_bytes(t, T, n);
}

void quantize_batch(DType t, const float* x, int64_t ldx, int64_t n, int64_t t0, int64_t t1, uint8_t* out) {
  if (t != DType::BF16) return qk::quantize_batch(t, x, ldx, n, t0, t1, out);
  for (int64_t r = t0; r < t1; ++r) to_pairs(x + r * ldx, n, reinterpret_cast<uint32_t*>(out) + r * stride(n));
}

void matmat_qa(const Mat& w, const uint8_t* xb, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  if (w.dtype != DType::BF16) return qk::matmat_qa<DpVnni>(w, xb, T, y, ldy, r0, r1);
  if (r1 > r0 && T > 0)
    panel_gemm<Avx512, Gemm>(w, reinterpret_cast<const uint32_t*>(xb), stride(w.cols), T, y, ldy, r0, r1);
}

// x rounded to bf16 (nearest even, as to_pairs), as floats.
__attribute__((target("avx512bf16"))) void round_bf16(const float* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i));
    _mm512_mask_storeu_ps(out + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
}

// Rows [0, T) of x (row t at x + t*ldx) rounded to bf16 into a thread's buffer
// (rows of n floats).
const float* rounded_rows(const float* x, int64_t T, int64_t ldx, int64_t n) {
  thread_local AlignedBuf buf;
  auto* out = reinterpret_cast<float*>(buf.get(static_cast<uint64_t>(T * n) * 4));
  for (int64_t t = 0; t < T; ++t) round_bf16(x + t * ldx, n, out + t * n);
  return out;
}

// Every BF16 product of this set takes its input rounded to bf16, the batches
// and the single rows alike, so that a position's logits do not depend on how
// many rows its product had (decode against prefill, a prompt cache's last
// row): the rows here go through the float kernels on the rounded input (decode
// is bound by memory: vdpbf16ps measured no faster there).
void matvec(const Mat& w, const float* x, float* y, int64_t r0, int64_t r1) {
  if (w.dtype == DType::BF16) x = rounded_rows(x, 1, w.cols, w.cols);
  matvec_all<Avx512, DpVnni>(w, x, y, r0, r1);
}

// The float-input entry: BF16 batches through a per-call bf16 copy of the input
// (linear_multi makes it once per product with quantize_batch instead).
void matmat(const Mat& w, const float* x, int64_t T, int64_t ldx, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  if (w.dtype != DType::BF16) return matmat_all<Avx512, DpVnni>(w, x, T, ldx, y, ldy, r0, r1);
  if (T < kMatmatFewRows)
    return matmat_all<Avx512, DpVnni>(w, rounded_rows(x, T, ldx, w.cols), T, w.cols, y, ldy, r0, r1);
  thread_local AlignedBuf xbuf;
  uint8_t* xb = xbuf.get(batch_bytes(DType::BF16, T, w.cols));
  quantize_batch(DType::BF16, x, ldx, w.cols, 0, T, xb);
  matmat_qa(w, xb, T, y, ldy, r0, r1);
}

constexpr KernelSet make() {
  KernelSet k = make_qset<Avx512, DpVnni>("avx512bf16");
  k.matvec = matvec;
  k.matmat = matmat;
  k.batch_bytes = batch_bytes;
  k.quantize_batch = quantize_batch;
  k.matmat_qa = matmat_qa;
  k.bf16_input = true;
  return k;
}

}  // namespace bf

}  // namespace

const KernelSet kAvx512 = make_qset<Avx512, Dp>("avx512");
const KernelSet kAvx512Vnni = make_qset<Avx512, DpVnni>("avx512vnni");
constinit const KernelSet kAvx512Bf16 = bf::make();  // constant: other files' static initializers may list it

}  // namespace dory::kern
