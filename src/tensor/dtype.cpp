#include "tensor/dtype.h"

#include <cmath>
#include <stdexcept>

#include "tensor/quant.h"

namespace dory {

const char* dtype_name(DType t) { return dtype_traits(t).name; }

int dtype_size(DType t) {
  const DTypeTraits& d = dtype_traits(t);
  if (d.quantized)
    throw std::logic_error(std::string("dtype_size: ") + d.name + " is a block type; use row_bytes()");
  return d.block_bytes;
}

bool dtype_is_quantized(DType t) { return dtype_traits(t).quantized; }

int dtype_block_elems(DType t) { return dtype_traits(t).block_elems; }

int dtype_block_bytes(DType t) { return dtype_traits(t).block_bytes; }

bool dtype_row_ok(DType t, int64_t cols) { return cols >= 0 && cols % dtype_block_elems(t) == 0; }

uint64_t row_bytes(DType t, int64_t cols) {
  if (!dtype_row_ok(t, cols))
    throw std::invalid_argument(std::string("row of ") + std::to_string(cols) + " elements is not whole " +
                                dtype_name(t) + " blocks of " + std::to_string(dtype_block_elems(t)));
  return static_cast<uint64_t>(cols / dtype_block_elems(t)) * dtype_block_bytes(t);
}

uint64_t tensor_bytes(DType t, const std::vector<int64_t>& shape) {
  if (shape.empty()) return row_bytes(t, 1);
  uint64_t lead = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) lead *= static_cast<uint64_t>(shape[i]);
  return lead * row_bytes(t, shape.back());
}

bool parse_safetensors_dtype(const std::string& s, DType* out) {
  for (const DTypeTraits& d : all_dtypes())
    if (d.safetensors && s == d.safetensors) {
      *out = d.type;
      return true;
    }
  return false;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v;
  if (exp == 0) v = std::ldexp(static_cast<float>(man), -24);  // zero / subnormal
  else if (exp == 31) v = man ? NAN : INFINITY;
  else v = std::ldexp(static_cast<float>(man | 0x400), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00;   // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00;  // >= 65520 rounds to inf (and inf)
  if (a < 0x38800000u) {                       // below 2^-14: half subnormal or zero
    float v;
    std::memcpy(&v, &a, 4);
    // v * 2^24 is exact; the half's subnormal code is it rounded to nearest even
    // (1024 becomes the smallest normal, which is the right encoding too).
    return sign | static_cast<uint16_t>(std::nearbyint(v * 16777216.0f));
  }
  uint32_t h = (a >> 13) - ((127u - 15u) << 10);
  const uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry moves into the exponent
  return sign | static_cast<uint16_t>(h);
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void TensorView::to_f32(int64_t i0, int64_t n, float* out) const {
  const auto* b = static_cast<const uint8_t*>(data);
  const int be = dtype_block_elems(dtype);
  if (i0 % be || n % be)
    throw std::invalid_argument(name + ": element range is not whole " + dtype_name(dtype) + " blocks");
  dequantize_row(dtype, b + (i0 / be) * dtype_block_bytes(dtype), out, n);
}

std::vector<float> TensorView::to_f32() const {
  std::vector<float> v(numel());
  to_f32(0, numel(), v.data());
  return v;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  s += ']';
  return s;
}

// ---------------------------------------------------------------------------
// Quantized blocks: dequantization (the published definitions), quantization
// (ggml's reference quantizers' rules), activation quantization.

namespace {

uint16_t load_u16(const void* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// Round to nearest, ties to even (ggml's nearest_int; the rounding mode is
// never changed in this program).
int nearest_int(float f) { return static_cast<int>(std::nearbyint(f)); }

void dequant_q8_0(const block_q8_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(x[i].d);
    for (int j = 0; j < QK8_0; ++j) y[i * QK8_0 + j] = static_cast<float>(x[i].qs[j]) * d;
  }
}

void dequant_q4_0(const block_q4_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(x[i].d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      y[i * QK4_0 + j] = static_cast<float>((x[i].qs[j] & 0xF) - 8) * d;
      y[i * QK4_0 + j + 16] = static_cast<float>((x[i].qs[j] >> 4) - 8) * d;
    }
  }
}

// Q4_K and Q5_K: qh == nullptr for Q4_K.
void dequant_k45(const uint16_t* dd, const uint8_t* scales, const uint8_t* qh, const uint8_t* qs,
                 float* y) {
  const float d = f16_to_f32(dd[0]), dmin = f16_to_f32(dd[1]);
  for (int c = 0; c < 4; ++c) {
    for (int half = 0; half < 2; ++half) {
      uint8_t sc, m;
      scale_min_k4(2 * c + half, scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc);
      const float m1 = dmin * static_cast<float>(m);
      const int bit = 2 * c + half;
      for (int l = 0; l < 32; ++l) {
        int q = half ? qs[32 * c + l] >> 4 : qs[32 * c + l] & 0xF;
        if (qh && ((qh[l] >> bit) & 1)) q += 16;
        const float p = d1 * static_cast<float>(q);
        y[64 * c + 32 * half + l] = p - m1;
      }
    }
  }
}

void dequant_q6_K(const block_q6_K* x, float* y) {
  const float d = f16_to_f32(x->d);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = x->ql + 64 * h;
    const uint8_t* qh = x->qh + 32 * h;
    const int8_t* sc = x->scales + 8 * h;
    float* yh = y + 128 * h;
    for (int l = 0; l < 32; ++l) {
      const int q[4] = {((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32,
                        ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32,
                        ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32,
                        ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32};
      for (int g = 0; g < 4; ++g) {
        const int e = 32 * g + l;
        const float ds = d * static_cast<float>(sc[e / 16]);
        yh[e] = ds * static_cast<float>(q[g]);
      }
    }
  }
}

void quant_q8_0(const float* x, block_q8_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK8_0) {
    float amax = 0;
    for (int j = 0; j < QK8_0; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    for (int j = 0; j < QK8_0; ++j) y[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

void quant_q4_0(const float* x, block_q4_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK4_0) {
    // The element of largest magnitude maps to -8 exactly (its sign kept in d).
    float amax = 0, vmax = 0;
    for (int j = 0; j < QK4_0; ++j)
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        vmax = x[j];
      }
    const float d = vmax / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      // x*id lies in [-8, 8]; +8.5 then truncation rounds half up; 16 clamps to 15.
      const int a = static_cast<int>(x[j] * id + 8.5f), b = static_cast<int>(x[j + 16] * id + 8.5f);
      y[i].qs[j] = static_cast<uint8_t>((a < 15 ? a : 15) | (b < 15 ? b : 15) << 4);
    }
  }
}

// Best scale and min for n values coded as L in [0, nmax] (x ~ scale*L - min,
// min >= 0 returned in *mn): start from the full range, then try nstep+1
// stretched ranges, each solved by weighted least squares for scale and
// offset, keeping the lowest weighted squared error (ggml's make_qkx2_quants).
float fit_scale_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float* mn,
                    float rmin, float rdelta, int nstep) {
  float lo = x[0], hi = x[0], sw = w[0], swx = w[0] * x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::fmin(lo, x[i]);
    hi = std::fmax(hi, x[i]);
    sw += w[i];
    swx += w[i] * x[i];
  }
  if (lo > 0) lo = 0;
  if (hi == lo) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *mn = -lo;
    return 0.0f;
  }
  float iscale = nmax / (hi - lo);
  float scale = 1 / iscale;
  float best = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - lo));
    L[i] = static_cast<uint8_t>(l < 0 ? 0 : l > nmax ? nmax : l);
    const float diff = scale * L[i] + lo - x[i];
    best += w[i] * (diff * diff);
  }
  uint8_t Lt[32];
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (hi - lo);
    float sl = 0, sl2 = 0, sxl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - lo));
      l = l < 0 ? 0 : l > nmax ? nmax : l;
      Lt[i] = static_cast<uint8_t>(l);
      sl += w[i] * l;
      sl2 += w[i] * l * l;
      sxl += w[i] * l * x[i];
    }
    const float D = sw * sl2 - sl * sl;
    if (D > 0) {
      float s = (sw * sxl - swx * sl) / D;
      float m = (sl2 * swx - sl * sxl) / D;
      if (m > 0) {
        m = 0;
        s = sxl / sl2;
      }
      float err = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = s * Lt[i] + m - x[i];
        err += w[i] * (diff * diff);
      }
      if (err < best) {
        for (int i = 0; i < n; ++i) L[i] = Lt[i];
        best = err;
        scale = s;
        lo = m;
      }
    }
  }
  *mn = -lo;
  return scale;
}

// Q4_K (nmax 15) and Q5_K (nmax 31): one super-block of 256. qh == nullptr for Q4_K.
void quant_k45(const float* x, int nmax, float rmin, int nstep, uint16_t* dd, uint8_t* scales,
               uint8_t* qh, uint8_t* qs) {
  uint8_t L[QK_K];
  float sc[8], mn[8], w[32];
  float max_sc = 0, max_mn = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xj = x + 32 * j;
    float s2 = 0;
    for (int l = 0; l < 32; ++l) s2 += xj[l] * xj[l];
    const float av = std::sqrt(s2 / 32);
    for (int l = 0; l < 32; ++l) w[l] = av + std::fabs(xj[l]);
    sc[j] = fit_scale_min(32, nmax, xj, w, L + 32 * j, &mn[j], rmin, 0.1f, nstep);
    max_sc = std::fmax(max_sc, sc[j]);
    max_mn = std::fmax(max_mn, mn[j]);
  }
  const float inv_sc = max_sc > 0 ? 63.0f / max_sc : 0.0f;
  const float inv_mn = max_mn > 0 ? 63.0f / max_mn : 0.0f;
  for (int j = 0; j < 12; ++j) scales[j] = 0;
  for (int j = 0; j < 8; ++j) {
    int ls = nearest_int(inv_sc * sc[j]), lm = nearest_int(inv_mn * mn[j]);
    ls = ls < 0 ? 0 : ls > 63 ? 63 : ls;
    lm = lm < 0 ? 0 : lm > 63 ? 63 : lm;
    if (j < 4) {
      scales[j] = static_cast<uint8_t>(ls);
      scales[j + 4] = static_cast<uint8_t>(lm);
    } else {
      scales[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      scales[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      scales[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  dd[0] = f32_to_f16(max_sc / 63.0f);
  dd[1] = f32_to_f16(max_mn / 63.0f);
  // Re-code every element against the scales as stored.
  const float d = f16_to_f32(dd[0]), dmin = f16_to_f32(dd[1]);
  for (int j = 0; j < 8; ++j) {
    uint8_t s, m;
    scale_min_k4(j, scales, &s, &m);
    const float ds = d * s;
    if (ds == 0.0f) continue;
    const float dm = dmin * m;
    for (int l = 0; l < 32; ++l) {
      const int q = nearest_int((x[32 * j + l] + dm) / ds);
      L[32 * j + l] = static_cast<uint8_t>(q < 0 ? 0 : q > nmax ? nmax : q);
    }
  }
  if (qh)
    for (int l = 0; l < 32; ++l) qh[l] = 0;
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      const int a = L[64 * c + l], b = L[64 * c + 32 + l];
      qs[32 * c + l] = static_cast<uint8_t>((a & 0xF) | (b & 0xF) << 4);
      if (qh) qh[l] |= static_cast<uint8_t>(((a >> 4) << (2 * c)) | ((b >> 4) << (2 * c + 1)));
    }
}

// Signed codes L in [-nmax, nmax-1] for 16 values, scale by weighted (x^2)
// least squares over 19 trial inverse scales (ggml's make_qx_quants, rmse 1).
float fit_scale_signed(int n, int nmax, const float* x, int8_t* L) {
  float amax = 0, vmax = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      vmax = x[i];
    }
  if (amax < 1e-15f) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  auto code = [nmax](float v) {
    const int l = nearest_int(v);
    return l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
  };
  float iscale = -nmax / vmax;
  float sxl = 0, sl2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = code(iscale * x[i]);
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    sxl += w * x[i] * l;
    sl2 += w * l * l;
  }
  float scale = sl2 ? sxl / sl2 : 0.0f;
  float best = scale * sxl;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / vmax;
    sxl = sl2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = code(iscale * x[i]);
      const float w = x[i] * x[i];
      sxl += w * x[i] * l;
      sl2 += w * l * l;
    }
    if (sl2 > 0 && sxl * sxl > best * sl2) {
      for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(nmax + code(iscale * x[i]));
      scale = sxl / sl2;
      best = scale * sxl;
    }
  }
  return scale;
}

void quant_q6_K(const float* x, block_q6_K* y) {
  int8_t L[QK_K];
  float sc[16];
  float max_abs = 0, max_sc = 0;
  for (int ib = 0; ib < 16; ++ib) {
    sc[ib] = fit_scale_signed(16, 32, x + 16 * ib, L + 16 * ib);
    if (std::fabs(sc[ib]) > max_abs) {
      max_abs = std::fabs(sc[ib]);
      max_sc = sc[ib];
    }
  }
  std::memset(y, 0, sizeof(*y));
  if (max_abs < 1e-15f) return;  // all zero (d = +0)
  const float iscale = -128.0f / max_sc;
  y->d = f32_to_f16(1 / iscale);
  for (int ib = 0; ib < 16; ++ib) {
    const int s = nearest_int(iscale * sc[ib]);
    y->scales[ib] = static_cast<int8_t>(s > 127 ? 127 : s);
  }
  const float d = f16_to_f32(y->d);
  for (int ib = 0; ib < 16; ++ib) {
    const float ds = d * y->scales[ib];
    if (ds == 0.0f) continue;
    for (int l = 0; l < 16; ++l) {
      const int q = nearest_int(x[16 * ib + l] / ds);
      L[16 * ib + l] = static_cast<int8_t>((q < -32 ? -32 : q > 31 ? 31 : q) + 32);
    }
  }
  for (int h = 0; h < 2; ++h) {
    const int8_t* Lh = L + 128 * h;
    uint8_t* ql = y->ql + 64 * h;
    uint8_t* qh = y->qh + 32 * h;
    for (int l = 0; l < 32; ++l) {
      const int q0 = Lh[l], q1 = Lh[l + 32], q2 = Lh[l + 64], q3 = Lh[l + 96];
      ql[l] = static_cast<uint8_t>((q0 & 0xF) | (q2 & 0xF) << 4);
      ql[l + 32] = static_cast<uint8_t>((q1 & 0xF) | (q3 & 0xF) << 4);
      qh[l] = static_cast<uint8_t>((q0 >> 4) | (q1 >> 4) << 2 | (q2 >> 4) << 4 | (q3 >> 4) << 6);
    }
  }
}

void check_blocks(DType t, int64_t n) {
  if (n < 0 || n % dtype_block_elems(t))
    throw std::invalid_argument(std::to_string(n) + " elements are not whole " + dtype_name(t) + " blocks");
}

}  // namespace

void scale_min_k4(int j, const uint8_t* s, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

namespace {

// Each type's whole blocks to and from float (the bodies of the table's function pointers).
void deq_f32(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, n * 4); }
void deq_bf16(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(b + 2 * i));
}
void deq_f16(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(load_u16(b + 2 * i));
}
void deq_q8_0(const void* src, float* dst, int64_t n) {
  dequant_q8_0(static_cast<const block_q8_0*>(src), dst, n / QK8_0);
}
void deq_q4_0(const void* src, float* dst, int64_t n) {
  dequant_q4_0(static_cast<const block_q4_0*>(src), dst, n / QK4_0);
}
void deq_q4_k(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const auto* x = static_cast<const block_q4_K*>(src) + i;
    dequant_k45(&x->d, x->scales, nullptr, x->qs, dst + i * QK_K);
  }
}
void deq_q5_k(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const auto* x = static_cast<const block_q5_K*>(src) + i;
    dequant_k45(&x->d, x->scales, x->qh, x->qs, dst + i * QK_K);
  }
}
void deq_q6_k(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i) dequant_q6_K(static_cast<const block_q6_K*>(src) + i, dst + i * QK_K);
}

void q_f32(const float* src, void* dst, int64_t n) { std::memcpy(dst, src, n * 4); }
void q_bf16(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &src[i], 4);
    uint16_t h;
    if ((u & 0x7fffffffu) > 0x7f800000u) h = static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
    else h = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
    std::memcpy(b + 2 * i, &h, 2);
  }
}
void q_f16(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = f32_to_f16(src[i]);
    std::memcpy(b + 2 * i, &h, 2);
  }
}
void q_q8_0(const float* src, void* dst, int64_t n) { quant_q8_0(src, static_cast<block_q8_0*>(dst), n / QK8_0); }
void q_q4_0(const float* src, void* dst, int64_t n) { quant_q4_0(src, static_cast<block_q4_0*>(dst), n / QK4_0); }
void q_q4_k(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i) {
    auto* y = static_cast<block_q4_K*>(dst) + i;
    quant_k45(src + i * QK_K, 15, -1.0f, 20, &y->d, y->scales, nullptr, y->qs);
  }
}
void q_q5_k(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i) {
    auto* y = static_cast<block_q5_K*>(dst) + i;
    quant_k45(src + i * QK_K, 31, -0.5f, 15, &y->d, y->scales, y->qh, y->qs);
  }
}
void q_q6_k(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i) quant_q6_K(src + i * QK_K, static_cast<block_q6_K*>(dst) + i);
}

// The table. Its order is DType's; the GGUF ids are ggml's enum values (ggml.h: GGML_TYPE_*).
// (A function's static, so a table read during another file's static initialization is built.)
const std::vector<DTypeTraits>& table() {
  static const std::vector<DTypeTraits> t = {
    {DType::F32, "F32", 1, 4, 0, "F32", false, deq_f32, q_f32, "float GEMM / matvec"},
    {DType::F16, "F16", 1, 2, 1, "F16", false, deq_f16, q_f16, "float GEMM / matvec (F16C)"},
    {DType::BF16, "BF16", 1, 2, 30, "BF16", false, deq_bf16, q_bf16, "float GEMM / matvec; vdpbf16ps"},
    {DType::Q8_0, "Q8_0", QK8_0, sizeof(block_q8_0), 8, nullptr, true, deq_q8_0, q_q8_0, "int8 dot (matvec_qa, gemm)"},
    {DType::Q4_0, "Q4_0", QK4_0, sizeof(block_q4_0), 2, nullptr, true, deq_q4_0, q_q4_0, "int8 dot (matvec_qa, gemm)"},
    {DType::Q4_K, "Q4_K", QK_K, sizeof(block_q4_K), 12, nullptr, true, deq_q4_k, q_q4_k, "int8 dot (matvec_qa, gemm)"},
    {DType::Q5_K, "Q5_K", QK_K, sizeof(block_q5_K), 13, nullptr, true, deq_q5_k, q_q5_k, "int8 dot (matvec_qa, gemm)"},
    {DType::Q6_K, "Q6_K", QK_K, sizeof(block_q6_K), 14, nullptr, true, deq_q6_k, q_q6_k, "int8 dot (matvec_qa, gemm)"},
  };
  return t;
}

}  // namespace

const std::vector<DTypeTraits>& all_dtypes() { return table(); }

const DTypeTraits& dtype_traits(DType t) {
  const auto& tb = table();
  const size_t i = static_cast<size_t>(t);
  if (i >= tb.size() || tb[i].type != t) throw std::logic_error("dtype_traits: no row for this type");
  return tb[i];
}

const DTypeTraits* dtype_from_ggml_id(uint32_t id) {
  for (const DTypeTraits& d : table())
    if (d.ggml_id == id) return &d;
  return nullptr;
}

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  check_blocks(t, n);
  if (n == 0) return;  // a tensor with no elements may have no data pointer at all
  dtype_traits(t).dequantize(src, dst, n);
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  check_blocks(t, n);
  if (n == 0) return;
  dtype_traits(t).quantize(src, dst, n);
}

namespace quant {

namespace {
// One block of m activations: d = max|x|/127, q = rne(x * (1/d)).
float quantize_block(const float* x, int m, int8_t* q) {
  float amax = 0;
  for (int j = 0; j < m; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < m; ++j) {
    const int v = nearest_int(x[j] * id);
    q[j] = static_cast<int8_t>(v > 127 ? 127 : v < -127 ? -127 : v);
  }
  return d;
}
}  // namespace

void quantize_a32(const float* x, int64_t n, int8_t* qs, float* d) {
  check_blocks(DType::Q8_0, n);
  for (int64_t b = 0; b < n / 32; ++b) d[b] = quantize_block(x + 32 * b, 32, qs + 32 * b);
}

void quantize_q8K(const float* x, int64_t n, block_q8_K* out) {
  check_blocks(DType::Q4_K, n);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    out[b].d = quantize_block(x + QK_K * b, QK_K, out[b].qs);
    for (int k = 0; k < 16; ++k) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += out[b].qs[16 * k + l];
      out[b].bsums[k] = static_cast<int16_t>(s);
    }
  }
}

}  // namespace quant
}  // namespace dory
