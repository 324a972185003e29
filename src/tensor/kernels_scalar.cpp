// The reference kernels: plain loops, any x86-64. Every SIMD set is tested
// against these.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "tensor/kernels.h"
#include "tensor/quant.h"

namespace dory {
namespace quant {

namespace {
float half(const void* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}
}  // namespace

float dot_q8_0(const void* w, const int8_t* qs, const float* d, int64_t nb) {
  const auto* x = static_cast<const block_q8_0*>(w);
  float s = 0;
  for (int64_t b = 0; b < nb; ++b) {
    int isum = 0;
    for (int j = 0; j < 32; ++j) isum += x[b].qs[j] * qs[32 * b + j];
    s += half(&x[b].d) * d[b] * static_cast<float>(isum);
  }
  return s;
}

float dot_q4_0(const void* w, const int8_t* qs, const float* d, int64_t nb) {
  const auto* x = static_cast<const block_q4_0*>(w);
  float s = 0;
  for (int64_t b = 0; b < nb; ++b) {
    int isum = 0;
    for (int j = 0; j < 16; ++j)
      isum += ((x[b].qs[j] & 0xF) - 8) * qs[32 * b + j] + ((x[b].qs[j] >> 4) - 8) * qs[32 * b + j + 16];
    s += half(&x[b].d) * d[b] * static_cast<float>(isum);
  }
  return s;
}

namespace {
// Q4_K / Q5_K: sum over sub-blocks of sc * (q . a) and of m * (sum of a).
float dot_k45(const uint16_t* dd, const uint8_t* scales, const uint8_t* qh, const uint8_t* qs,
              const block_q8_K& a) {
  int isum = 0, imin = 0;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    scale_min_k4(j, scales, &sc, &m);
    const int c = j / 2, hi = j % 2;
    int dot = 0;
    for (int l = 0; l < 32; ++l) {
      int q = hi ? qs[32 * c + l] >> 4 : qs[32 * c + l] & 0xF;
      if (qh) q += ((qh[l] >> j) & 1) << 4;
      dot += q * a.qs[32 * j + l];
    }
    isum += sc * dot;
    imin += m * (a.bsums[2 * j] + a.bsums[2 * j + 1]);
  }
  return f16_to_f32(dd[0]) * a.d * static_cast<float>(isum) -
         f16_to_f32(dd[1]) * a.d * static_cast<float>(imin);
}
}  // namespace

float dot_q4_K(const void* w, const block_q8_K* a, int64_t nb) {
  const auto* x = static_cast<const block_q4_K*>(w);
  float s = 0;
  for (int64_t b = 0; b < nb; ++b) s += dot_k45(&x[b].d, x[b].scales, nullptr, x[b].qs, a[b]);
  return s;
}

float dot_q5_K(const void* w, const block_q8_K* a, int64_t nb) {
  const auto* x = static_cast<const block_q5_K*>(w);
  float s = 0;
  for (int64_t b = 0; b < nb; ++b) s += dot_k45(&x[b].d, x[b].scales, x[b].qh, x[b].qs, a[b]);
  return s;
}

float dot_q6_K(const void* w, const block_q8_K* a, int64_t nb) {
  const auto* x = static_cast<const block_q6_K*>(w);
  float s = 0;
  for (int64_t b = 0; b < nb; ++b) {
    int isum = 0;
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = x[b].ql + 64 * h;
      const uint8_t* qh = x[b].qh + 32 * h;
      const int8_t* aq = a[b].qs + 128 * h;
      int dot[8] = {};
      for (int l = 0; l < 32; ++l) {
        const int q0 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
        const int q1 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        dot[l / 16 + 0] += q0 * aq[l];
        dot[l / 16 + 2] += q1 * aq[l + 32];
        dot[l / 16 + 4] += q2 * aq[l + 64];
        dot[l / 16 + 6] += q3 * aq[l + 96];
      }
      for (int k = 0; k < 8; ++k) isum += x[b].scales[8 * h + k] * dot[k];
    }
    s += f16_to_f32(x[b].d) * a[b].d * static_cast<float>(isum);
  }
  return s;
}

}  // namespace quant

namespace kern {
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

// The integer-dot path. The scalar set's quantized input row: A32 (Q8_0,
// Q4_0) qs[n] then d[n/32]; Q8K (the K types) block_q8_K[n/256].
bool is_a32(DType t) { return t == DType::Q8_0 || t == DType::Q4_0; }

uint64_t round64(uint64_t b) { return (b + 63) / 64 * 64; }

uint64_t act_row_bytes(DType t, int64_t n) {
  return is_a32(t) ? round64(round64(n) + n / 32 * 4) : round64(n / QK_K * sizeof(quant::block_q8_K));
}

void quantize_act(DType t, const float* x, int64_t n, uint8_t* out) {
  if (is_a32(t))
    quant::quantize_a32(x, n, reinterpret_cast<int8_t*>(out), reinterpret_cast<float*>(out + round64(n)));
  else
    quant::quantize_q8K(x, n, reinterpret_cast<quant::block_q8_K*>(out));
}

float qdot(const Mat& w, int64_t r, const uint8_t* xq) {
  const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * row_bytes(w.dtype, w.cols);
  const auto* qs = reinterpret_cast<const int8_t*>(xq);
  const auto* d = reinterpret_cast<const float*>(xq + round64(w.cols));
  const auto* k = reinterpret_cast<const quant::block_q8_K*>(xq);
  switch (w.dtype) {
    case DType::Q8_0: return quant::dot_q8_0(row, qs, d, w.cols / 32);
    case DType::Q4_0: return quant::dot_q4_0(row, qs, d, w.cols / 32);
    case DType::Q4_K: return quant::dot_q4_K(row, k, w.cols / QK_K);
    case DType::Q5_K: return quant::dot_q5_K(row, k, w.cols / QK_K);
    case DType::Q6_K: return quant::dot_q6_K(row, k, w.cols / QK_K);
    default: return 0;
  }
}

void matvec_qa(const Mat& w, const uint8_t* xq, float* y, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) y[r - r0] = qdot(w, r, xq);
}

// The scalar batch form: T rows of the row form (float weights: none, matmat).
uint64_t batch_bytes(DType t, int64_t T, int64_t n) { return dtype_is_quantized(t) ? T * act_row_bytes(t, n) : 0; }

void quantize_batch(DType t, const float* x, int64_t ldx, int64_t n, int64_t t0, int64_t t1, uint8_t* out) {
  const uint64_t st = act_row_bytes(t, n);
  for (int64_t r = t0; r < t1; ++r) quantize_act(t, x + r * ldx, n, out + r * st);
}

void matmat_qa(const Mat& w, const uint8_t* xb, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const uint64_t st = act_row_bytes(w.dtype, w.cols);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = r0; r < r1; ++r) y[t * ldy + r] = qdot(w, r, xb + t * st);
}

// The float entry points quantize into a per-thread buffer (no memo: the
// scalar set is the reference, not a fast path).
void matvec(const Mat& w, const float* x, float* y, int64_t r0, int64_t r1) {
  if (dtype_is_quantized(w.dtype)) {
    thread_local AlignedBuf q;
    uint8_t* xq = q.get(act_row_bytes(w.dtype, w.cols));
    quantize_act(w.dtype, x, w.cols, xq);
    matvec_qa(w, xq, y, r0, r1);
    return;
  }
  for (int64_t r = r0; r < r1; ++r) y[r - r0] = row_dot(w, r, x);
}

void matmat(const Mat& w, const float* x, int64_t T, int64_t ldx, float* y, int64_t ldy,
            int64_t r0, int64_t r1) {
  if (dtype_is_quantized(w.dtype)) {
    thread_local AlignedBuf q;
    uint8_t* xq = q.get(batch_bytes(w.dtype, T, w.cols));
    quantize_batch(w.dtype, x, ldx, w.cols, 0, T, xq);
    matmat_qa(w, xq, T, y, ldy, r0, r1);
    return;
  }
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

void attn_scores(const float* q, int nq, const float* k, int64_t stride, int64_t n, int64_t hd, float* s,
                 int64_t lds) {
  for (int i = 0; i < nq; ++i)
    for (int64_t j = 0; j < n; ++j) s[i * lds + j] = dot(q + i * hd, k + j * stride, hd);
}

void attn_values(const float* w, int64_t ldw, int nq, const float* v, int64_t stride, int64_t n, int64_t hd,
                 float* out, bool add) {
  for (int i = 0; i < nq; ++i) {
    float* o = out + i * hd;
    if (!add) std::memset(o, 0, hd * sizeof(float));
    for (int64_t j = 0; j < n; ++j) axpy(w[i * ldw + j], v + j * stride, o, hd);
  }
}

void sigmoid(const float* x, const float* s, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = 1.0f / (1.0f + std::exp(-(x[i] * s[i])));
}

const KernelSet kScalar{"scalar", matvec, matmat, dot, axpy, dequantize_row,
                        act_row_bytes, quantize_act, matvec_qa,
                        batch_bytes, quantize_batch, matmat_qa, attn_scores, attn_values, sigmoid,
                        false};

}  // namespace kern
}  // namespace dory
