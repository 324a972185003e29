// The reference kernels: plain loops, any x86-64. Every SIMD set is tested
// against these.
#include <cstring>
#include <vector>

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

// The integer-dot path: x quantized once, then one reference dot per row.
struct QuantX {
  std::vector<int8_t> qs;
  std::vector<float> d;
  std::vector<quant::block_q8_K> k;
  void set(DType t, const float* x, int64_t n) {
    if (t == DType::Q8_0 || t == DType::Q4_0) {
      qs.resize(n);
      d.resize(n / 32);
      quant::quantize_a32(x, n, qs.data(), d.data());
    } else {
      k.resize(n / QK_K);
      quant::quantize_q8K(x, n, k.data());
    }
  }
  float dot(const Mat& w, int64_t r) const {
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * row_bytes(w.dtype, w.cols);
    switch (w.dtype) {
      case DType::Q8_0: return quant::dot_q8_0(row, qs.data(), d.data(), w.cols / 32);
      case DType::Q4_0: return quant::dot_q4_0(row, qs.data(), d.data(), w.cols / 32);
      case DType::Q4_K: return quant::dot_q4_K(row, k.data(), w.cols / QK_K);
      case DType::Q5_K: return quant::dot_q5_K(row, k.data(), w.cols / QK_K);
      case DType::Q6_K: return quant::dot_q6_K(row, k.data(), w.cols / QK_K);
      default: return 0;
    }
  }
};

void matvec(const Mat& w, const float* x, float* y, int64_t r0, int64_t r1) {
  if (dtype_is_quantized(w.dtype)) {
    thread_local QuantX q;
    q.set(w.dtype, x, w.cols);
    for (int64_t r = r0; r < r1; ++r) y[r - r0] = q.dot(w, r);
    return;
  }
  for (int64_t r = r0; r < r1; ++r) y[r - r0] = row_dot(w, r, x);
}

void matmat(const Mat& w, const float* x, int64_t T, int64_t ldx, float* y, int64_t ldy,
            int64_t r0, int64_t r1) {
  if (dtype_is_quantized(w.dtype) && T >= kQuantFloatMatmatT) {
    thread_local std::vector<float> row;
    row.resize(w.cols);
    const uint64_t rb = row_bytes(w.dtype, w.cols);
    for (int64_t r = r0; r < r1; ++r) {
      dequantize_row(w.dtype, static_cast<const uint8_t*>(w.data) + r * rb, row.data(), w.cols);
      for (int64_t t = 0; t < T; ++t) {
        float s = 0;
        for (int64_t c = 0; c < w.cols; ++c) s += row[c] * x[t * ldx + c];
        y[t * ldy + r] = s;
      }
    }
    return;
  }
  if (dtype_is_quantized(w.dtype)) {
    thread_local QuantX q;
    for (int64_t t = 0; t < T; ++t) {
      q.set(w.dtype, x + t * ldx, w.cols);
      for (int64_t r = r0; r < r1; ++r) y[t * ldy + r] = q.dot(w, r);
    }
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

const KernelSet kScalar{"scalar", matvec, matmat, dot, axpy, dequantize_row};

}  // namespace kern
}  // namespace dory
