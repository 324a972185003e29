// ggml's quantized block types, byte for byte (ggml-common.h), and their
// conversion to and from float.
//
// Every block stores its scales as IEEE halves (the K types also a few 6- or
// 8-bit sub-block scales) and small integer codes:
//
//   Q8_0  32 elements, 34 bytes:  d; qs[32] int8              x = d * q
//   Q4_0  32 elements, 18 bytes:  d; qs[16] nibbles            x = d * (q - 8)
//           element j < 16 is the low nibble of qs[j], element j + 16 its high nibble
//   Q4_K 256 elements, 144 bytes: d, dmin; scales[12]; qs[128]
//           8 sub-blocks of 32, each with a 6-bit scale sc and 6-bit min m packed
//           in scales[12] (see scale_min_k4); x = (d*sc) * q - (dmin*m), q 4-bit.
//           qs[32c + l]: low nibble is element 64c + l, high nibble 64c + 32 + l
//   Q5_K 256 elements, 176 bytes: d, dmin; scales[12]; qh[32]; qs[128]
//           as Q4_K with a 5th bit: element 64c + l takes bit 2c of qh[l],
//           element 64c + 32 + l bit 2c + 1; q = nibble + 16 * bit
//   Q6_K 256 elements, 210 bytes: ql[128]; qh[64]; scales[16] int8; d
//           16 sub-blocks of 16 with signed 8-bit scales; x = (d*sc) * (q - 32),
//           q 6-bit: per half h (128 elements; ql += 64h, qh += 32h, sc += 8h),
//           for l < 32: element l      = ql[l] low  | (qh[l] bits 0-1) << 4
//                       element l + 32 = ql[l+32] low  | (qh[l] bits 2-3) << 4
//                       element l + 64 = ql[l] high | (qh[l] bits 4-5) << 4
//                       element l + 96 = ql[l+32] high | (qh[l] bits 6-7) << 4
//           element e of the half uses scale sc[e / 16].
//
// Dequantization follows the C expressions of ggml's dequantize_row_* in IEEE
// single precision. Every product there is exact (a half has 11 significant
// bits: d*sc needs at most 11+8, d*sc*q of Q4_K/Q5_K at most 22), so each value
// is a single correctly rounded result: Q4_K/Q5_K (d*sc*q) - (dmin*m), Q6_K
// (d*sc)*(q-32), and exact for Q8_0/Q4_0. Hence bit-exact against ggml (checked
// against libggml itself, tests/unit/test_quant.cpp) and the same on every ISA,
// whatever the evaluation order or FMA contraction.
#pragma once
#include <cstdint>

#include "tensor/dtype.h"

namespace dory {

constexpr int QK8_0 = 32;
constexpr int QK4_0 = 32;
constexpr int QK_K = 256;

struct block_q8_0 {
  uint16_t d;  // half
  int8_t qs[QK8_0];
};
struct block_q4_0 {
  uint16_t d;  // half
  uint8_t qs[QK4_0 / 2];
};
struct block_q4_K {
  uint16_t d, dmin;    // halves: scale of the sub-block scales, of the mins
  uint8_t scales[12];  // 8 scales + 8 mins, 6 bits each
  uint8_t qs[QK_K / 2];
};
struct block_q5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[QK_K / 8];
  uint8_t qs[QK_K / 2];
};
struct block_q6_K {
  uint8_t ql[QK_K / 2];
  uint8_t qh[QK_K / 4];
  int8_t scales[QK_K / 16];
  uint16_t d;  // half
};
static_assert(sizeof(block_q8_0) == 34, "ggml block_q8_0");
static_assert(sizeof(block_q4_0) == 18, "ggml block_q4_0");
static_assert(sizeof(block_q4_K) == 144, "ggml block_q4_K");
static_assert(sizeof(block_q5_K) == 176, "ggml block_q5_K");
static_assert(sizeof(block_q6_K) == 210, "ggml block_q6_K");

// n elements (whole blocks of t; any t, float types too) to float.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);
// n floats (whole blocks) to t. Q8_0 and Q4_0 use ggml's reference rule (one
// max-abs scale per block); Q4_K and Q5_K search each sub-block's scale and
// min like ggml's quantize_row_q4_K_ref / q5_K_ref (make_qkx2_quants), Q6_K
// each sub-block's scale like quantize_row_q6_K_ref (make_qx_quants), with
// the same sub-block scale encodings. Float types are converted (f16/bf16
// round to nearest even).
void quantize_row(DType t, const float* src, void* dst, int64_t n);

// Unpacks sub-block j (0..7) of a Q4_K/Q5_K scales[12] into its 6-bit scale
// and min (ggml's get_scale_min_k4): j < 4: sc = s[j] & 63, m = s[j+4] & 63;
// j >= 4: sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4, m = (s[j+4] >> 4) | (s[j] >> 6) << 4.
void scale_min_k4(int j, const uint8_t* s, uint8_t* sc, uint8_t* m);

namespace quant {

// The activation side of the integer-dot kernels, quantized once per input row.
//   A32 (partner of Q8_0, Q4_0): per block of 32, q = rne(x / d) with
//        d = max|x| / 127 (a float, not a half), stored as qs[n] and d[n/32].
//   Q8K (partner of the K types, ggml's block_q8_K): per block of 256,
//        d = max|x| / 127, q = rne(x / d), and the sums of each 16 q's.
// q is computed as rne(x * (1/d)) in single precision, so every ISA produces the
// same bytes.
struct block_q8_K {
  float d;
  int8_t qs[QK_K];
  int16_t bsums[QK_K / 16];
};

void quantize_a32(const float* x, int64_t n, int8_t* qs, float* d);
void quantize_q8K(const float* x, int64_t n, block_q8_K* out);

// Reference integer dot products of one weight row (nb blocks) with a
// quantized activation row: the scalar kernels; the SIMD kernels compute the
// same integers and differ only in the order of the float sums.
float dot_q8_0(const void* w, const int8_t* qs, const float* d, int64_t nb);
float dot_q4_0(const void* w, const int8_t* qs, const float* d, int64_t nb);
float dot_q4_K(const void* w, const block_q8_K* a, int64_t nb);
float dot_q5_K(const void* w, const block_q8_K* a, int64_t nb);
float dot_q6_K(const void* w, const block_q8_K* a, int64_t nb);

}  // namespace quant
}  // namespace dory
