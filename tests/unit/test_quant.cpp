// Quantized weight types: block layouts against hand-computed blocks and an
// element-wise decoder written here from ggml's format description,
// quantization error bounds, activation quantization, and every kernel set
// against the scalar reference on odd shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>

#include "backend/cpu/ops.h"
#include "backend/cpu/pool.h"
#include "tensor/kernels.h"
#include "tensor/quant.h"

using namespace dory;

namespace {

const DType kQuant[] = {DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};

// An IEEE half decoded here independently of dtype.cpp (finite values only).
float half(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const float v = e == 0 ? std::ldexp(float(m), -24) : std::ldexp(float(m + 1024), e - 25);
  return (h & 0x8000) ? -v : v;
}

void put16(uint8_t* p, uint16_t h) { std::memcpy(p, &h, 2); }
uint16_t get16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

std::vector<float> deq(DType t, const std::vector<uint8_t>& b, int64_t n) {
  std::vector<float> y(n);
  dequantize_row(t, b.data(), y.data(), n);
  return y;
}

// The 6-bit scale/min of sub-block j of a Q4_K/Q5_K scales[12], from the
// layout description: j < 4 low 6 bits of s[j] / s[j+4]; j >= 4 low / high
// nibble of s[j+4] with the top 2 bits of s[j-4] / s[j] as bits 4-5.
void sc_min(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) + 16 * (s[j - 4] >> 6);
    *m = (s[j + 4] >> 4) + 16 * (s[j] >> 6);
  }
}

// Element e of one block, decoded on its own: value = a - b, with
// a = (d*sc)*q and b = (dmin*m) as the format defines (b = 0 where there is no
// min); *mag = |a| + |b| (the size of the terms, for rounding tolerances).
float element(DType t, const uint8_t* blk, int e, float* mag) {
  float a = 0, b = 0;
  switch (t) {
    case DType::Q8_0: a = half(get16(blk)) * float(int8_t(blk[2 + e])); break;
    case DType::Q4_0: {
      const uint8_t byte = blk[2 + e % 16];
      const int q = e < 16 ? byte & 15 : byte >> 4;
      a = half(get16(blk)) * float(q - 8);
      break;
    }
    case DType::Q4_K:
    case DType::Q5_K: {
      const bool q5 = t == DType::Q5_K;
      const uint8_t* qs = blk + (q5 ? 48 : 16);
      const int j = e / 32, l = e % 32, c = e / 64;
      const uint8_t byte = qs[32 * c + l];
      int q = j % 2 == 0 ? byte & 15 : byte >> 4;
      if (q5 && (blk[16 + l] >> j) & 1) q += 16;
      int sc, m;
      sc_min(blk + 4, j, &sc, &m);
      const float ds = half(get16(blk)) * float(sc);
      a = ds * float(q);
      b = half(get16(blk + 2)) * float(m);
      break;
    }
    case DType::Q6_K: {
      const int h = e / 128, r = e % 128, g = r / 32, l = r % 32;
      const uint8_t byte = blk[64 * h + l + 32 * (g & 1)];
      const int lo4 = g < 2 ? byte & 15 : byte >> 4;
      const int hi2 = (blk[128 + 32 * h + l] >> (2 * g)) & 3;
      const int sc = int8_t(blk[192 + 8 * h + r / 16]);
      const float ds = half(get16(blk + 208)) * float(sc);
      a = ds * float((lo4 | hi2 << 4) - 32);
      break;
    }
    default: break;
  }
  if (mag) *mag = std::fabs(a) + std::fabs(b);
  return a - b;
}

// Random blocks: every byte random, the halves finite (|d| in about 2^-6..2^3).
std::vector<uint8_t> random_blocks(DType t, int64_t nblocks, std::mt19937& rng) {
  const int bb = dtype_block_bytes(t);
  std::vector<uint8_t> v(nblocks * bb);
  for (auto& c : v) c = static_cast<uint8_t>(rng());
  auto rh = [&] { return static_cast<uint16_t>((rng() & 0x83ff) | ((9 + rng() % 10) << 10)); };
  for (int64_t i = 0; i < nblocks; ++i) {
    uint8_t* p = v.data() + i * bb;
    if (t == DType::Q6_K) {
      put16(p + 208, rh());
    } else {
      put16(p, rh());
      if (t == DType::Q4_K || t == DType::Q5_K) put16(p + 2, rh());
    }
  }
  return v;
}

std::vector<float> gaussian(int64_t n, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> v(n);
  for (float& f : v) f = nd(rng);
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------
// Sizes and helpers

TEST(Quant, BlockSizesAndRowBytes) {
  EXPECT_EQ(dtype_block_elems(DType::F32), 1);
  EXPECT_EQ(dtype_block_elems(DType::Q8_0), 32);
  EXPECT_EQ(dtype_block_elems(DType::Q4_0), 32);
  EXPECT_EQ(dtype_block_elems(DType::Q4_K), 256);
  EXPECT_EQ(dtype_block_elems(DType::Q5_K), 256);
  EXPECT_EQ(dtype_block_elems(DType::Q6_K), 256);
  EXPECT_EQ(dtype_block_bytes(DType::Q8_0), 34);
  EXPECT_EQ(dtype_block_bytes(DType::Q4_0), 18);
  EXPECT_EQ(dtype_block_bytes(DType::Q4_K), 144);
  EXPECT_EQ(dtype_block_bytes(DType::Q5_K), 176);
  EXPECT_EQ(dtype_block_bytes(DType::Q6_K), 210);
  EXPECT_EQ(row_bytes(DType::BF16, 2560), 5120u);
  EXPECT_EQ(row_bytes(DType::F32, 3), 12u);
  EXPECT_EQ(row_bytes(DType::Q8_0, 2560), 80u * 34);
  EXPECT_EQ(row_bytes(DType::Q4_0, 2560), 80u * 18);
  EXPECT_EQ(row_bytes(DType::Q4_K, 2560), 10u * 144);
  EXPECT_EQ(row_bytes(DType::Q5_K, 2560), 10u * 176);
  EXPECT_EQ(row_bytes(DType::Q6_K, 2560), 10u * 210);
  EXPECT_THROW(row_bytes(DType::Q4_K, 2560 + 32), std::invalid_argument);
  EXPECT_THROW(row_bytes(DType::Q8_0, 33), std::invalid_argument);
  EXPECT_EQ(tensor_bytes(DType::Q6_K, {4096, 2560}), 4096u * 2100);
  EXPECT_EQ(tensor_bytes(DType::F16, {7}), 14u);
  EXPECT_EQ(kern::mat_bytes(kern::Mat{DType::Q4_0, nullptr, 4096, 2560}), 4096u * 1440);
  EXPECT_EQ(kern::mat_bytes(kern::Mat{DType::BF16, nullptr, 3, 5}), 30u);
  EXPECT_EQ(dtype_size(DType::BF16), 2);
  EXPECT_THROW(dtype_size(DType::Q4_K), std::logic_error);  // block types have no element size
  EXPECT_TRUE(dtype_is_quantized(DType::Q5_K));
  EXPECT_FALSE(dtype_is_quantized(DType::BF16));
  EXPECT_STREQ(dtype_name(DType::Q6_K), "Q6_K");
  TensorView tv{"t", DType::Q4_0, {3, 64}, nullptr};
  EXPECT_EQ(tv.nbytes(), 3u * 2 * 18);
}

TEST(Quant, HalfFromFloatRoundsToNearestEven) {
  for (uint32_t h = 0; h < 65536; ++h) {
    if (((h >> 10) & 31) == 31 && (h & 1023)) continue;  // NaN
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie, to even (down)
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, to even (up)
  EXPECT_EQ(f32_to_f16(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // the tie above the largest half: inf
  EXPECT_EQ(f32_to_f16(-1e10f), 0xfc00);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);      // tie between 0 and 2^-24: 0
  EXPECT_EQ(f32_to_f16(1.5f * std::ldexp(1.0f, -25)), 0x0001);
  EXPECT_EQ(f32_to_f16(3 * std::ldexp(1.0f, -25)), 0x0002);  // 1.5 units: tie, to even
  EXPECT_EQ(f32_to_f16(1023.5f * std::ldexp(1.0f, -24)), 0x0400);  // rounds up into the normals
  const uint16_t nan = f32_to_f16(NAN);
  EXPECT_TRUE((nan & 0x7c00) == 0x7c00 && (nan & 0x3ff));
}

// ---------------------------------------------------------------------------
// Dequantization of hand-made blocks. Expected values are worked out by hand
// from the layouts in tensor/quant.h (the comments show the arithmetic).

TEST(Quant, Q8_0HandBlock) {
  std::vector<uint8_t> b(34, 0);
  put16(b.data(), 0xb400);  // d = -0.25
  const int8_t q[] = {-128, -127, -1, 0, 1, 2, 127};
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(j < 7 ? q[j] : j);
  const auto y = deq(DType::Q8_0, b, 32);
  EXPECT_EQ(y[0], 32.0f);     // -128 * -0.25
  EXPECT_EQ(y[1], 31.75f);    // -127 * -0.25
  EXPECT_EQ(y[2], 0.25f);
  EXPECT_EQ(y[3], 0.0f);
  EXPECT_EQ(y[4], -0.25f);
  EXPECT_EQ(y[5], -0.5f);
  EXPECT_EQ(y[6], -31.75f);
  EXPECT_EQ(y[31], -7.75f);   // 31 * -0.25
}

TEST(Quant, Q4_0HandBlock) {
  std::vector<uint8_t> b(18, 0);
  put16(b.data(), 0x4100);  // d = 2.5
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | (15 - j) << 4);
  const auto y = deq(DType::Q4_0, b, 32);
  // element j < 16: low nibble j -> (j - 8) * 2.5; element j + 16: high nibble 15 - j -> (7 - j) * 2.5
  EXPECT_EQ(y[0], -20.0f);
  EXPECT_EQ(y[7], -2.5f);
  EXPECT_EQ(y[8], 0.0f);
  EXPECT_EQ(y[15], 17.5f);
  EXPECT_EQ(y[16], 17.5f);
  EXPECT_EQ(y[23], 0.0f);
  EXPECT_EQ(y[31], -20.0f);
}

namespace {
// The 12 scale bytes of a Q4_K/Q5_K block for scales {1,2,3,63,17,33,48,5} and
// mins {0,7,63,1,40,2,16,31}, packed by hand:
//   s[0..3] = sc0..3 | (sc4..7 >> 4) << 6 = 1|1<<6, 2|2<<6, 3|3<<6, 63|0  = 41 82 c3 3f
//   s[4..7] = m0..3  | (m4..7 >> 4) << 6  = 0|2<<6, 7|0, 63|1<<6, 1|1<<6  = 80 07 7f 41
//   s[8..11] = (sc4..7 & 15) | (m4..7 & 15) << 4 = 1|8<<4, 1|2<<4, 0|0, 5|15<<4 = 81 21 00 f5
const uint8_t kScales12[12] = {0x41, 0x82, 0xc3, 0x3f, 0x80, 0x07, 0x7f, 0x41, 0x81, 0x21, 0x00, 0xf5};
const int kSc[8] = {1, 2, 3, 63, 17, 33, 48, 5};
const int kMn[8] = {0, 7, 63, 1, 40, 2, 16, 31};
}  // namespace

TEST(Quant, Q4_KHandBlockAndSixBitScales) {
  std::vector<uint8_t> b(144, 0);
  put16(b.data(), 0x3c00);      // d = 1
  put16(b.data() + 2, 0x3800);  // dmin = 0.5
  std::memcpy(b.data() + 4, kScales12, 12);
  for (int i = 0; i < 128; ++i) b[16 + i] = static_cast<uint8_t>(i);  // qs[i] = i
  // The packed scales decode to the chosen ones.
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    scale_min_k4(j, kScales12, &sc, &m);
    EXPECT_EQ(sc, kSc[j]) << j;
    EXPECT_EQ(m, kMn[j]) << j;
  }
  const auto y = deq(DType::Q4_K, b, 256);
  // qs[32c + l] = 32c + l: element 64c + l (sub-block 2c) has q = l & 15,
  // element 64c + 32 + l (sub-block 2c + 1) has q = 2c + (l >> 4); x = sc*q - m/2.
  EXPECT_EQ(y[0], 0.0f);          // 1*0 - 0
  EXPECT_EQ(y[15], 15.0f);        // 1*15 - 0
  EXPECT_EQ(y[32], -3.5f);        // 2*0 - 7/2
  EXPECT_EQ(y[63], -1.5f);        // 2*1 - 3.5
  EXPECT_EQ(y[69], -16.5f);       // 3*5 - 63/2
  EXPECT_EQ(y[113], 188.5f);      // 63*3 - 0.5
  EXPECT_EQ(y[138], 150.0f);      // 17*10 - 20
  EXPECT_EQ(y[191], 164.0f);      // 33*5 - 1
  EXPECT_EQ(y[206], 664.0f);      // 48*14 - 8
  EXPECT_EQ(y[240], 19.5f);       // 5*7 - 15.5
  EXPECT_EQ(y[255], 19.5f);
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32, c = e / 64, l = e % 32;
    const int q = j % 2 == 0 ? l & 15 : 2 * c + (l >> 4);
    ASSERT_EQ(y[e], float(kSc[j] * q) - 0.5f * kMn[j]) << e;
  }
}

TEST(Quant, Q4_KWithInexactScales) {
  // d, dmin not powers of two: x = (d*sc)*q - (dmin*m) as ggml's C expression
  // evaluates it in float (the products are exact; the difference rounds once).
  std::vector<uint8_t> b(144, 0);
  put16(b.data(), 0x2e66);      // d    = 0.0999755859375
  put16(b.data() + 2, 0x3555);  // dmin = 0.333251953125
  std::memcpy(b.data() + 4, kScales12, 12);
  for (int i = 0; i < 128; ++i) b[16 + i] = static_cast<uint8_t>(i * 37 + 11);
  const auto y = deq(DType::Q4_K, b, 256);
  const float d = 0.0999755859375f, dmin = 0.333251953125f;
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32, c = e / 64, l = e % 32;
    const uint8_t byte = static_cast<uint8_t>((32 * c + l) * 37 + 11);
    const int q = j % 2 == 0 ? byte & 15 : byte >> 4;
    volatile float ds = d * float(kSc[j]);
    volatile float p = ds * float(q);
    volatile float mm = dmin * float(kMn[j]);
    ASSERT_EQ(y[e], p - mm) << e;
  }
}

TEST(Quant, Q5_KHandBlock) {
  std::vector<uint8_t> b(176, 0);
  put16(b.data(), 0x3c00);      // d = 1
  put16(b.data() + 2, 0x3800);  // dmin = 0.5
  std::memcpy(b.data() + 4, kScales12, 12);
  // qh[l] = 0xaa (bits 1,3,5,7: odd sub-blocks get +16) for even l, 0x55 for odd l.
  for (int l = 0; l < 32; ++l) b[16 + l] = l % 2 ? 0x55 : 0xaa;
  for (int i = 0; i < 128; ++i) b[48 + i] = static_cast<uint8_t>(i);
  const auto y = deq(DType::Q5_K, b, 256);
  EXPECT_EQ(y[0], 0.0f);     // sub-block 0, l = 0 (even: no bit 0): q = 0
  EXPECT_EQ(y[1], 17.0f);    // l = 1 (odd: bit 0): q = 1 + 16; 1*17 - 0
  EXPECT_EQ(y[32], 28.5f);   // sub-block 1, l = 0 (bit 1 set): q = 0 + 16; 2*16 - 3.5
  EXPECT_EQ(y[33], -3.5f);   // l = 1: no bit 1: q = 0
  EXPECT_EQ(y[240], 99.5f);  // sub-block 7, l = 16 (bit 7 set): q = 7 + 16; 5*23 - 15.5
  EXPECT_EQ(y[241], 19.5f);  // l = 17: q = 7; 35 - 15.5
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32, c = e / 64, l = e % 32;
    const int q = (j % 2 == 0 ? l & 15 : 2 * c + (l >> 4)) + (((l % 2) ^ (j % 2)) ? 16 : 0);
    ASSERT_EQ(y[e], float(kSc[j] * q) - 0.5f * kMn[j]) << e;
  }
}

TEST(Quant, Q6_KHandBlockSignedScalesAndQuants) {
  std::vector<uint8_t> b(210, 0);
  for (int i = 0; i < 128; ++i) b[i] = static_cast<uint8_t>(i);  // ql[i] = i
  for (int i = 0; i < 64; ++i) b[128 + i] = 0xe4;                // qh: bits 7..0 = 11 10 01 00
  const int8_t sc[16] = {1, -1, 2, -2, 127, -128, 3, 0, 5, 6, 7, 8, -9, 10, 11, -12};
  std::memcpy(b.data() + 192, sc, 16);
  put16(b.data() + 208, 0x3400);  // d = 0.25
  const auto y = deq(DType::Q6_K, b, 256);
  // Half 0 (ql[0..63] = 0..63), l < 32:
  //   e = l:      q = (l & 15) | 0<<4,           x = 0.25*sc[l/16]   * (q - 32)
  //   e = 32 + l: q = (l & 15) | 1<<4,           x = 0.25*sc[2+l/16] * (q - 32)
  //   e = 64 + l: q = (l >> 4) | 2<<4,           x = 0.25*sc[4+l/16] * (q - 32)
  //   e = 96 + l: q = (2 + (l >> 4)) | 3<<4,     x = 0.25*sc[6+l/16] * (q - 32)
  EXPECT_EQ(y[0], -8.0f);     // 0.25*1*(0-32)
  EXPECT_EQ(y[15], -4.25f);   // 0.25*1*(15-32)
  EXPECT_EQ(y[16], 8.0f);     // 0.25*-1*(0-32)
  EXPECT_EQ(y[31], 4.25f);
  EXPECT_EQ(y[32], -8.0f);    // 0.5*(16-32)
  EXPECT_EQ(y[47], -0.5f);    // 0.5*(31-32)
  EXPECT_EQ(y[48], 8.0f);     // -0.5*(16-32)
  EXPECT_EQ(y[63], 0.5f);
  EXPECT_EQ(y[64], 0.0f);     // 31.75*(32-32)
  EXPECT_EQ(y[80], -32.0f);   // 0.25*-128*(33-32)
  EXPECT_EQ(y[96], 13.5f);    // 0.75*(50-32)
  EXPECT_EQ(y[112], 0.0f);    // scale 0
  // Half 1 (ql[64 + i] = 64 + i, scales 5 6 7 8 -9 10 11 -12):
  EXPECT_EQ(y[128], -40.0f);  // 1.25*(0-32)
  EXPECT_EQ(y[144], -48.0f);  // 1.5*(0-32)
  EXPECT_EQ(y[175], -1.75f);  // 1.75*(31-32)
  EXPECT_EQ(y[192], -9.0f);   // -2.25*((4|32)-32)
  EXPECT_EQ(y[223], 12.5f);   // 2.5*((5|32)-32)
  EXPECT_EQ(y[224], 60.5f);   // 2.75*((6|48)-32)
  EXPECT_EQ(y[255], -69.0f);  // -3*((7|48)-32)
}

TEST(Quant, RandomBlocksMatchTheElementwiseDecoder) {
  std::mt19937 rng(11);
  for (DType t : kQuant) {
    const int be = dtype_block_elems(t), bb = dtype_block_bytes(t);
    const int64_t nb = 300;
    const auto b = random_blocks(t, nb, rng);
    const auto y = deq(t, b, nb * be);
    for (int64_t i = 0; i < nb; ++i)
      for (int e = 0; e < be; ++e)
        ASSERT_EQ(y[i * be + e], element(t, b.data() + i * bb, e, nullptr))
            << dtype_name(t) << " block " << i << " element " << e;
    // TensorView::to_f32 on a block-aligned range agrees.
    TensorView tv{"w", t, {nb * be}, b.data()};
    std::vector<float> part(2 * be);
    tv.to_f32(5 * be, 2 * be, part.data());
    for (int e = 0; e < 2 * be; ++e) ASSERT_EQ(part[e], y[5 * be + e]);
    EXPECT_THROW(tv.to_f32(1, be, part.data()), std::invalid_argument);
  }
}

// ---------------------------------------------------------------------------
// Quantization

TEST(Quant, QuantizeDequantizeErrorBounds) {
  // Gaussian rows (sigma 1, then with outliers). The bound is on the RMS error
  // over the RMS of the input, about 15% above what these quantizers (ggml's
  // reference rules, byte-identical to libggml's) measure on N(0,1):
  //   Q8_0 0.0053 (step max|x|/127 per 32: ~2.4/127/sqrt(12)), Q4_0 0.085,
  //   Q4_K 0.071, Q5_K 0.036, Q6_K 0.018.
  struct Case { DType t; double bound; };
  const Case cases[] = {{DType::Q8_0, 0.0062}, {DType::Q4_0, 0.098}, {DType::Q4_K, 0.082},
                        {DType::Q5_K, 0.041}, {DType::Q6_K, 0.020}};
  std::mt19937 rng(5);
  const int64_t n = 256 * 64;
  auto x = gaussian(n, rng);
  for (const Case& c : cases) {
    std::vector<uint8_t> q(row_bytes(c.t, n));
    quantize_row(c.t, x.data(), q.data(), n);
    const auto y = deq(c.t, q, n);
    double e2 = 0, x2 = 0;
    for (int64_t i = 0; i < n; ++i) {
      e2 += double(x[i] - y[i]) * (x[i] - y[i]);
      x2 += double(x[i]) * x[i];
    }
    const double rel = std::sqrt(e2 / x2);
    std::printf("  %-5s rms error / rms = %.4f (bound %.4f)\n", dtype_name(c.t), rel, c.bound);
    EXPECT_LE(rel, c.bound) << dtype_name(c.t);
    EXPECT_GT(rel, c.bound / 4) << dtype_name(c.t) << ": suspiciously exact";
  }
  // Outliers (one per 256 at 20 sigma) must not break any type: error per
  // element stays within the block's own step.
  for (int64_t i = 0; i < n; i += 256) x[i + (i / 256) % 256] = (i % 512 ? 20.0f : -20.0f);
  for (const Case& c : cases) {
    std::vector<uint8_t> q(row_bytes(c.t, n));
    quantize_row(c.t, x.data(), q.data(), n);
    const auto y = deq(c.t, q, n);
    for (int64_t i = 0; i < n; ++i) ASSERT_LE(std::fabs(x[i] - y[i]), 2.0f) << dtype_name(c.t) << " " << i;
  }
}

TEST(Quant, QuantizeEdgeCases) {
  std::mt19937 rng(9);
  for (DType t : kQuant) {
    const int be = dtype_block_elems(t);
    // Zeros stay zeros.
    std::vector<float> z(2 * be, 0.0f);
    std::vector<uint8_t> q(row_bytes(t, 2 * be));
    quantize_row(t, z.data(), q.data(), 2 * be);
    for (float v : deq(t, q, 2 * be)) ASSERT_EQ(v, 0.0f) << dtype_name(t);
    // Every element's error is at most about half a step of its sub-block:
    // checked loosely as |x - y| <= max|x| of the block / (levels - 1) (Q8_0: 127
    // levels per sign -> 1/127; 4-bit: 1/15 of the range 2*max -> 2/15; ...).
    const double frac = t == DType::Q8_0 ? 1.0 / 127 : t == DType::Q4_0 ? 2.0 / 15
                        : t == DType::Q4_K ? 2.0 / 15 : t == DType::Q5_K ? 2.0 / 31 : 2.0 / 63;
    auto x = gaussian(64 * be, rng, 3.0f);
    std::vector<uint8_t> qq(row_bytes(t, x.size()));
    quantize_row(t, x.data(), qq.data(), x.size());
    const auto y = deq(t, qq, x.size());
    for (size_t b = 0; b < x.size(); b += be) {
      float amax = 0;
      for (int e = 0; e < be; ++e) amax = std::fmax(amax, std::fabs(x[b + e]));
      for (int e = 0; e < be; ++e)
        ASSERT_LE(std::fabs(x[b + e] - y[b + e]), frac * amax * 1.01 + 1e-6) << dtype_name(t) << " " << b + e;
    }
  }
  // Q8_0: values on a half-exact grid with a code of magnitude 127 come back bit-exact.
  std::vector<float> g(32);
  for (int j = 0; j < 32; ++j) g[j] = 0.125f * float(j == 0 ? 127 : (j * 37) % 255 - 127);
  std::vector<uint8_t> q8(34);
  quantize_row(DType::Q8_0, g.data(), q8.data(), 32);
  EXPECT_EQ(get16(q8.data()), 0x3000);  // d = 0.125
  const auto back = deq(DType::Q8_0, q8, 32);
  for (int j = 0; j < 32; ++j) ASSERT_EQ(back[j], g[j]) << j;
  // Q4_0 follows ggml's rule: the largest magnitude is coded as -8 (its sign in d).
  std::vector<float> v4(32, 0.0f);
  v4[3] = 4.0f;
  v4[9] = -1.0f;
  std::vector<uint8_t> q4(18);
  quantize_row(DType::Q4_0, v4.data(), q4.data(), 32);
  EXPECT_EQ(get16(q4.data()), 0xb800);  // d = 4 / -8 = -0.5
  EXPECT_EQ(q4[2 + 3] & 15, 0);         // 4 / -0.5 = -8 -> code 0
  EXPECT_EQ(q4[2 + 9] & 15, 10);        // -1 / -0.5 = 2 -> code 10
  EXPECT_EQ(q4[2 + 0] & 15, 8);         // 0 -> code 8
}

TEST(Quant, ActivationQuantization) {
  // A32: d = max|x| / 127; q = rne(x / d).
  std::vector<float> x(64, 0.0f);
  x[0] = 2.54f;    // max of block 0: d = 0.02, q = 127
  x[1] = -1.27f;   // -63.5 -> -64 (ties to even)
  x[2] = 0.03f;    // 1.5 -> 2
  x[3] = 0.01f;    // 0.5 -> 0
  x[40] = -5.0f;   // block 1: d = 5/127, q = -127
  std::vector<int8_t> qs(64);
  float d[2];
  quant::quantize_a32(x.data(), 64, qs.data(), d);
  EXPECT_EQ(d[0], 2.54f / 127.0f);
  EXPECT_EQ(qs[0], 127);
  EXPECT_EQ(qs[1], -64);
  EXPECT_EQ(qs[2], 2);
  EXPECT_EQ(qs[3], 0);
  EXPECT_EQ(qs[40], -127);
  EXPECT_EQ(qs[41], 0);
  // Q8K: one scale per 256 and the sums of each 16 codes.
  std::mt19937 rng(4);
  auto g = gaussian(512, rng);
  quant::block_q8_K k[2];
  quant::quantize_q8K(g.data(), 512, k);
  for (int b = 0; b < 2; ++b) {
    float amax = 0;
    for (int i = 0; i < 256; ++i) amax = std::fmax(amax, std::fabs(g[256 * b + i]));
    EXPECT_EQ(k[b].d, amax / 127.0f);
    for (int s = 0; s < 16; ++s) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) {
        const int q = k[b].qs[16 * s + i];
        ASSERT_LE(std::fabs(g[256 * b + 16 * s + i] - k[b].d * q), k[b].d * 0.5001f);
        sum += q;
      }
      ASSERT_EQ(k[b].bsums[s], sum);
    }
  }
}

// ---------------------------------------------------------------------------
// Kernels

namespace {

struct Case {
  DType t;
  int64_t rows, cols;
};

// Bound on |kernel - float product| for one output row: the kernels replace
// each x_i by d_b * q_i with |x_i - d_b q_i| <= d_b / 2 (d_b = max|x| over the
// activation block b, /127: 32 elements for Q8_0/Q4_0, 256 for the K types),
// then compute the rest exactly in integers and round once per block: so
// |error| <= sum_b (d_b/2) sum_{i in b} |w_i|, plus float rounding (1e-5 of the
// sum of |terms|).
struct Bounds {
  double loose = 0, mag = 0;
};

Bounds bounds(DType t, const uint8_t* row, const float* x, int64_t cols) {
  const int be = dtype_block_elems(t), bb = dtype_block_bytes(t);
  const int ab = (t == DType::Q8_0 || t == DType::Q4_0) ? 32 : 256;
  Bounds B;
  for (int64_t a0 = 0; a0 < cols; a0 += ab) {
    float amax = 0;
    for (int i = 0; i < ab; ++i) amax = std::fmax(amax, std::fabs(x[a0 + i]));
    const double step = amax / 127.0;
    double wsum = 0;
    for (int i = 0; i < ab; ++i) {
      const int64_t c = a0 + i;
      float mag;
      const float w = element(t, row + (c / be) * bb, c % be, &mag);
      wsum += std::fabs(w);
      B.mag += mag * (std::fabs(x[c]) + step);
    }
    B.loose += step / 2 * 1.0001 * wsum;
  }
  return B;
}

}  // namespace

TEST(QuantKernels, EverySetMatchesScalarOnOddShapes) {
  std::mt19937 rng(17);
  std::vector<Case> cases;
  for (DType t : kQuant) {
    const int be = dtype_block_elems(t);
    std::vector<int64_t> cols = be == 32 ? std::vector<int64_t>{32, 64, 96, 224, 33 * 32}
                                         : std::vector<int64_t>{256, 512, 768, 1024, 1280, 9 * 256};
    for (int64_t c : cols)
      for (int64_t r : {1, 2, 3, 4, 5, 7, 8, 13, 37}) cases.push_back({t, r, c});
    // A long row: 1031*32 (the K types: 129*256 = 33024, the nearest whole super-blocks).
    for (int64_t r : {1, 6, 37}) cases.push_back({t, r, be == 32 ? 1031 * 32 : 129 * 256});
  }
  const auto sets = kern::supported();
  std::printf("  kernel sets:");
  for (auto* s : sets) std::printf(" %s", s->name);
  std::printf("\n");
  for (const Case& cs : cases) {
    // T = 1: the row-by-row dot products (matvec's); T > 1: the tiled GEMM.
    const bool long_row = cs.cols > 10000;
    const std::vector<int64_t> Ts = long_row ? std::vector<int64_t>{1, 5, 9} : std::vector<int64_t>{1, 5, 64};
    const int64_t rows = cs.rows, cols = cs.cols, TM = Ts.back(), ldx = cols + 32, ldy = rows + 3;
    const uint64_t rb = row_bytes(cs.t, cols);
    const auto wbuf = random_blocks(cs.t, rows * cols / dtype_block_elems(cs.t), rng);
    const kern::Mat w{cs.t, wbuf.data(), rows, cols};
    std::vector<float> x(TM * ldx);
    for (float& v : x) v = std::normal_distribution<float>(0.0f, 1.0f)(rng);
    const auto wf = deq(cs.t, wbuf, rows * cols);
    // The float product, and the bounds of the integer path, per (t, r).
    std::vector<double> fref(TM * rows);
    std::vector<Bounds> bnd(TM * rows);
    for (int64_t t = 0; t < TM; ++t)
      for (int64_t r = 0; r < rows; ++r) {
        double s = 0;
        for (int64_t c = 0; c < cols; ++c) s += double(wf[r * cols + c]) * x[t * ldx + c];
        fref[t * rows + r] = s;
        bnd[t * rows + r] = bounds(cs.t, wbuf.data() + r * rb, x.data() + t * ldx, cols);
      }
    // The scalar set's results do not depend on T either: one call for all.
    std::vector<float> sref(TM * ldy, 0.0f), mvref(rows);
    kern::kScalar.matmat(w, x.data(), TM, ldx, sref.data(), ldy, 0, rows);
    kern::kScalar.matvec(w, x.data(), mvref.data(), 0, rows);
    for (const kern::KernelSet* ks : sets) {
      SCOPED_TRACE(std::string(ks->name) + " " + dtype_name(cs.t) + " " + std::to_string(rows) + "x" +
                   std::to_string(cols));
      std::vector<std::vector<float>> got(Ts.size());
      std::vector<float> mv(rows);
      ks->matvec(w, x.data(), mv.data(), 0, rows);
      for (size_t k = 0; k < Ts.size(); ++k) {
        got[k].assign(TM * ldy, -1.0f);
        ks->matmat(w, x.data(), Ts[k], ldx, got[k].data(), ldy, 0, rows);
      }
      for (size_t k = 0; k < Ts.size(); ++k) {
        const int64_t T = Ts[k];
        for (int64_t t = 0; t < T; ++t)
          for (int64_t r = 0; r < rows; ++r) {
            const Bounds& B = bnd[t * rows + r];
            const float g = got[k][t * ldy + r];
            // Same integers as the scalar set, float sums in another order ->
            // 1e-5 of the sum of |terms|.
            const double tight = 1e-5 * B.mag + 1e-30;
            ASSERT_NEAR(g, sref[t * ldy + r], tight) << "matmat T=" << T << " t=" << t << " r=" << r;
            // Against the float product of the dequantized weights: the int8
            // rounding of x (see bounds()).
            ASSERT_NEAR(g, fref[t * rows + r], B.loose + tight) << "matmat vs float, T=" << T << " t=" << t;
            if (t == 0) {
              if (T == 1) {
                // T = 1 is matvec's computation, bit for bit.
                ASSERT_EQ(mv[r], g) << "matvec vs matmat r=" << r;
              } else {
                // The GEMM sums in another order than matvec.
                ASSERT_NEAR(mv[r], g, tight) << "matvec vs matmat T=" << T << " r=" << r;
              }
            }
            // The GEMM's result for (t, r) does not depend on T.
            if (T > 1 && k + 1 < Ts.size()) {
              ASSERT_EQ(g, got.back()[t * ldy + r]) << "T=" << T << " t=" << t;
            }
          }
        for (int64_t t = 0; t < TM; ++t)
          for (int64_t r = (t < T ? rows : 0); r < ldy; ++r)
            ASSERT_EQ(got[k][t * ldy + r], -1.0f) << "wrote outside its rows/inputs, T=" << T;
      }
      for (int64_t r = 0; r < rows; ++r) {
        const Bounds& B = bnd[r];
        ASSERT_NEAR(mv[r], mvref[r], 1e-5 * B.mag + 1e-30) << "matvec r=" << r;
        ASSERT_NEAR(mv[r], fref[r], B.loose + 1e-5 * B.mag + 1e-30) << "matvec vs float r=" << r;
      }
      // A row range that does not start at 0 writes only its own rows, the same bits.
      if (rows > 2) {
        std::vector<float> part(rows - 1, -7.0f);
        ks->matvec(w, x.data(), part.data(), 1, rows - 1);
        for (int64_t r = 1; r < rows - 1; ++r) ASSERT_EQ(part[r - 1], mv[r]);
        ASSERT_EQ(part[rows - 2], -7.0f);
        for (size_t k = 0; k < Ts.size(); ++k) {
          const int64_t T = Ts[k];
          std::vector<float> y2(T * ldy, -7.0f);
          ks->matmat(w, x.data(), T, ldx, y2.data(), ldy, 1, rows - 1);
          for (int64_t t = 0; t < T; ++t) {
            ASSERT_EQ(y2[t * ldy], -7.0f);
            for (int64_t r = 1; r < rows - 1; ++r) ASSERT_EQ(y2[t * ldy + r], got[k][t * ldy + r]) << "T=" << T;
            ASSERT_EQ(y2[t * ldy + rows - 1], -7.0f);
          }
        }
      }
    }
  }
}

TEST(QuantKernels, EverySetDequantizesBitExactly) {
  // to_f32 of every set gives dequantize_row's bits, for random blocks and for
  // the float types' every half.
  std::mt19937 rng(41);
  for (const kern::KernelSet* ks : kern::supported()) {
    for (DType t : kQuant) {
      const int be = dtype_block_elems(t);
      for (int64_t nb : {1, 3, 17, 64}) {
        const auto b = random_blocks(t, nb, rng);
        const auto ref = deq(t, b, nb * be);
        std::vector<float> got(nb * be);
        ks->to_f32(t, b.data(), got.data(), nb * be);
        ASSERT_EQ(std::memcmp(got.data(), ref.data(), got.size() * 4), 0) << ks->name << " " << dtype_name(t) << " nb=" << nb;
      }
    }
    std::vector<uint16_t> all(65536);
    for (int i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
    for (DType t : {DType::F16, DType::BF16}) {
      std::vector<float> got(65536), ref(65536);
      ks->to_f32(t, all.data(), got.data(), 65536);
      dequantize_row(t, all.data(), ref.data(), 65536);
      for (int i = 0; i < 65536; ++i)
        if (!std::isnan(ref[i])) {
          ASSERT_EQ(std::memcmp(&got[i], &ref[i], 4), 0) << ks->name << " " << dtype_name(t) << " " << i;
        }
    }
  }
}

TEST(QuantKernels, ScalarMatchesTheFloatProductOnQuantizedWeights) {
  // Realistic weights (quantized Gaussians) through the reference kernels:
  // the int8 activation error stays within the stated bound and is small in
  // relative terms (Q8_0 ~0.3%, well under 2% of the RMS output for all).
  std::mt19937 rng(23);
  for (DType t : kQuant) {
    const int64_t rows = 64, cols = 2048;
    const auto wfl = gaussian(rows * cols, rng);
    std::vector<uint8_t> wq(rows * row_bytes(t, cols));
    quantize_row(t, wfl.data(), wq.data(), rows * cols);
    const auto wf = deq(t, wq, rows * cols);
    const auto x = gaussian(cols, rng);
    std::vector<float> y(rows);
    kern::kScalar.matvec(kern::Mat{t, wq.data(), rows, cols}, x.data(), y.data(), 0, rows);
    double e2 = 0, y2 = 0;
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t c = 0; c < cols; ++c) s += double(wf[r * cols + c]) * x[c];
      const Bounds B = bounds(t, wq.data() + r * row_bytes(t, cols), x.data(), cols);
      ASSERT_NEAR(y[r], s, B.loose + 1e-5 * B.mag) << dtype_name(t) << " r=" << r;
      e2 += (y[r] - s) * (y[r] - s);
      y2 += s * s;
    }
    EXPECT_LT(std::sqrt(e2 / y2), 0.02) << dtype_name(t);
  }
}

TEST(QuantKernels, ChangedInputInTheSameBufferIsRequantized) {
  // The kernels remember the last input they quantized (per thread); a new
  // value in the same buffer must not reuse it.
  std::mt19937 rng(31);
  for (DType t : kQuant) {
    const int64_t rows = 8, cols = 512;
    const auto wb = random_blocks(t, rows * cols / dtype_block_elems(t), rng);
    const kern::Mat w{t, wb.data(), rows, cols};
    auto x = gaussian(3 * cols, rng);
    for (const kern::KernelSet* ks : kern::supported()) {
      std::vector<float> a(rows), b(rows), ref(rows), mm(3 * rows), mmref(3 * rows);
      ks->matvec(w, x.data(), a.data(), 0, rows);
      x[cols - 1] += 0.5f;  // one element of the last block
      ks->matvec(w, x.data(), b.data(), 0, rows);
      kern::kScalar.matvec(w, x.data(), ref.data(), 0, rows);
      for (int64_t r = 0; r < rows; ++r) {
        const Bounds B = bounds(t, wb.data() + r * row_bytes(t, cols), x.data(), cols);
        ASSERT_NEAR(b[r], ref[r], 1e-5 * B.mag) << ks->name << " " << dtype_name(t);
      }
      // Batched, the same buffer: change the last row only.
      ks->matmat(w, x.data(), 3, cols, mm.data(), rows, 0, rows);
      x[3 * cols - 5] -= 1.0f;
      ks->matmat(w, x.data(), 3, cols, mm.data(), rows, 0, rows);
      kern::kScalar.matmat(w, x.data(), 3, cols, mmref.data(), rows, 0, rows);
      for (int64_t i = 0; i < 3 * rows; ++i) {
        const Bounds B = bounds(t, wb.data() + (i % rows) * row_bytes(t, cols), x.data() + (i / rows) * cols, cols);
        ASSERT_NEAR(mm[i], mmref[i], 1e-5 * B.mag) << ks->name << " " << dtype_name(t);
      }
      // Same input, two weight types sharing the activation format.
      const DType other = t == DType::Q4_K ? DType::Q6_K : t == DType::Q8_0 ? DType::Q4_0 : t;
      const auto wb2 = random_blocks(other, rows * cols / dtype_block_elems(other), rng);
      std::vector<float> c1(rows), c2(rows);
      ks->matvec(kern::Mat{other, wb2.data(), rows, cols}, x.data(), c1.data(), 0, rows);
      kern::kScalar.matvec(kern::Mat{other, wb2.data(), rows, cols}, x.data(), c2.data(), 0, rows);
      for (int64_t r = 0; r < rows; ++r) {
        const Bounds B = bounds(other, wb2.data() + r * row_bytes(other, cols), x.data(), cols);
        ASSERT_NEAR(c1[r], c2[r], 1e-5 * B.mag) << ks->name << " " << dtype_name(other);
      }
    }
  }
}

TEST(QuantKernels, TiledGemmEveryTAndTail) {
  // The batched path of every set against the scalar reference, on T values
  // around the tile sizes (the tiles are 8 inputs with AVX-512, 4 with AVX2,
  // then 4/2/1 for the rest), weight rows around the panels (16 rows with
  // AVX-512, 8 with AVX2), and columns around the 512-column packed chunk.
  // Also: the pre-quantized entry points give the float ones' bits, and
  // results do not depend on T or the row range.
  std::mt19937 rng(53);
  const std::vector<int64_t> Ts = {1, 2, 3, 4, 5, 7, 8, 9, 16, 63, 64, 65, 130};
  const int64_t TM = 130;
  for (DType ty : kQuant) {
    const int be = dtype_block_elems(ty);
    const std::vector<int64_t> colss =
        be == 32 ? std::vector<int64_t>{32, 96, 512, 544, 1056} : std::vector<int64_t>{256, 768, 1280};
    for (int64_t cols : colss) {
      for (int64_t rows : {1, 2, 7, 8, 9, 15, 16, 17, 33, 47}) {
        const int64_t ldx = cols + 5, ldy = rows + 2;
        const uint64_t rb = row_bytes(ty, cols);
        const auto wbuf = random_blocks(ty, rows * cols / be, rng);
        const kern::Mat w{ty, wbuf.data(), rows, cols};
        const auto x = gaussian(TM * ldx, rng);
        // Tolerance per (t, r): 1e-5 of the sum of |w| (|x| + activation step).
        std::vector<float> wmag(rows * cols);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c)
            element(ty, wbuf.data() + r * rb + (c / be) * dtype_block_bytes(ty), static_cast<int>(c % be),
                    &wmag[r * cols + c]);
        const int ab = be == 32 ? 32 : 256;
        std::vector<double> tol(TM * rows);
        for (int64_t t = 0; t < TM; ++t) {
          std::vector<float> step(cols);
          for (int64_t a0 = 0; a0 < cols; a0 += ab) {
            float amax = 0;
            for (int i = 0; i < ab; ++i) amax = std::fmax(amax, std::fabs(x[t * ldx + a0 + i]));
            for (int i = 0; i < ab; ++i) step[a0 + i] = amax / 127.0f;
          }
          for (int64_t r = 0; r < rows; ++r) {
            double m = 0;
            for (int64_t c = 0; c < cols; ++c) m += wmag[r * cols + c] * (std::fabs(x[t * ldx + c]) + step[c]);
            tol[t * rows + r] = 1e-5 * m + 1e-30;
          }
        }
        std::vector<float> ref(TM * ldy);
        kern::kScalar.matmat(w, x.data(), TM, ldx, ref.data(), ldy, 0, rows);
        for (const kern::KernelSet* ks : kern::supported()) {
          SCOPED_TRACE(std::string(ks->name) + " " + dtype_name(ty) + " " + std::to_string(rows) + "x" +
                       std::to_string(cols));
          // The pre-quantized batch form, as linear_multi makes it (rows in two calls).
          const uint64_t bytes = ks->batch_bytes(ty, TM, cols);
          ASSERT_EQ(bytes % 64, 0u);
          uint8_t* xb = static_cast<uint8_t*>(std::aligned_alloc(64, bytes));
          ks->quantize_batch(ty, x.data(), ldx, cols, 0, 77, xb);
          ks->quantize_batch(ty, x.data(), ldx, cols, 77, TM, xb);
          std::vector<float> full(TM * ldy, -1.0f);
          ks->matmat_qa(w, xb, TM, full.data(), ldy, 0, rows);
          for (int64_t T : Ts) {
            std::vector<float> y(T * ldy, -1.0f), yq(T * ldy, -1.0f);
            ks->matmat(w, x.data(), T, ldx, y.data(), ldy, 0, rows);
            ks->matmat_qa(w, xb, T, yq.data(), ldy, 0, rows);
            for (int64_t t = 0; t < T; ++t) {
              for (int64_t r = 0; r < rows; ++r) {
                const float g = y[t * ldy + r];
                ASSERT_NEAR(g, ref[t * ldy + r], tol[t * rows + r]) << "T=" << T << " t=" << t << " r=" << r;
                ASSERT_NEAR(yq[t * ldy + r], ref[t * ldy + r], tol[t * rows + r]) << "qa T=" << T << " t=" << t;
                // The GEMM's result for (t, r) depends on neither T nor the
                // entry point (matmat at T = 1 is matvec's computation).
                ASSERT_EQ(yq[t * ldy + r], full[t * ldy + r]) << "depends on T: T=" << T << " t=" << t << " r=" << r;
                if (T > 1) {
                  ASSERT_EQ(g, yq[t * ldy + r]) << "float vs pre-quantized entry, T=" << T << " t=" << t;
                }
              }
              for (int64_t r = rows; r < ldy; ++r) {
                ASSERT_EQ(y[t * ldy + r], -1.0f) << "wrote past its rows";
                ASSERT_EQ(yq[t * ldy + r], -1.0f) << "wrote past its rows";
              }
            }
          }
          // The row form.
          uint8_t* xq = static_cast<uint8_t*>(std::aligned_alloc(64, ks->act_row_bytes(ty, cols)));
          ks->quantize_act(ty, x.data(), cols, xq);
          // matvec_qa is matvec, bit for bit.
          std::vector<float> mv(rows), mvq(rows);
          ks->matvec(w, x.data(), mv.data(), 0, rows);
          ks->matvec_qa(w, xq, mvq.data(), 0, rows);
          for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(mv[r], mvq[r]) << "matvec_qa r=" << r;
          // A row range starting inside a panel: the same bits for its rows only.
          if (rows > 4) {
            const int64_t r0 = 3, r1 = rows - 1, T = 11;
            std::vector<float> y(T * ldy, -7.0f);
            ks->matmat_qa(w, xb, T, y.data(), ldy, r0, r1);
            for (int64_t t = 0; t < T; ++t)
              for (int64_t r = 0; r < ldy; ++r) {
                if (r >= r0 && r < r1) ASSERT_EQ(y[t * ldy + r], full[t * ldy + r]) << "range t=" << t << " r=" << r;
                else ASSERT_EQ(y[t * ldy + r], -7.0f) << "range wrote row " << r;
              }
          }
          std::free(xq);
          std::free(xb);
        }
      }
    }
  }
}

TEST(QuantKernels, LinearMultiQuantizesOnceAndMatchesTheKernels) {
  // ops.cpp quantizes the input itself (per form: Q8_0/Q4_0, K types) and
  // splits rows over the pool; the results are the kernels' own bits.
  std::mt19937 rng(61);
  const int64_t cols = 768;  // whole blocks of every type
  ThreadPool pool(3);
  const kern::KernelSet& k = kern::kernels();
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<kern::Mat> mats;
  const DType types[] = {DType::Q8_0, DType::Q4_K, DType::Q4_0, DType::BF16, DType::Q6_K};
  const int64_t rows_of[] = {37, 64, 5, 19, 130};
  for (int i = 0; i < 5; ++i) {
    const auto wf = gaussian(rows_of[i] * cols, rng, 0.05f);
    bufs.emplace_back(rows_of[i] * row_bytes(types[i], cols));
    quantize_row(types[i], wf.data(), bufs.back().data(), rows_of[i] * cols);
  }
  for (int i = 0; i < 5; ++i) mats.push_back(kern::Mat{types[i], bufs[i].data(), rows_of[i], cols});
  for (int64_t T : {1, 2, 3, 4, 37, 64}) {
    const auto x = gaussian(T * cols, rng);
    std::vector<std::vector<float>> ys(5);
    std::vector<LinearOut> outs;
    for (int i = 0; i < 5; ++i) {
      ys[i].assign(T * rows_of[i], -1.0f);
      outs.push_back({&mats[i], ys[i].data()});
    }
    linear_multi(pool, x.data(), T, outs);
    for (int i = 0; i < 5; ++i) {
      std::vector<float> ref(T * rows_of[i]);
      if (T == 1 || (T <= 3 && dtype_is_quantized(types[i]))) {  // 2-3 quantized rows: matvec each
        for (int64_t t = 0; t < T; ++t)
          k.matvec(mats[i], x.data() + t * cols, ref.data() + t * rows_of[i], 0, rows_of[i]);
      } else {
        k.matmat(mats[i], x.data(), T, cols, ref.data(), rows_of[i], 0, rows_of[i]);
      }
      for (int64_t j = 0; j < T * rows_of[i]; ++j)
        ASSERT_EQ(ys[i][j], ref[j]) << k.name << " " << dtype_name(types[i]) << " T=" << T << " j=" << j;
    }
  }
}

// ---------------------------------------------------------------------------
// Against ggml itself, when its library is at hand: DORY_GGML_BASE=path to a
// libggml-base.so (e.g. node-llama-cpp's prebuilt linux-x64 package). Random
// blocks must dequantize to the same floats bit for bit, and Gaussian data
// (with scaled, sparse and outlier blocks) must quantize to the same bytes as
// quantize_row_*_ref.
#include <dlfcn.h>

TEST(QuantGgml, SameBitsAsLibggmlWhenAvailable) {
  const char* lib = std::getenv("DORY_GGML_BASE");
  if (!lib) GTEST_SKIP() << "set DORY_GGML_BASE to a libggml-base.so to compare with ggml";
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << dlerror();
  using Deq = void (*)(const void*, float*, int64_t);
  using Qnt = void (*)(const float*, void*, int64_t);
  const struct { DType t; const char* deq; const char* q; } fns[] = {
      {DType::Q8_0, "dequantize_row_q8_0", "quantize_row_q8_0_ref"},
      {DType::Q4_0, "dequantize_row_q4_0", "quantize_row_q4_0_ref"},
      {DType::Q4_K, "dequantize_row_q4_K", "quantize_row_q4_K_ref"},
      {DType::Q5_K, "dequantize_row_q5_K", "quantize_row_q5_K_ref"},
      {DType::Q6_K, "dequantize_row_q6_K", "quantize_row_q6_K_ref"}};
  std::mt19937 rng(1);
  for (const auto& f : fns) {
    auto gdeq = reinterpret_cast<Deq>(dlsym(h, f.deq));
    auto gq = reinterpret_cast<Qnt>(dlsym(h, f.q));
    ASSERT_TRUE(gdeq && gq) << f.deq;
    const int be = dtype_block_elems(f.t), bb = dtype_block_bytes(f.t);
    const int64_t nb = 4000, n = nb * be;
    const auto b = random_blocks(f.t, nb, rng);
    std::vector<float> y1(n), y2(n);
    dequantize_row(f.t, b.data(), y1.data(), n);
    gdeq(b.data(), y2.data(), n);
    ASSERT_EQ(std::memcmp(y1.data(), y2.data(), n * 4), 0) << dtype_name(f.t) << " dequantization";
    auto x = gaussian(n, rng);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t blk = i / be;
      if (blk % 7 == 0) x[i] *= 1e-3f;
      if (blk % 7 == 1) x[i] *= 300.0f;
      if (blk % 11 == 3 && i % 5) x[i] = 0.0f;
      if (i % 977 == 0) x[i] *= 40.0f;
    }
    std::vector<uint8_t> q1(nb * bb), q2(nb * bb);
    quantize_row(f.t, x.data(), q1.data(), n);
    gq(x.data(), q2.data(), n);
    for (int64_t i = 0; i < nb; ++i)
      ASSERT_EQ(std::memcmp(&q1[i * bb], &q2[i * bb], bb), 0) << dtype_name(f.t) << " quantization, block " << i;
  }
  dlclose(h);
}
