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
//   using G = ...;                 // the vector ops of the batched GEMM (qk::qg below)
//
// Input rows are quantized once (tensor/quant.h: A32 for Q8_0/Q4_0, Q8K for the
// K types) into a per-set layout, bit-identical in value to the scalar reference:
//   A32:  qs[n] | d[n/32] floats | ns4[n/4] int32: -(sum of each 4 consecutive q)
//   Q8K:  qs[n] | d[n/256] floats | bsums[n/16] int16 | bsum32[n/32] int16
// ns4 turns an unsigned-weight product into a signed one inside the dot
// instruction's accumulator: (q - 8).a = q.a + 8*ns4 for Q4_0. (Q8_0 with VNNI,
// (w + 128).a - 128.a = w.a, takes its 128.a from a second dot product instead:
// see block_q8_0.) Batches of rows for the tiled GEMM
// use another arrangement of the same values (BatchLayout below).
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

// Offsets inside one quantized row of n elements. Each also carries a copy of
// its input bytes in the order the 512-bit Q4_0 / Q4_K / Q5_K row kernels
// (kernels_avx512.cpp) meet them with low and high nibbles of 64 code bytes:
//   A32 nib: per whole group of 4 blocks, the first 16 inputs of each block,
//     then the last 16; q4c: per block its Q4_0 correction as a float, d times
//     -8 times the sum of its 32 inputs (the 512-bit rows add it per group of
//     16 blocks, weighted by the blocks' scales, instead of loading a 64-byte
//     correction vector for every 4 blocks: see a32_row512);
//   Q8K nib: per super-block, for each pair of 64-element chunks c, c+1 (c =
//     0, 2): inputs 64c..+31, 64c+64..+95 (the low nibbles), then 64c+32..+63,
//     64c+96..+127 (the high ones).
struct ActLayout {
  uint64_t d, extra, extra2, nib, q4c, bytes;
  // Inlined by force: the row kernels build one per weight row, and GCC left
  // it a call (1.5% of 4B Q4_K_M decode in perf).
  [[gnu::always_inline]] ActLayout(int kind, int64_t n) {
    d = round64(n);
    if (kind == kA32) {
      extra = round64(d + n / 32 * 4);  // ns4
      extra2 = extra;
      nib = round64(extra + n);          // after n/4 int32
      q4c = round64(nib + n / 128 * 128);
      bytes = round64(q4c + n / 32 * 4);
    } else {
      extra = round64(d + n / 256 * 4);   // bsums
      extra2 = round64(extra + n / 16 * 2);  // bsum32
      nib = round64(extra2 + n / 32 * 2);
      q4c = 0;
      bytes = round64(nib + n);
    }
  }
};

// The batch form of T input rows, the tiled GEMM's: rows in groups of kGT,
// and per group one record per block holding that block of all kGT rows
// (rows past T are never read):
//   A32 (352 bytes): qs[kGT][32] | d[kGT] float | b8[kGT] int32 | b128[kGT] int32
//   Q8K (2464 bytes): qs[kGT][256] | d[kGT] float | bsums[kGT][16] int16 | bsum32[kGT][8] int16
// b8/b128 are -8 and -128 times the block's sum of q (the unsigned-weight
// correction, as ns4 above). One base pointer then reaches every operand of a
// tile at a constant displacement (kGT rows at a runtime stride, with their
// metadata in separate arrays, took more registers than x86 has).
constexpr int kGT = 8;
struct BatchLayout {
  static constexpr uint64_t kRecA32 = 352, kRecQ8K = 2464;
  static constexpr uint64_t kA32d = 256, kA32b8 = 288, kA32b128 = 320;
  static constexpr uint64_t kKd = 2048, kKbs = 2080, kKb32 = 2336;
  uint64_t rec, group;
  BatchLayout(int kind, int64_t n) {
    rec = kind == kA32 ? kRecA32 : kRecQ8K;
    group = (kind == kA32 ? n / 32 : n / 256) * rec;
  }
  uint64_t bytes(int64_t T) const { return round64((T + kGT - 1) / kGT * group); }
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

// Quantizes one row into destinations given per block by Dst (the row form or
// a row of the batch form): qs(b), d(b), and A32: ns4(b) (may be null),
// b8(b), b128(b); Q8K: bs(b), b32(b).
template <class Dst>
inline void quantize_blocks(int kind, const float* x, int64_t n, const Dst& o) {
  if (kind == kA32) {
    for (int64_t b = 0; b < n / 32; ++b) {
      int8_t* qs = o.qs(b);
      *o.d(b) = quant_run(x + 32 * b, 1, qs);
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
      const __m256i ns = _mm256_sub_epi32(_mm256_setzero_si256(), sum4(q));
      if (int32_t* p = o.ns4(b)) _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), ns);
      __m128i h = _mm_add_epi32(_mm256_castsi256_si128(ns), _mm256_extracti128_si256(ns, 1));
      h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
      h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
      const int32_t neg = _mm_cvtsi128_si32(h);
      if (int32_t* p = o.b8(b)) {
        *p = 8 * neg;
        *o.b128(b) = 128 * neg;
      }
    }
    return;
  }
  for (int64_t b = 0; b < n / 256; ++b) {
    int8_t* qs = o.qs(b);
    *o.d(b) = quant_run(x + 256 * b, 8, qs);
    int16_t* bs = o.bs(b);
    int16_t* b32 = o.b32(b);
    for (int c = 0; c < 8; ++c) {
      const __m256i g = sum4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c)));
      // lanes 0-3: first 16 elements, 4-7: next 16.
      __m128i s = _mm_hadd_epi32(_mm256_castsi256_si128(g), _mm256_extracti128_si256(g, 1));
      s = _mm_hadd_epi32(s, s);  // [s16a, s16b, s16a, s16b]
      const int s0 = _mm_cvtsi128_si32(s), s1 = _mm_extract_epi32(s, 1);
      bs[2 * c] = static_cast<int16_t>(s0);
      bs[2 * c + 1] = static_cast<int16_t>(s1);
      b32[c] = static_cast<int16_t>(s0 + s1);
    }
  }
}

struct RowDst {
  uint8_t* out;
  ActLayout L;
  bool a32;
  int8_t* qs(int64_t b) const { return reinterpret_cast<int8_t*>(out) + (a32 ? 32 : 256) * b; }
  float* d(int64_t b) const { return reinterpret_cast<float*>(out + L.d) + b; }
  int32_t* ns4(int64_t b) const { return reinterpret_cast<int32_t*>(out + L.extra) + 8 * b; }
  int32_t* b8(int64_t) const { return nullptr; }
  int32_t* b128(int64_t) const { return nullptr; }
  int16_t* bs(int64_t b) const { return reinterpret_cast<int16_t*>(out + L.extra) + 16 * b; }
  int16_t* b32(int64_t b) const { return reinterpret_cast<int16_t*>(out + L.extra2) + 8 * b; }
};

// Row t of a batch: base = its group's start, tt = t % kGT.
struct BatchDst {
  uint8_t* base;
  uint64_t rec;
  int tt;
  uint8_t* r(int64_t b) const { return base + rec * b; }
  int8_t* qs(int64_t b) const {
    return reinterpret_cast<int8_t*>(r(b)) + (rec == BatchLayout::kRecA32 ? 32 : 256) * tt;
  }
  float* d(int64_t b) const {
    return reinterpret_cast<float*>(r(b) + (rec == BatchLayout::kRecA32 ? BatchLayout::kA32d : BatchLayout::kKd)) + tt;
  }
  int32_t* ns4(int64_t) const { return nullptr; }
  int32_t* b8(int64_t b) const { return reinterpret_cast<int32_t*>(r(b) + BatchLayout::kA32b8) + tt; }
  int32_t* b128(int64_t b) const { return reinterpret_cast<int32_t*>(r(b) + BatchLayout::kA32b128) + tt; }
  int16_t* bs(int64_t b) const { return reinterpret_cast<int16_t*>(r(b) + BatchLayout::kKbs) + 16 * tt; }
  int16_t* b32(int64_t b) const { return reinterpret_cast<int16_t*>(r(b) + BatchLayout::kKb32) + 8 * tt; }
};

// The nib (and A32: q4c) sections of a row (ActLayout) from its qs (and d, ns4).
inline void fill_nibble_order(int kind, uint8_t* out, const ActLayout& L, int64_t n) {
  const auto* qs = reinterpret_cast<const int8_t*>(out);
  auto* g = reinterpret_cast<int8_t*>(out + L.nib);
  if (kind == kQ8K) {
    for (int64_t sb = 0; sb < n / 256; ++sb)
      for (int c = 0; c < 4; c += 2) {
        const int8_t* a = qs + 256 * sb + 64 * c;
        int8_t* o = g + 256 * sb + 64 * c;
        std::memcpy(o, a, 32);
        std::memcpy(o + 32, a + 64, 32);
        std::memcpy(o + 64, a + 32, 32);
        std::memcpy(o + 96, a + 96, 32);
      }
    return;
  }
  const auto* ns4 = reinterpret_cast<const int32_t*>(out + L.extra);
  for (int64_t b = 0; b < n / 128 * 4; ++b) {
    // block b: group b/4, slot j = b%4 of its 16-byte lanes
    const int64_t G = b / 4, j = b % 4;
    std::memcpy(g + 128 * G + 16 * j, qs + 32 * b, 16);
    std::memcpy(g + 128 * G + 64 + 16 * j, qs + 32 * b + 16, 16);
  }
  const auto* d = reinterpret_cast<const float*>(out + L.d);
  auto* c = reinterpret_cast<float*>(out + L.q4c);
  for (int64_t b = 0; b < n / 32; ++b) {
    int32_t s = 0;  // -(the block's sum of q)
    for (int i = 0; i < 8; ++i) s += ns4[8 * b + i];
    c[b] = d[b] * static_cast<float>(8 * s);
  }
}

inline void quantize_act(int kind, const float* x, int64_t n, uint8_t* out) {
  const ActLayout L(kind, n);
  quantize_blocks(kind, x, n, RowDst{out, L, kind == kA32});
  fill_nibble_order(kind, out, L, n);
}

// Rows [t0, t1) of the batch form (row t at x + t*ldx; the layout does not
// depend on T).
inline void quantize_batch_rows(int kind, const float* x, int64_t ldx, int64_t n, int64_t t0, int64_t t1,
                                uint8_t* out) {
  const BatchLayout B(kind, n);
  for (int64_t t = t0; t < t1; ++t)
    quantize_blocks(kind, x + t * ldx, n, BatchDst{out + t / kGT * B.group, B.rec, static_cast<int>(t % kGT)});
}

// ---------------------------------------------------------------------------
// Dot products of R weight rows with one quantized input row; out[i] = rows[i] . x.

// One block of 32: the i32 lane sums of w . a (Q8_0: w signed; Q4_0: nibbles
// minus 8 through the -8*sum4 accumulator start).
template <class D>
inline __m256i block_q8_0(const uint8_t* p, __m256i av) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
  if constexpr (D::kVnni) {
    // (w + 128).a - 128.a; as the 512-bit rows (kernels_avx512.cpp), without ns4.
    const __m256i x80 = _mm256_set1_epi8(static_cast<char>(0x80));
    return _mm256_sub_epi32(D::dpbusd(_mm256_setzero_si256(), _mm256_xor_si256(w, x80), av),
                            D::dpbusd(_mm256_setzero_si256(), x80, av));
  } else {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(av, w)), _mm256_set1_epi16(1));
  }
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
    const __m256i i0 = Q8 ? block_q8_0<D>(p0, av0) : block_q4_0<D>(p0, av0, s0);
    const __m256i i1 = Q8 ? block_q8_0<D>(p1, av1) : block_q4_0<D>(p1, av1, s1);
    acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_set1_ps(half_to_f32(p0) * ad[b]), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_set1_ps(half_to_f32(p1) * ad[b + 1]), acc1);
  }
  if (b < nb) {
    const uint8_t* p = row + kBytes * b;
    const __m256i av = _mm256_load_si256(aq + b), s4 = _mm256_loadu_si256(ns4 + b);
    const __m256i is = Q8 ? block_q8_0<D>(p, av) : block_q4_0<D>(p, av, s4);
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

// The quantized form of T input rows (stride ldx): the row form for T = 1,
// the batch form otherwise; from this thread's scratch when the same input was
// quantized last time.
template <class D>
inline const uint8_t* quantized_input(DType t, const float* x, int64_t T, int64_t ldx, int64_t n) {
  const int kind = act_kind(t);
  detail::ActScratch& s = detail::act_scratch(2 * D::kSlot + kind);
  if (s.tag == kind && s.rows == T && s.cols == n) {
    bool same = true;
    for (int64_t r = 0; r < T && same; ++r) same = std::memcmp(s.src + r * n, x + r * ldx, n * 4) == 0;
    if (same) return s.buf;
  }
  const uint64_t bytes = T == 1 ? ActLayout(kind, n).bytes : BatchLayout(kind, n).bytes(T);
  detail::act_reserve(s, static_cast<uint64_t>(T * n), bytes);
  for (int64_t r = 0; r < T; ++r) std::memcpy(s.src + r * n, x + r * ldx, n * 4);
  if (T == 1) quantize_act(kind, x, n, s.buf);
  else quantize_batch_rows(kind, x, ldx, n, 0, T, s.buf);
  s.tag = kind;
  s.rows = T;
  s.cols = n;
  return s.buf;
}

// Bytes of a row of `cols` weights (the dtype table's block size; once per product).
inline uint64_t qrow_bytes(DType t, int64_t cols) { return row_bytes(t, cols); }

// Rows one at a time, one stream per task: its first kStreamAhead bytes are
// asked for at once, the rest by the AVX-512 row kernels a few lines per step
// (stream_ahead; the 256-bit ones leave it to the hardware prefetcher). Asking
// for every row kPrefetchAhead ahead in one burst instead (as matvec_t does
// for float weights, whose cheap kernels outrun the hardware prefetcher:
// 4B-shaped BF16 39.3 against 25.4 GB/s without) costs the integer kernels
// issue slots they are short of:
// 4B-shaped decode at 2 threads, the two schedules alternating every 7
// products within one run, GB/s of the products, per-row -> first bytes only:
// Q4_K_M 49.4 -> 52.8 (--no-mmap) and 34.7 -> 38.6 (mapped), Q4_0 51.4 -> 54.2
// and 35.1 -> 39.6, Q8_0 53.3 -> 54.2.
template <class D>
void matvec_qa(const Mat& w, const uint8_t* a, float* y, int64_t r0, int64_t r1) {
  const auto* base = static_cast<const uint8_t*>(w.data);
  const uint64_t rb = qrow_bytes(w.dtype, w.cols);
  prefetch_run(base + r0 * rb, kStreamAhead, base + r1 * rb);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = base + r * rb;
    dot_rows<D, 1>(w.dtype, &row, a, w.cols, y + (r - r0));
  }
}

// ---------------------------------------------------------------------------
// Batched: a register-tiled integer GEMM.
//
// The row-by-row dot products above spend most of their instructions on what
// follows each dot instruction (lane sums, per-block float scaling), once per
// (weight row, input row). Here the accumulator lanes are weight rows instead:
// a panel of G::L rows x kKc columns is repacked once (on the stack, in L1)
// so that vector g holds columns 4g..4g+3 of every row of the panel, one dword
// per lane; the matching 4 input bytes are one broadcast dword. A block's dot
// products for all L rows are then 8 dot instructions into one accumulator,
// complete without any horizontal sum, and its scaling is one convert and two
// float ops for L rows at once. Each packed vector is reused for the NT input
// rows of a tile, and the panel for all T input rows. Every lane computes its
// (row, input) pair with the same operations whatever the lane, the tile or
// the chunk, so results do not depend on T or on how rows are split.
//
// G (per ISA: G256 below, G512 in kernels_avx512.cpp) gives the vector ops:
//   L lanes (int32/float), NT input rows per tile, kVnni;
//   dot4(acc, u, p): acc + per-lane sum of the 4 u8 of u times the 4 s8 at p
//     (broadcast); without VNNI, maddubs + madd, exact while u <= 128;
//   dot4s(acc, w, p): the same with s8 weights (Q8_0 without VNNI);
//   dot2w(acc, w, p): acc + the two int16 products of w's lane and the int16
//     pair at p (broadcast);
//   tr8 / tr4(rows, off, out): out[g] lane r = dword g of rows[r] + off.
namespace qg {

constexpr int kKc = 512;  // columns per packed chunk: 512 / 4 vectors of L dwords
constexpr int kTb = 64;   // input rows per pass over a panel (its sums stay in L1)

template <class G>
struct Panel {
  alignas(64) uint8_t u[kKc / 4][4 * G::L];  // unsigned codes, column group g, a dword per row
  alignas(64) int32_t sc[kKc / 16][G::L];    // K types: sub-block scales per row
  alignas(64) int32_t pr[kKc / 32][G::L];    // K types: int16 pairs (Q4_K/Q5_K mins, Q6_K -32*scales)
  alignas(64) float d[kKc / 32][G::L];       // weight scale per block (A32) or super-block (K)
  alignas(64) float dm[kKc / 256][G::L];     // Q4_K/Q5_K dmin per super-block
  // The panel's sums for kTb input rows across the chunks: y is written once
  // per panel (its rows are pages apart; touching them once per chunk cost a
  // quarter of the time at 7168 rows).
  alignas(64) float acc[kTb][G::L];
  // A short panel's chunk, copied with its last row repeated, so pack always
  // sees L rows at one stride.
  static constexpr int kTailStride = 576;  // >= the bytes of 512 columns of any type
  alignas(64) uint8_t tail[G::L][kTailStride];
};

template <int K, class G>
inline typename G::vi shl16v(typename G::vi v) {
  if constexpr (K > 0) return G::template slli16<K>(v);
  else if constexpr (K < 0) return G::template srli16<-K>(v);
  else return v;
}

inline uint16_t ld16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// Repacks kc columns (whole blocks) of the panel into P: row r's first block
// at p0 + r*stride. Scales come through one gather per block (lanes r*stride
// apart) and lane-wise bit operations, not per-row scalar code.
template <class G, DType Ty>
inline void pack(const uint8_t* p0, int64_t stride, int kc, Panel<G>& P) {
  using vi = typename G::vi;
  const vi m4 = G::set8(0x0F);
  const vi idx = G::row_index(stride);
  const vi lo16 = G::set32(0xFFFF);
  if constexpr (Ty == DType::Q8_0 || Ty == DType::Q4_0) {
    constexpr int kB = Ty == DType::Q8_0 ? 34 : 18;
    for (int b = 0; b < kc / 32; ++b) {
      const int64_t off = kB * b;
      vi z[8];
      if constexpr (Ty == DType::Q8_0) {
        G::tr8(p0 + off + 2, stride, z);
        // VNNI: w + 128 as the unsigned operand (b128 undoes it); else s8 as is.
        for (int g = 0; g < 8; ++g) G::store(P.u[8 * b + g], G::kVnni ? G::xor_(z[g], G::set8(-128)) : z[g]);
      } else {
        G::tr4(p0 + off + 2, stride, z);
        for (int g = 0; g < 4; ++g) {
          G::store(P.u[8 * b + g], G::and_(z[g], m4));
          G::store(P.u[8 * b + 4 + g], G::and_(G::template srli16<4>(z[g]), m4));
        }
      }
      G::storef_al(P.d[b], G::half_lo(G::gather(p0 + off, idx)));
    }
  } else if constexpr (Ty == DType::Q4_K || Ty == DType::Q5_K) {
    constexpr bool Q5 = Ty == DType::Q5_K;
    constexpr int kB = Q5 ? 176 : 144;
    const vi m10 = G::set8(0x10);
    for (int s = 0; s < kc / 256; ++s) {
      const uint8_t* q0 = p0 + kB * s;
      vi H[8];
      if constexpr (Q5) G::tr8(q0 + 16, stride, H);
      auto chunk = [&](auto cc) {
        constexpr int c = decltype(cc)::value;
        vi z[8];
        G::tr8(q0 + (Q5 ? 48 : 16) + 32 * c, stride, z);
        for (int g = 0; g < 8; ++g) {
          vi lo = G::and_(z[g], m4), hi = G::and_(G::template srli16<4>(z[g]), m4);
          if constexpr (Q5) {
            lo = G::or_(lo, G::and_(shl16v<4 - 2 * c, G>(H[g]), m10));
            hi = G::or_(hi, G::and_(shl16v<3 - 2 * c, G>(H[g]), m10));
          }
          G::store(P.u[64 * s + 16 * c + g], lo);
          G::store(P.u[64 * s + 16 * c + 8 + g], hi);
        }
      };
      chunk(std::integral_constant<int, 0>{});
      chunk(std::integral_constant<int, 1>{});
      chunk(std::integral_constant<int, 2>{});
      chunk(std::integral_constant<int, 3>{});
      // scale_min_k4 for 16 rows at once, on the three dwords of scales[12].
      const vi w0 = G::gather(q0 + 4, idx), w1 = G::gather(q0 + 8, idx), w2 = G::gather(q0 + 12, idx);
      const vi k3f = G::set32(0x3f3f3f3f), k0f = G::set32(0x0f0f0f0f), k30 = G::set32(0x30303030);
      const vi sc[2] = {G::and_(w0, k3f), G::or_(G::and_(w2, k0f), G::and_(G::template srli32<2>(w0), k30))};
      const vi mn[2] = {G::and_(w1, k3f),
                        G::or_(G::and_(G::template srli32<4>(w2), k0f), G::and_(G::template srli32<2>(w1), k30))};
      const vi ff = G::set32(0xFF);
      for (int h = 0; h < 2; ++h) {
        G::store(P.sc[8 * s + 4 * h + 0], G::and_(sc[h], ff));
        G::store(P.sc[8 * s + 4 * h + 1], G::and_(G::template srli32<8>(sc[h]), ff));
        G::store(P.sc[8 * s + 4 * h + 2], G::and_(G::template srli32<16>(sc[h]), ff));
        G::store(P.sc[8 * s + 4 * h + 3], G::template srli32<24>(sc[h]));
        // int16 pairs (m_2q, m_2q+1) from bytes 0,1 and 2,3 of the dword.
        const vi ff2 = G::set32(0xFF0000);
        G::store(P.pr[4 * s + 2 * h], G::or_(G::and_(mn[h], ff), G::and_(G::template slli32<8>(mn[h]), ff2)));
        G::store(P.pr[4 * s + 2 * h + 1],
                 G::or_(G::and_(G::template srli32<16>(mn[h]), ff), G::and_(G::template srli32<8>(mn[h]), ff2)));
      }
      const vi dd = G::gather(q0, idx);  // d | dmin << 16
      G::storef_al(P.d[s], G::half_lo(dd));
      G::storef_al(P.dm[s], G::half_lo(G::template srli32<16>(dd)));
    }
  } else {  // Q6_K
    const vi m30 = G::set8(0x30);
    for (int s = 0; s < kc / 256; ++s) {
      const uint8_t* q0 = p0 + 210 * s;
      for (int hh = 0; hh < 2; ++hh) {
        vi A[8], B[8], H[8];
        G::tr8(q0 + 64 * hh, stride, A);
        G::tr8(q0 + 64 * hh + 32, stride, B);
        G::tr8(q0 + 128 + 32 * hh, stride, H);
        for (int g = 0; g < 8; ++g) {
          G::store(P.u[64 * s + 32 * hh + g],
                   G::or_(G::and_(A[g], m4), G::and_(G::template slli16<4>(H[g]), m30)));
          G::store(P.u[64 * s + 32 * hh + 8 + g],
                   G::or_(G::and_(B[g], m4), G::and_(G::template slli16<2>(H[g]), m30)));
          G::store(P.u[64 * s + 32 * hh + 16 + g],
                   G::or_(G::and_(G::template srli16<4>(A[g]), m4), G::and_(H[g], m30)));
          G::store(P.u[64 * s + 32 * hh + 24 + g],
                   G::or_(G::and_(G::template srli16<4>(B[g]), m4), G::and_(G::template srli16<2>(H[g]), m30)));
        }
      }
      // The 16 int8 scales: byte i of dword k is sc[4k + i].
      for (int k = 0; k < 4; ++k) {
        const vi w = G::gather(q0 + 192 + 4 * k, idx);
        vi v[4];
        v[0] = G::template srai32<24>(G::template slli32<24>(w));
        v[1] = G::template srai32<24>(G::template slli32<16>(w));
        v[2] = G::template srai32<24>(G::template slli32<8>(w));
        v[3] = G::template srai32<24>(w);
        for (int i = 0; i < 4; ++i) G::store(P.sc[16 * s + 4 * k + i], v[i]);
        // int16 pairs (-32 sc_2q, -32 sc_2q+1), q = 2k, 2k + 1.
        for (int i = 0; i < 2; ++i) {
          const vi a = G::sub32(G::zero(), G::template slli32<5>(v[2 * i]));
          const vi c = G::sub32(G::zero(), G::template slli32<5>(v[2 * i + 1]));
          G::store(P.pr[8 * s + 2 * k + i], G::or_(G::and_(a, lo16), G::template slli32<16>(c)));
        }
      }
      // d is the last 2 bytes: the dword before it, so the gather stays inside the block.
      G::storef_al(P.d[s], G::half_lo(G::template srli32<16>(G::gather(q0 + 206, idx))));
    }
  }
}

// NT input rows, rows ts..ts+NT-1 of the batch group at grp, against the
// packed chunk at column c0; y[t * ldy + lane] holds the sums of the chunks
// before (unless first). Pointers advance one record per block, so every
// operand is a constant displacement off one of them.
template <class G, DType Ty, int NT>
inline void tile(const Panel<G>& P, int kc, int64_t c0, const uint8_t* grp, int ts, float* y, int64_t ldy,
                 int nr, bool first) {
  using vi = typename G::vi;
  using vf = typename G::vf;
  using BL = BatchLayout;
  vf f[NT];
  for (int t = 0; t < NT; ++t) f[t] = first ? G::zerof() : G::loadf(y + t * ldy, nr);
  if constexpr (Ty == DType::Q8_0 || Ty == DType::Q4_0) {
    constexpr bool Q8 = Ty == DType::Q8_0;
    const uint8_t* q = grp + BL::kRecA32 * (c0 / 32) + 32 * ts;  // qs of row ts
    const uint8_t* m = grp + BL::kRecA32 * (c0 / 32) + 4 * ts;   // + kA32d / kA32b8 / kA32b128
    for (int b = 0; b < kc / 32; ++b, q += BL::kRecA32, m += BL::kRecA32) {
      vi acc[NT];
      for (int t = 0; t < NT; ++t) {
        if constexpr (!Q8) acc[t] = G::bcast(m + BL::kA32b8 + 4 * t);
        else if constexpr (G::kVnni) acc[t] = G::bcast(m + BL::kA32b128 + 4 * t);
        else acc[t] = G::zero();
      }
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) {
        const vi u = G::load(P.u[8 * b + g]);
        for (int t = 0; t < NT; ++t) {
          if constexpr (Q8 && !G::kVnni) acc[t] = G::dot4s(acc[t], u, q + 32 * t + 4 * g);
          else acc[t] = G::dot4(acc[t], u, q + 32 * t + 4 * g);
        }
      }
      const vf dw = G::loadf_al(P.d[b]);
      for (int t = 0; t < NT; ++t)
        f[t] = G::fma(G::mul_b(G::cvt(acc[t]), reinterpret_cast<const float*>(m + BL::kA32d) + t), dw, f[t]);
    }
  } else if constexpr (Ty == DType::Q4_K || Ty == DType::Q5_K) {
    const uint8_t* q = grp + BL::kRecQ8K * (c0 / 256) + 256 * ts;
    const uint8_t* md = grp + BL::kRecQ8K * (c0 / 256) + BL::kKd + 4 * ts;
    const uint8_t* mb = grp + BL::kRecQ8K * (c0 / 256) + BL::kKb32 + 16 * ts;
    for (int s = 0; s < kc / 256; ++s, q += BL::kRecQ8K, md += BL::kRecQ8K, mb += BL::kRecQ8K) {
      vi is[NT];
      for (int t = 0; t < NT; ++t) is[t] = G::zero();
      for (int j = 0; j < 8; ++j) {
        vi dj[NT];
        for (int t = 0; t < NT; ++t) dj[t] = G::zero();
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) {
          const vi u = G::load(P.u[64 * s + 8 * j + g]);
          for (int t = 0; t < NT; ++t) dj[t] = G::dot4(dj[t], u, q + 256 * t + 32 * j + 4 * g);
        }
        const vi sc = G::load(P.sc[8 * s + j]);
        for (int t = 0; t < NT; ++t) is[t] = G::add(is[t], G::mullo(dj[t], sc));
      }
      vi mn[NT];
      for (int t = 0; t < NT; ++t) mn[t] = G::zero();
      for (int p = 0; p < 4; ++p) {
        const vi mv = G::load(P.pr[4 * s + p]);
        for (int t = 0; t < NT; ++t) mn[t] = G::dot2w(mn[t], mv, mb + 16 * t + 4 * p);
      }
      const vf d = G::loadf_al(P.d[s]), dm = G::loadf_al(P.dm[s]);
      for (int t = 0; t < NT; ++t) {
        const float* dx = reinterpret_cast<const float*>(md) + t;
        f[t] = G::fma(G::mul_b(G::cvt(is[t]), dx), d, f[t]);
        f[t] = G::fnma(G::mul_b(G::cvt(mn[t]), dx), dm, f[t]);
      }
    }
  } else {  // Q6_K
    const uint8_t* q = grp + BL::kRecQ8K * (c0 / 256) + 256 * ts;
    const uint8_t* md = grp + BL::kRecQ8K * (c0 / 256) + BL::kKd + 4 * ts;
    const uint8_t* mb = grp + BL::kRecQ8K * (c0 / 256) + BL::kKbs + 32 * ts;
    for (int s = 0; s < kc / 256; ++s, q += BL::kRecQ8K, md += BL::kRecQ8K, mb += BL::kRecQ8K) {
      vi is[NT];
      for (int t = 0; t < NT; ++t) is[t] = G::zero();
      // -32 * sum_k sc_k * bsum_k: the offset of every code, once per super-block.
      for (int p = 0; p < 8; ++p) {
        const vi mv = G::load(P.pr[8 * s + p]);
        for (int t = 0; t < NT; ++t) is[t] = G::dot2w(is[t], mv, mb + 32 * t + 4 * p);
      }
      for (int k = 0; k < 16; ++k) {
        vi dk[NT];
        for (int t = 0; t < NT; ++t) dk[t] = G::zero();
#pragma GCC unroll 4
        for (int g = 0; g < 4; ++g) {
          const vi u = G::load(P.u[64 * s + 4 * k + g]);
          for (int t = 0; t < NT; ++t) dk[t] = G::dot4(dk[t], u, q + 256 * t + 16 * k + 4 * g);
        }
        const vi sc = G::load(P.sc[16 * s + k]);
        for (int t = 0; t < NT; ++t) is[t] = G::add(is[t], G::mullo(dk[t], sc));
      }
      const vf d = G::loadf_al(P.d[s]);
      for (int t = 0; t < NT; ++t)
        f[t] = G::fma(G::mul_b(G::cvt(is[t]), reinterpret_cast<const float*>(md) + t), d, f[t]);
    }
  }
  for (int t = 0; t < NT; ++t) G::storef(y + t * ldy, f[t], nr);
}

// Runs f(integral_constant<K>, t) over [t0, t1) in tiles of NT inputs, then
// 4, 2, 1 (never across a batch group: kGT is a multiple of NT).
template <int NT, class F>
inline void for_tiles(int64_t t0, int64_t t1, F&& f) {
  int64_t t = t0;
  for (; t + NT <= t1; t += NT) f(std::integral_constant<int, NT>{}, t);
  if constexpr (NT > 4)
    if (t1 - t >= 4) {
      f(std::integral_constant<int, 4>{}, t);
      t += 4;
    }
  if (t1 - t >= 2) {
    f(std::integral_constant<int, 2>{}, t);
    t += 2;
  }
  if (t1 - t >= 1) f(std::integral_constant<int, 1>{}, t);
}

// T input rows in the batch form at xb; rows [r0, r1) of w. Per panel of L
// rows and block of kTb inputs: each 512-column chunk is packed once, then
// every tile of inputs runs over it, summing into P.acc; y is written at the end.
template <class G, DType Ty>
void gemm(const Mat& w, const uint8_t* xb, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  constexpr int L = G::L, NT = G::NT;
  static_assert(kGT % NT == 0, "tiles stay inside a batch group");
  const int64_t n = w.cols;
  const BatchLayout B(act_kind(Ty), n);
  const auto* base = static_cast<const uint8_t*>(w.data);
  const uint64_t rb = qrow_bytes(Ty, n);
  Panel<G> P;
  // The next chunk's weights (at the last chunk, the next panel's first) are
  // prefetched a slice per tile while this chunk computes: a panel's rows are
  // read ~0.5 KiB at a time, too short a run for the hardware prefetcher.
  const int be = act_kind(Ty) == kA32 ? 32 : 256;
  const int64_t bb = static_cast<int64_t>(qrow_bytes(Ty, be));
  for (int64_t p = r0; p < r1; p += L) {
    const int nr = static_cast<int>(r1 - p < L ? r1 - p : L);
    const uint8_t* prow = base + p * rb;
    for (int64_t t0 = 0; t0 < T; t0 += kTb) {
      const int64_t t1 = T - t0 < kTb ? T : t0 + kTb;
      int64_t tiles = 0;
      for_tiles<NT>(t0, t1, [&](auto, int64_t) { ++tiles; });
      for (int64_t c0 = 0; c0 < n; c0 += kKc) {
        const int kc = static_cast<int>(n - c0 < kKc ? n - c0 : kKc);
        const int64_t byte0 = c0 / be * bb;
        if (nr == L) {
          pack<G, Ty>(prow + byte0, static_cast<int64_t>(rb), kc, P);
        } else {
          // Lanes past nr repeat the last row; they are never stored.
          for (int i = 0; i < L; ++i)
            std::memcpy(P.tail[i], prow + (i < nr ? i : nr - 1) * rb + byte0, kc / be * bb);
          pack<G, Ty>(P.tail[0], Panel<G>::kTailStride, kc, P);
        }
        const uint8_t* pf = nullptr;
        int64_t pf_rows = 0, lo = 0, hi = 0;
        if (c0 + kc < n) {
          pf = prow, pf_rows = nr, lo = (c0 + kc) / be * bb;
          hi = (n - c0 - kc < kKc ? n : c0 + kc + kKc) / be * bb;
        } else if (p + L < r1 && t1 == T) {
          pf = base + (p + L) * rb, pf_rows = r1 - p - L < L ? r1 - p - L : L;
          hi = (n < kKc ? n : kKc) / be * bb;
        }
        const int64_t lpr = (hi - lo + 63) / 64 + 1, total = pf_rows * lpr;
        int64_t part = 0;
        for_tiles<NT>(t0, t1, [&](auto nt, int64_t t) {
          // This tile's share of the lines [a, b): one division per tile, not per line.
          const int64_t a = part * total / tiles, b = (part + 1) * total / tiles;
          const uint8_t* rowp = pf + (a / lpr) * rb + lo;
          for (int64_t l = a, li = a % lpr; l < b; ++l) {
            _mm_prefetch(reinterpret_cast<const char*>(rowp + li * 64), _MM_HINT_T1);
            if (++li == lpr) li = 0, rowp += rb;
          }
          ++part;
          tile<G, Ty, decltype(nt)::value>(P, kc, c0, xb + t / kGT * B.group, static_cast<int>(t % kGT),
                                           P.acc[t - t0], L, L, c0 == 0);
        });
      }
      for (int64_t t = t0; t < t1; ++t) G::storef(y + t * ldy + p, G::loadf_al(P.acc[t - t0]), nr);
    }
  }
}

// 256-bit vector ops for the GEMM over a dot policy D (kernels_avx2.cpp's).
template <class D>
struct G256 {
  static constexpr int L = 8;
  static constexpr int NT = 4;  // 16 registers: NT accumulators, NT float sums, operands
  static constexpr bool kVnni = D::kVnni;
  using vi = __m256i;
  using vf = __m256;
  static vi zero() { return _mm256_setzero_si256(); }
  static vf zerof() { return _mm256_setzero_ps(); }
  static vi load(const void* p) { return _mm256_load_si256(static_cast<const __m256i*>(p)); }
  static void store(void* p, vi v) { _mm256_store_si256(static_cast<__m256i*>(p), v); }
  static vi bcast(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
  }
  static vi set8(char c) { return _mm256_set1_epi8(c); }
  static vi and_(vi a, vi b) { return _mm256_and_si256(a, b); }
  static vi or_(vi a, vi b) { return _mm256_or_si256(a, b); }
  static vi xor_(vi a, vi b) { return _mm256_xor_si256(a, b); }
  template <int K>
  static vi srli16(vi v) { return _mm256_srli_epi16(v, K); }
  template <int K>
  static vi slli16(vi v) { return _mm256_slli_epi16(v, K); }
  static vi add(vi a, vi b) { return _mm256_add_epi32(a, b); }
  static vi mullo(vi a, vi b) { return _mm256_mullo_epi32(a, b); }
  static vi dot4(vi acc, vi u, const void* p) {
    if constexpr (kVnni) return D::dpbusd(acc, u, bcast(p));
    else return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, bcast(p)), _mm256_set1_epi16(1)));
  }
  static vi dot4s(vi acc, vi w, const void* p) {
    const vi s = _mm256_sign_epi8(bcast(p), w);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), s), _mm256_set1_epi16(1)));
  }
  static vi dot2w(vi acc, vi w, const void* p) {
    if constexpr (kVnni) return D::dpwssd(acc, w, bcast(p));
    else return _mm256_add_epi32(acc, _mm256_madd_epi16(w, bcast(p)));
  }
  static vf cvt(vi v) { return _mm256_cvtepi32_ps(v); }
  static vf mul_b(vf a, const float* p) { return _mm256_mul_ps(a, _mm256_broadcast_ss(p)); }
  static vf fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
  static vf fnma(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
  static vf cvtph(const uint16_t* h) { return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h))); }
  static vf loadf_al(const float* p) { return _mm256_load_ps(p); }
  static void storef_al(float* p, vf v) { _mm256_store_ps(p, v); }
  static __m256i lanes(int n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
  static vf loadf(const float* p, int n) { return n == L ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lanes(n)); }
  static void storef(float* p, vf v, int n) {
    if (n == L) _mm256_storeu_ps(p, v);
    else _mm256_maskstore_ps(p, lanes(n), v);
  }
  static vi set32(int32_t v) { return _mm256_set1_epi32(v); }
  static vi sub32(vi a, vi b) { return _mm256_sub_epi32(a, b); }
  template <int K>
  static vi srli32(vi v) { return _mm256_srli_epi32(v, K); }
  template <int K>
  static vi slli32(vi v) { return _mm256_slli_epi32(v, K); }
  template <int K>
  static vi srai32(vi v) { return _mm256_srai_epi32(v, K); }
  static vi row_index(int64_t stride) {
    return _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(static_cast<int>(stride)));
  }
  static vi gather(const uint8_t* p, vi idx) { return _mm256_i32gather_epi32(reinterpret_cast<const int*>(p), idx, 1); }
  // The halves in the low 16 bits of each lane, to float.
  static vf half_lo(vi v) {
    const __m256i k = _mm256_packus_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_setzero_si256());
    return _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(k, 0x08)));
  }
  // 8 rows (stride apart) x 8 dwords at p -> out[g] = dword g of every row.
  static void tr8(const uint8_t* p, int64_t stride, vi* out) {
    vi r[8], t[8], u[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i * stride));
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {
      u[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
      u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
      u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
      u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int g = 0; g < 4; ++g) {
      out[g] = _mm256_permute2x128_si256(u[g], u[4 + g], 0x20);
      out[g + 4] = _mm256_permute2x128_si256(u[g], u[4 + g], 0x31);
    }
  }
  // 8 rows x 4 dwords -> out[0..3].
  static void tr4(const uint8_t* p, int64_t stride, vi* out) {
    vi z[4];
    for (int i = 0; i < 4; ++i)
      z[i] = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + (i + 4) * stride)),
                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i * stride)));
    const vi t0 = _mm256_unpacklo_epi32(z[0], z[1]), t1 = _mm256_unpackhi_epi32(z[0], z[1]);
    const vi t2 = _mm256_unpacklo_epi32(z[2], z[3]), t3 = _mm256_unpackhi_epi32(z[2], z[3]);
    out[0] = _mm256_unpacklo_epi64(t0, t2);
    out[1] = _mm256_unpackhi_epi64(t0, t2);
    out[2] = _mm256_unpacklo_epi64(t1, t3);
    out[3] = _mm256_unpackhi_epi64(t1, t3);
  }
};

}  // namespace qg

template <class D>
void matmat_qa(const Mat& w, const uint8_t* xb, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  if (r1 <= r0 || T <= 0) return;
  using G = typename D::G;
  switch (w.dtype) {
    case DType::Q8_0: return qg::gemm<G, DType::Q8_0>(w, xb, T, y, ldy, r0, r1);
    case DType::Q4_0: return qg::gemm<G, DType::Q4_0>(w, xb, T, y, ldy, r0, r1);
    case DType::Q4_K: return qg::gemm<G, DType::Q4_K>(w, xb, T, y, ldy, r0, r1);
    case DType::Q5_K: return qg::gemm<G, DType::Q5_K>(w, xb, T, y, ldy, r0, r1);
    case DType::Q6_K: return qg::gemm<G, DType::Q6_K>(w, xb, T, y, ldy, r0, r1);
    default: return;
  }
}

inline uint64_t act_row_bytes(DType t, int64_t n) { return ActLayout(act_kind(t), n).bytes; }

inline void quantize_act_row(DType t, const float* x, int64_t n, uint8_t* out) {
  quantize_act(act_kind(t), x, n, out);
}

// Float weights: 0, their batches take the float input (matmat).
inline uint64_t batch_bytes(DType t, int64_t T, int64_t n) {
  return t >= DType::Q8_0 ? BatchLayout(act_kind(t), n).bytes(T) : 0;
}

inline void quantize_batch(DType t, const float* x, int64_t ldx, int64_t n, int64_t t0, int64_t t1, uint8_t* out) {
  quantize_batch_rows(act_kind(t), x, ldx, n, t0, t1, out);
}

}  // namespace qk

// A kernel set: the float kernels of kernels_simd.h over V, the integer-dot
// kernels above over D.
template <class V, class D>
void matvec_all(const Mat& w, const float* x, float* y, int64_t r0, int64_t r1) {
  if (w.dtype >= DType::Q8_0) {
    qk::matvec_qa<D>(w, qk::quantized_input<D>(w.dtype, x, 1, w.cols, w.cols), y, r0, r1);
  } else {
    matvec_t<V>(w, x, y, r0, r1);
  }
}

template <class V, class D>
void matmat_all(const Mat& w, const float* x, int64_t T, int64_t ldx, float* y, int64_t ldy, int64_t r0,
                int64_t r1) {
  if (w.dtype >= DType::Q8_0) {
    const uint8_t* xq = qk::quantized_input<D>(w.dtype, x, T, ldx, w.cols);
    if (T == 1) qk::matvec_qa<D>(w, xq, y + r0, r0, r1);
    else qk::matmat_qa<D>(w, xq, T, y, ldy, r0, r1);
  } else {
    matmat_t<V>(w, x, T, ldx, y, ldy, r0, r1);
  }
}

template <class V>
void to_f32_all(DType t, const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  if (t >= DType::Q8_0) qk::dequant_blocks(t, p, dst, n / (t == DType::Q8_0 || t == DType::Q4_0 ? 32 : 256));
  else to_f32<V>(t, p, dst, n);
}

template <class V, class D>
constexpr KernelSet make_qset(const char* name) {
  return KernelSet{name,
                   matvec_all<V, D>,
                   matmat_all<V, D>,
                   dot_t<V>,
                   axpy_t<V>,
                   to_f32_all<V>,
                   qk::act_row_bytes,
                   qk::quantize_act_row,
                   qk::matvec_qa<D>,
                   qk::batch_bytes,
                   qk::quantize_batch,
                   qk::matmat_qa<D>,
                   attn_scores_t<V>,
                   attn_values_t<V>,
                   sigmoid_t<V>,
                   false};
}

}  // namespace
}  // namespace dory::kern
