// The SIMD kernels, written once over a vector-traits type V and instantiated
// per ISA in kernels_avx2.cpp / kernels_avx512.cpp. Everything here sits in an
// unnamed namespace: each ISA's copy must stay private to its own translation
// unit, or the linker could hand AVX-512 code to a CPU without it. For the same
// reason this file calls no inline function shared with other files.
#pragma once
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "tensor/kernels.h"

namespace dory::kern {
namespace {

inline float scalar_w(DType d, const uint8_t* p, int64_t i) {
  if (d == DType::F32) {
    float f;
    std::memcpy(&f, p + i * 4, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p + i * 2, 2);
  if (d == DType::BF16) {
    uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  // IEEE half: handled by the vector path for all full blocks; tails here.
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
  if (exp == 0) {
    float f = static_cast<float>(man) * (1.0f / 16777216.0f);  // subnormal: man * 2^-24
    std::memcpy(&u, &f, 4);
    u |= sign;
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <class V>
inline typename V::reg load_w(DType d, const uint8_t* p) {
  if (d == DType::F32) return V::load_f32(reinterpret_cast<const float*>(p));
  if (d == DType::BF16) return V::load_bf16(p);
  return V::load_f16(p);
}

// out[i] = rows[i] . x over n columns, for R rows that share each x load.
template <class V, int R>
inline void rows_dot(DType d, const uint8_t* const* rows, const float* x, int64_t n, float* out) {
  constexpr int W = V::W;
  const int es = d == DType::F32 ? 4 : 2;
  typename V::reg acc[R];
  for (int i = 0; i < R; ++i) acc[i] = V::zero();
  int64_t c = 0;
  for (; c + W <= n; c += W) {
    const typename V::reg xv = V::load_f32(x + c);
    for (int i = 0; i < R; ++i) acc[i] = V::fma(load_w<V>(d, rows[i] + c * es), xv, acc[i]);
  }
  for (int i = 0; i < R; ++i) {
    float s = V::hsum(acc[i]);
    for (int64_t cc = c; cc < n; ++cc) s += scalar_w(d, rows[i], cc) * x[cc];
    out[i] = s;
  }
}

// Weight rows are read as one stream per task, asking for the lines kPrefetchAhead
// bytes ahead of the row being computed: a steady distance keeps a constant
// number of lines in flight (float: 4096x2560 BF16 at 2 threads 26.6 -> 33.8 GB/s
// against 4 rows at a time with no prefetch; quantized: 24 Q4_0 / 12 Q8_0
// 4096x2560 matrices, median of 15 interleaved passes, Q4_0 24.2 -> 30.7 and Q8_0
// 28.3 -> 36.7 GB/s against next-4-rows bursts; 2-8 KiB within a few %, L2 hints
// slower; the integer kernels have since become heavier per byte, and
// qk::matvec_qa now asks for a task's first kStreamAhead bytes, the AVX-512
// row kernels for the rest a few lines per step: see stream_ahead).
// prefetch_run asks for the lines of [p, p + len) that lie before end.
constexpr int64_t kPrefetchAhead = 4096;
inline void prefetch_run(const uint8_t* p, int64_t len, const uint8_t* end) {
  for (int64_t i = 0; i < len && p + i < end; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T0);
}

// The integer row kernels' weights, asked for into L2 kStreamAhead bytes
// ahead of where the kernel reads: at each step of its loop (Bytes: what the
// step reads), the lines that start in [p, p + Bytes) + kStreamAhead. A few
// prefetches among ~20 vector operations a step; they help where the
// hardware prefetcher alone falls behind, which on the build machine (a
// shared VM) comes and goes: 4B-shaped Q4_0 decode at 2 threads, with and
// without alternating every 7 products in one run, GB/s of all products, in
// one half hour 48.6 -> 52.7, 47.6 -> 52.2, 51.7 -> 56.3, 52.5 -> 56.3 (6 KiB
// ahead 49.2 -> 52.0, 49.8 -> 52.5; 12 KiB 49.0 -> 52.6, 50.9 -> 54.6; 24 KiB
// 50.5 -> 50.3), in the next hour 51.1 -> 51.2, 43.7 -> 45.3, 45.2 -> 45.0,
// 48.6 -> 49.6 (Q4_K_M 47.8 -> 47.9, 39.3 -> 39.6, 45.4 -> 45.6; Q8_0 50.1 ->
// 50.7, 45.6 -> 45.8), and alternating every 4 tokens instead (so that one
// form's prefetches do not feed the other's products) 53.6 -> 54.1, 50.3 ->
// 50.5, 46.7 -> 46.9, 38.7 -> 38.9 (Q4_K_M 48.2 -> 48.5, 49.1 -> 49.2).
// Never slower beyond the noise; as much as 9% faster. Each line once and
// spread out: a burst of a row's lines at each row (as prefetch_run) measured
// 5% slower, nine lines at once per four Q4_K super-blocks 13% slower.
// Hint: T1, or NTA for the K types' rows (k45_row512*, q6k_row512), which
// then stream faster and the others slower (the same alternation, all products'
// GB/s, T1 -> NTA: Q4_K_M 40.4 -> 43.6, 48.0 -> 49.2, 46.6 -> 48.6, 48.6 ->
// 50.4, 44.9 -> 46.7, and with NTA in the K rows only 49.4 -> 51.4, 50.2 ->
// 52.7, 50.9 -> 50.8, 49.8 -> 52.3; Q4_0 45.5 -> 45.6, 44.6 -> 45.3, 41.7 ->
// 41.6, 39.5 -> 39.9; Q8_0 41.3 -> 39.0, 39.8 -> 38.2, 38.1 -> 36.3, 41.1 -> 39.5).
constexpr int64_t kStreamAhead = 8192;
template <int Bytes, int Hint = _MM_HINT_T1>
inline void stream_ahead(const uint8_t* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) + kStreamAhead;
  for (uintptr_t l = (a + 63) & ~uintptr_t{63}; l < a + Bytes; l += 64)
    _mm_prefetch(reinterpret_cast<const char*>(l), static_cast<_mm_hint>(Hint));
}

// Float weight rows [r0, r1) two at a time (the last one alone when the count
// is odd): f(rows, two, r) with rows[0] = row r (and rows[1] = row r + 1 when
// two), each pair's lines asked for kPrefetchAhead ahead. Each row's sum is one
// chain of FMAs, so one row at a time waits on the FMA latency: bench_kernels
// 4096x2560 BF16 matvec, one thread, matvec_hot 20.1-23.4 -> 34.5-35.2 GB/s and
// matvec_dram 19.1-21.9 -> 28.9-29.7 with two. Four rows measured slower than
// one from memory (four streams per thread).
template <class F>
inline void for_row_pairs(const Mat& w, int64_t r0, int64_t r1, F&& f) {
  const int es = w.dtype == DType::F32 ? 4 : 2;
  const auto* base = static_cast<const uint8_t*>(w.data);
  const int64_t stride = w.cols * es;
  const uint8_t* end = base + r1 * stride;
  prefetch_run(base + r0 * stride, kPrefetchAhead, end);
  for (int64_t r = r0; r < r1; r += 2) {
    const bool two = r + 1 < r1;
    const uint8_t* rows[2] = {base + r * stride, two ? base + (r + 1) * stride : nullptr};
    prefetch_run(rows[0] + kPrefetchAhead, 2 * stride, end);
    f(rows, two, r);
  }
}

// A row's bits do not depend on the pairing (its own chain, in the same
// order), so they are matmat_few_t's.
template <class V>
void matvec_t(const Mat& w, const float* x, float* y, int64_t r0, int64_t r1) {
  for_row_pairs(w, r0, r1, [&](const uint8_t* const* rows, bool two, int64_t r) {
    if (two) rows_dot<V, 2>(w.dtype, rows, x, w.cols, y + (r - r0));
    else rows_dot<V, 1>(w.dtype, rows, x, w.cols, y + (r - r0));
  });
}

// Converts n weights to float.
template <class V>
inline void to_f32(DType d, const uint8_t* p, float* out, int64_t n) {
  const int es = d == DType::F32 ? 4 : 2;
  int64_t i = 0;
  for (; i + V::W <= n; i += V::W) V::store(out + i, load_w<V>(d, p + i * es));
  for (; i < n; ++i) out[i] = scalar_w(d, p, i);
}

// y_t[i] = rows[i] . x_t for R weight rows and NT activation rows (x_t at
// x + t*ldx, y_t[i] at y + t*ldy + i): each weight vector is loaded and
// converted once for all NT rows. Per (row, t) the sums run as rows_dot's, so
// a row comes out with the same bits as matvec's.
template <class V, int R, int NT>
inline void rows_dot_nt(DType d, const uint8_t* const* rows, const float* x, int64_t ldx, int64_t n, float* y,
                        int64_t ldy) {
  constexpr int W = V::W;
  const int es = d == DType::F32 ? 4 : 2;
  typename V::reg acc[NT][R];
  for (int t = 0; t < NT; ++t)
    for (int i = 0; i < R; ++i) acc[t][i] = V::zero();
  int64_t c = 0;
  for (; c + W <= n; c += W) {
    typename V::reg wv[R];
    for (int i = 0; i < R; ++i) wv[i] = load_w<V>(d, rows[i] + c * es);
    for (int t = 0; t < NT; ++t) {
      const typename V::reg xv = V::load_f32(x + t * ldx + c);
      for (int i = 0; i < R; ++i) acc[t][i] = V::fma(wv[i], xv, acc[t][i]);
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int i = 0; i < R; ++i) {
      float s = V::hsum(acc[t][i]);
      for (int64_t cc = c; cc < n; ++cc) s += scalar_w(d, rows[i], cc) * x[t * ldx + cc];
      y[t * ldy + i] = s;
    }
}

// A few activation rows (decode of a few sessions together): two weight rows at
// a time against up to 4 activation rows, straight from the weights (the
// blocked path below pays a conversion to float that only many rows amortize).
template <class V>
void matmat_few_t(const Mat& w, const float* x, int64_t T, int64_t ldx, float* y, int64_t ldy, int64_t r0,
                  int64_t r1) {
  const int64_t n = w.cols;
  for_row_pairs(w, r0, r1, [&](const uint8_t* const* rows, bool two, int64_t r) {
    // NT activation rows at once (4, then 2, then 1), against one or two weight rows.
    auto step = [&](int64_t t, auto nt) {
      constexpr int NT = decltype(nt)::value;
      if (two) rows_dot_nt<V, 2, NT>(w.dtype, rows, x + t * ldx, ldx, n, y + t * ldy + r, ldy);
      else rows_dot_nt<V, 1, NT>(w.dtype, rows, x + t * ldx, ldx, n, y + t * ldy + r, ldy);
      return NT;
    };
    for (int64_t t = 0; t < T;)
      t += T - t >= 4 ? step(t, std::integral_constant<int, 4>{})
           : T - t >= 2 ? step(t, std::integral_constant<int, 2>{})
                        : step(t, std::integral_constant<int, 1>{});
  });
}

// The driver of the panel GEMMs (the float one below, avx512bf16's in
// kernels_avx512.cpp): the accumulator lanes are weight rows, as in the integer
// GEMM (kernels_quant_simd.h). Rows [r0, r1) go in panels of K::L = 2W rows;
// each chunk of K::kKc columns is packed once (K::pack: transposed, P.w[j] =
// column or column pair j of the panel's rows) and every tile of input rows runs
// over it (K::tile, K::kNT rows, then 4, then 1: per packed column two panel
// vectors, one broadcast input per row, no horizontal sums). The panel's sums
// for all T inputs live in a per-thread buffer across the chunks (y's rows are
// ldy apart), and y is written once per panel. Each (row, input) sum is one
// chain over the columns in order, whatever the lane, the tile or the split of
// rows. x: the inputs in K's form, row t at x + t*ldx, column c at K::at(c).
template <class V, class K>
void panel_gemm(const Mat& w, const typename K::In* x, int64_t ldx, int64_t T, float* y, int64_t ldy, int64_t r0,
                int64_t r1) {
  constexpr int W = V::W, L = K::L, NT = K::kNT;
  static_assert(L == 2 * W, "a panel is two vectors of lanes");
  typename K::Panel P;
  thread_local AlignedBuf accbuf;  // the panel's sums, T x L floats
  float* acc = reinterpret_cast<float*>(accbuf.get(static_cast<uint64_t>(T) * L * 4));
  const int64_t n = w.cols;
  for (int64_t p = r0; p < r1; p += L) {
    const int nr = static_cast<int>(r1 - p < L ? r1 - p : L);
    for (int64_t c0 = 0; c0 < n; c0 += K::kKc) {
      const int kc = static_cast<int>(n - c0 < K::kKc ? n - c0 : K::kKc);
      K::pack(w, p, nr, c0, kc, P);
      const bool first = c0 == 0;
      const typename K::In* xc = x + K::at(c0);
      int64_t t = 0;
      for (; t + NT <= T; t += NT) K::template tile<NT>(P, kc, xc + t * ldx, ldx, acc + t * L, first);
      for (; t + 4 <= T; t += 4) K::template tile<4>(P, kc, xc + t * ldx, ldx, acc + t * L, first);
      for (; t < T; ++t) K::template tile<1>(P, kc, xc + t * ldx, ldx, acc + t * L, first);
    }
    for (int64_t t = 0; t < T; ++t)
      for (int h = 0; h < L; h += W) {
        const int m = nr - h < W ? nr - h : W;  // lanes of this half that are rows
        if (m == W) V::store(y + t * ldy + p + h, V::load_f32(acc + t * L + h));
        else if (m > 0) V::store_n(y + t * ldy + p + h, V::load_f32(acc + t * L + h), m);
      }
  }
}

// Batched product on float weights (T >= kMatmatFewRows): panel_gemm over
// chunks of 256 columns converted to float and transposed W x W in registers,
// tiles of V::kGemmNT input rows (2*NT FMA accumulators). Below
// kMatmatFewRows rows, matmat_few_t.
template <class V>
struct FloatGemm {
  using In = float;
  static constexpr int L = 2 * V::W, kKc = 256, kNT = V::kGemmNT;  // a panel: 32 KiB at W = 16
  struct Panel {
    alignas(64) float w[kKc][L];
  };
  static int64_t at(int64_t c) { return c; }

  // Rows [p, p + nr) x columns [c0, c0 + kc) of w into P; lanes past nr are zero.
  static void pack(const Mat& w, int64_t p, int nr, int64_t c0, int kc, Panel& P) {
    constexpr int W = V::W;
    const int es = w.dtype == DType::F32 ? 4 : 2;
    const auto* base = static_cast<const uint8_t*>(w.data);
    const uint8_t* rows[L];
    for (int i = 0; i < L; ++i) rows[i] = i < nr ? base + ((p + i) * w.cols + c0) * es : nullptr;
    int k = 0;
    for (; k + W <= kc; k += W)
      for (int h = 0; h < L; h += W) {
        typename V::reg r[W];
        for (int i = 0; i < W; ++i) r[i] = rows[h + i] ? load_w<V>(w.dtype, rows[h + i] + k * es) : V::zero();
        V::transpose(r);
        for (int j = 0; j < W; ++j) V::store(P.w[k + j] + h, r[j]);
      }
    for (; k < kc; ++k)
      for (int i = 0; i < L; ++i) P.w[k][i] = rows[i] ? scalar_w(w.dtype, rows[i], k) : 0.0f;
  }

  // NT input rows (row t at x + t*ldx, from the chunk's first column) against
  // the packed chunk; acc[t] (L floats) holds the sums of the chunks before
  // (unless first).
  template <int NT>
  static void tile(const Panel& P, int kc, const float* x, int64_t ldx, float* acc, bool first) {
    constexpr int W = V::W;
    using R = typename V::reg;
    R a0[NT], a1[NT];
    for (int t = 0; t < NT; ++t) {
      a0[t] = first ? V::zero() : V::load_f32(acc + t * L);
      a1[t] = first ? V::zero() : V::load_f32(acc + t * L + W);
    }
    for (int k = 0; k < kc; ++k) {
      const R w0 = V::load_f32(P.w[k]), w1 = V::load_f32(P.w[k] + W);
      for (int t = 0; t < NT; ++t) {
        const R xb = V::set1(x[t * ldx + k]);
        a0[t] = V::fma(w0, xb, a0[t]);
        a1[t] = V::fma(w1, xb, a1[t]);
      }
    }
    for (int t = 0; t < NT; ++t) {
      V::store(acc + t * L, a0[t]);
      V::store(acc + t * L + W, a1[t]);
    }
  }
};

template <class V>
void matmat_t(const Mat& w, const float* x, int64_t T, int64_t ldx, float* y, int64_t ldy,
              int64_t r0, int64_t r1) {
  if (T < kMatmatFewRows) return matmat_few_t<V>(w, x, T, ldx, y, ldy, r0, r1);
  panel_gemm<V, FloatGemm<V>>(w, x, ldx, T, y, ldy, r0, r1);
}

template <class V>
float dot_t(const float* a, const float* b, int64_t n) {
  const uint8_t* row = reinterpret_cast<const uint8_t*>(a);
  float out;
  rows_dot<V, 1>(DType::F32, &row, b, n, &out);
  return out;
}

template <class V>
void axpy_t(float a, const float* x, float* y, int64_t n) {
  const typename V::reg av = V::set1(a);
  int64_t i = 0;
  for (; i + V::W <= n; i += V::W) V::store(y + i, V::fma(av, V::load_f32(x + i), V::load_f32(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

// exp(x) for x clamped to [-87, 88] (so 2^k stays a normal float): x = k ln2 +
// r with |r| <= ln2/2 (ln2 in two parts, so r is exact to a float), e^r by
// Cephes expf's degree-7 minimax polynomial (about 1 ulp), times 2^k. NaN stays NaN.
template <class V>
inline typename V::reg exp_t(typename V::reg x) {
  using R = typename V::reg;
  x = V::max(V::set1(-87.0f), V::min(V::set1(88.0f), x));
  const R k = V::round(V::mul(x, V::set1(1.44269504088896341f)));
  R r = V::fma(k, V::set1(-0.693359375f), x);
  r = V::fma(k, V::set1(2.12194440e-4f), r);
  R p = V::set1(1.9875691500e-4f);
  p = V::fma(p, r, V::set1(1.3981999507e-3f));
  p = V::fma(p, r, V::set1(8.3334519073e-3f));
  p = V::fma(p, r, V::set1(4.1665795894e-2f));
  p = V::fma(p, r, V::set1(1.6666665459e-1f));
  p = V::fma(p, r, V::set1(5.0000001201e-1f));
  p = V::fma(p, V::mul(r, r), V::add(r, V::set1(1.0f)));
  return V::mul(p, V::pow2i(k));
}

// out = 1 / (1 + exp(-x * s)), W at a time (the tail masked / through a buffer).
template <class V>
void sigmoid_t(const float* x, const float* s, float* out, int64_t n) {
  using R = typename V::reg;
  const R one = V::set1(1.0f), neg = V::set1(-1.0f);
  auto f = [&](R xv, R sv) { return V::div(one, V::add(one, exp_t<V>(V::mul(V::mul(xv, sv), neg)))); };
  int64_t i = 0;
  for (; i + V::W <= n; i += V::W) V::store(out + i, f(V::load_f32(x + i), V::load_f32(s + i)));
  if (i < n) V::store_n(out + i, f(V::load_n(x + i, n - i), V::load_n(s + i, n - i)), n - i);
}

// Scores for NI query heads x 4 keys at a time: 4*NI accumulators, each key row
// loaded once per vector for all heads.
template <class V, int NI>
inline void attn_scores_heads(const float* q, const float* k, int64_t stride, int64_t n, int64_t hd, float* s,
                              int64_t lds) {
  constexpr int W = V::W;
  const int64_t hv = hd / W * W;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    typename V::reg acc[NI][4];
    for (int i = 0; i < NI; ++i)
      for (int c = 0; c < 4; ++c) acc[i][c] = V::zero();
    for (int64_t d = 0; d < hv; d += W) {
      typename V::reg kv[4];
      for (int c = 0; c < 4; ++c) kv[c] = V::load_f32(k + (j + c) * stride + d);
      for (int i = 0; i < NI; ++i) {
        const typename V::reg qv = V::load_f32(q + i * hd + d);
        for (int c = 0; c < 4; ++c) acc[i][c] = V::fma(qv, kv[c], acc[i][c]);
      }
    }
    for (int i = 0; i < NI; ++i)
      for (int c = 0; c < 4; ++c) {
        float v = V::hsum(acc[i][c]);
        for (int64_t d = hv; d < hd; ++d) v += q[i * hd + d] * k[(j + c) * stride + d];
        s[i * lds + j + c] = v;
      }
  }
  for (; j < n; ++j)
    for (int i = 0; i < NI; ++i) {
      const uint8_t* row = reinterpret_cast<const uint8_t*>(k + j * stride);
      float v;
      rows_dot<V, 1>(DType::F32, &row, q + i * hd, hd, &v);
      s[i * lds + j] = v;
    }
}

template <class V>
void attn_scores_t(const float* q, int nq, const float* k, int64_t stride, int64_t n, int64_t hd, float* s,
                   int64_t lds) {
  int i = 0;
  for (; i + 4 <= nq; i += 4) attn_scores_heads<V, 4>(q + i * hd, k, stride, n, hd, s + i * lds, lds);
  for (; i + 2 <= nq; i += 2) attn_scores_heads<V, 2>(q + i * hd, k, stride, n, hd, s + i * lds, lds);
  for (; i < nq; ++i) attn_scores_heads<V, 1>(q + i * hd, k, stride, n, hd, s + i * lds, lds);
}

// Values for NI heads over a block of 4 vectors of dims: 4*NI accumulators stay in
// registers across all n rows.
template <class V, int NI>
inline void attn_values_heads(const float* w, int64_t ldw, const float* v, int64_t stride, int64_t n, int64_t hd,
                              float* out, bool add) {
  constexpr int W = V::W;
  int64_t d0 = 0;
  for (; d0 + 4 * W <= hd; d0 += 4 * W) {
    typename V::reg acc[NI][4];
    for (int i = 0; i < NI; ++i)
      for (int c = 0; c < 4; ++c) acc[i][c] = add ? V::load_f32(out + i * hd + d0 + c * W) : V::zero();
    for (int64_t j = 0; j < n; ++j) {
      typename V::reg vv[4];
      for (int c = 0; c < 4; ++c) vv[c] = V::load_f32(v + j * stride + d0 + c * W);
      for (int i = 0; i < NI; ++i) {
        const typename V::reg wb = V::set1(w[i * ldw + j]);
        for (int c = 0; c < 4; ++c) acc[i][c] = V::fma(wb, vv[c], acc[i][c]);
      }
    }
    for (int i = 0; i < NI; ++i)
      for (int c = 0; c < 4; ++c) V::store(out + i * hd + d0 + c * W, acc[i][c]);
  }
  for (; d0 < hd; ++d0)  // the dims past the last whole block
    for (int i = 0; i < NI; ++i) {
      float a = add ? out[i * hd + d0] : 0.0f;
      for (int64_t j = 0; j < n; ++j) a += w[i * ldw + j] * v[j * stride + d0];
      out[i * hd + d0] = a;
    }
}

template <class V>
void attn_values_t(const float* w, int64_t ldw, int nq, const float* v, int64_t stride, int64_t n, int64_t hd,
                   float* out, bool add) {
  int i = 0;
  for (; i + 4 <= nq; i += 4) attn_values_heads<V, 4>(w + i * ldw, ldw, v, stride, n, hd, out + i * hd, add);
  for (; i + 2 <= nq; i += 2) attn_values_heads<V, 2>(w + i * ldw, ldw, v, stride, n, hd, out + i * hd, add);
  for (; i < nq; ++i) attn_values_heads<V, 1>(w + i * ldw, ldw, v, stride, n, hd, out + i * hd, add);
}

}  // namespace
}  // namespace dory::kern
