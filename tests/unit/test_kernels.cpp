// Every kernel set this CPU supports against the scalar reference, on odd
// shapes (tails of every width) and every weight dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "tensor/kernels.h"
#include "tensor/quant.h"

using namespace dory;

namespace {

std::vector<uint8_t> random_weights(DType d, int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint8_t> buf(n * dtype_size(d));
  for (int64_t i = 0; i < n; ++i) {
    float f = nd(rng);
    if (d == DType::F32) {
      std::memcpy(&buf[i * 4], &f, 4);
    } else if (d == DType::BF16) {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      uint16_t h = static_cast<uint16_t>(u >> 16);
      std::memcpy(&buf[i * 2], &h, 2);
    } else {
      // A half with a random exponent near 1 and random mantissa (incl. subnormals).
      uint16_t h = static_cast<uint16_t>((rng() & 0x83ff) | ((rng() % 20) << 10));
      std::memcpy(&buf[i * 2], &h, 2);
    }
  }
  return buf;
}

}  // namespace

TEST(Kernels, EverySetMatchesScalarOnOddShapes) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const auto sets = kern::supported();
  ASSERT_GE(sets.size(), 1u);
  for (const kern::KernelSet* ks : sets) {
    for (DType d : {DType::F32, DType::F16, DType::BF16}) {
      for (int64_t cols : {1, 7, 8, 15, 16, 17, 33, 511, 513, 1031}) {
        for (int64_t rows : {1, 3, 4, 5, 9, 37}) {
          SCOPED_TRACE(std::string(ks->name) + " " + dtype_name(d) + " " + std::to_string(rows) +
                       "x" + std::to_string(cols));
          auto wbuf = random_weights(d, rows * cols, rng);
          kern::Mat w{d, wbuf.data(), rows, cols};
          const std::vector<float> wf = TensorView{"w", d, {rows, cols}, wbuf.data()}.to_f32();
          // T below kMatmatFewRows (8) runs the few-rows path (whose rows equal matvec's bits), 8 and
          // 13 the blocked one.
          const int64_t T = rows == 1 ? 1 : rows == 3 ? 2 : rows == 4 ? 3 : rows == 5 ? 5 : rows == 9 ? 8 : 13;
          std::vector<float> x(T * cols);
          for (float& v : x) v = nd(rng);
          std::vector<float> ref(T * rows), got(T * rows), mv(rows), mvref(rows);
          // A set that rounds BF16 products' input to bf16 (avx512bf16) against the
          // scalar product of the rounded input, matvec and every batch size alike.
          std::vector<float> xr = x;
          if (ks->bf16_input && d == DType::BF16)
            for (float& v : xr) {
              uint16_t h;
              quantize_row(DType::BF16, &v, &h, 1);  // round to nearest even
              v = bf16_to_f32(h);
            }
          kern::kScalar.matmat(w, xr.data(), T, cols, ref.data(), rows, 0, rows);
          ks->matmat(w, x.data(), T, cols, got.data(), rows, 0, rows);
          kern::kScalar.matvec(w, xr.data(), mvref.data(), 0, rows);
          ks->matvec(w, x.data(), mv.data(), 0, rows);
          for (int64_t t = 0; t < T; ++t)
            for (int64_t r = 0; r < rows; ++r) {
              // f32 sums in a different order: allow 1e-5 of the sum of |terms|.
              float mag = 0;
              for (int64_t c = 0; c < cols; ++c) mag += std::fabs(wf[r * cols + c] * xr[t * cols + c]);
              const float tol = 1e-5f * mag + 1e-6f;
              ASSERT_NEAR(got[t * rows + r], ref[t * rows + r], tol) << "matmat t=" << t;
              if (t == 0) {
                ASSERT_NEAR(mv[r], mvref[r], tol) << "matvec";
                if (T < kern::kMatmatFewRows) {
                  ASSERT_EQ(got[r], mv[r]) << "a few rows: each as matvec's";
                }
              }
            }
          // A row range that does not start at 0 writes only its own rows.
          if (rows > 2) {
            std::vector<float> part(rows - 1, -7.0f);
            ks->matvec(w, x.data(), part.data(), 1, rows - 1);
            for (int64_t r = 1; r < rows - 1; ++r) ASSERT_NEAR(part[r - 1], mvref[r], 1e-3f);
            ASSERT_EQ(part[rows - 2], -7.0f);
          }
        }
      }
    }
  }
}

TEST(Kernels, DotAndAxpyMatchScalar) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const kern::KernelSet* ks : kern::supported()) {
    for (int64_t n : {0, 1, 15, 16, 17, 255, 256, 257}) {
      std::vector<float> a(n), b(n), y1(n), y2(n);
      for (int64_t i = 0; i < n; ++i) {
        a[i] = nd(rng);
        b[i] = nd(rng);
        y1[i] = y2[i] = nd(rng);
      }
      EXPECT_NEAR(ks->dot(a.data(), b.data(), n), kern::kScalar.dot(a.data(), b.data(), n),
                  1e-4f * (n + 1))
          << ks->name << " n=" << n;
      ks->axpy(0.37f, a.data(), y1.data(), n);
      kern::kScalar.axpy(0.37f, a.data(), y2.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(y1[i], y2[i], 1e-6f) << ks->name;
    }
  }
}

TEST(Kernels, HalfTailsDecodeLikeTheReference) {
  // Every half bit pattern through the SIMD tail path (cols=1) and block path.
  std::vector<uint16_t> all(65536);
  for (int i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  for (const kern::KernelSet* ks : kern::supported()) {
    float one = 1.0f;
    for (int i = 0; i < 65536; ++i) {
      if (((i >> 10) & 0x1f) == 31) continue;  // inf/nan: compared below by class
      float got, ref = dory::f16_to_f32(all[i]);
      ks->matvec(kern::Mat{DType::F16, &all[i], 1, 1}, &one, &got, 0, 1);
      ASSERT_EQ(got, ref) << ks->name << " half 0x" << std::hex << i;
    }
  }
}

// The attention kernels (scores and weighted values for the query heads of a GQA
// group over strided cache rows) against the scalar set, on odd shapes.
TEST(Kernels, AttentionKernelsMatchScalar) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const kern::KernelSet* ks : kern::supported()) {
    for (int nq : {1, 2, 3, 4, 5, 8})
      for (int64_t hd : {1, 7, 16, 64, 65, 256})
        for (int64_t n : {1, 3, 4, 5, 17}) {
          SCOPED_TRACE(std::string(ks->name) + " nq " + std::to_string(nq) + " hd " + std::to_string(hd) + " n " +
                       std::to_string(n));
          const int64_t stride = hd * 2 + 3, lds = n + 2;
          std::vector<float> q(nq * hd), kv(n * stride), w(nq * lds);
          for (float& x : q) x = nd(rng);
          for (float& x : kv) x = nd(rng);
          for (float& x : w) x = nd(rng);
          std::vector<float> s_ref(nq * lds, -9.0f), s_got(nq * lds, -9.0f);
          kern::kScalar.attn_scores(q.data(), nq, kv.data(), stride, n, hd, s_ref.data(), lds);
          ks->attn_scores(q.data(), nq, kv.data(), stride, n, hd, s_got.data(), lds);
          for (int i = 0; i < nq; ++i)
            for (int64_t j = 0; j < lds; ++j) {
              if (j >= n) {
                ASSERT_EQ(s_got[i * lds + j], -9.0f) << "wrote past n";
                continue;
              }
              float mag = 0;
              for (int64_t d = 0; d < hd; ++d) mag += std::fabs(q[i * hd + d] * kv[j * stride + d]);
              ASSERT_NEAR(s_got[i * lds + j], s_ref[i * lds + j], 1e-5f * mag + 1e-6f);
            }
          for (bool add : {false, true}) {
            std::vector<float> o_ref(nq * hd, 0.5f), o_got(nq * hd, 0.5f);
            kern::kScalar.attn_values(w.data(), lds, nq, kv.data(), stride, n, hd, o_ref.data(), add);
            ks->attn_values(w.data(), lds, nq, kv.data(), stride, n, hd, o_got.data(), add);
            for (int i = 0; i < nq; ++i)
              for (int64_t d = 0; d < hd; ++d) {
                float mag = add ? 0.5f : 0.0f;
                for (int64_t j = 0; j < n; ++j) mag += std::fabs(w[i * lds + j] * kv[j * stride + d]);
                ASSERT_NEAR(o_got[i * hd + d], o_ref[i * hd + d], 1e-5f * mag + 1e-6f) << "add " << add;
              }
          }
        }
  }
}

TEST(Kernels, SigmoidMatchesStdExp) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> ud(-30.0f, 30.0f), us(0.1f, 4.0f);
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x, s;
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 0.5f, -0.5f, 20.0f, -20.0f, 87.0f, -87.0f, 88.5f, -88.5f, 89.0f,
                  -89.0f, 200.0f, -200.0f, inf, -inf}) {
    x.push_back(v);
    s.push_back(1.0f);
  }
  for (int i = 0; i < 4000; ++i) {
    x.push_back(ud(rng));
    s.push_back(us(rng));
  }
  for (const kern::KernelSet* ks : kern::supported()) {
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(17), static_cast<int64_t>(x.size())}) {
      std::vector<float> got(n + 1, -3.0f), ref(n);
      ks->sigmoid(x.data(), s.data(), got.data(), n);
      kern::kScalar.sigmoid(x.data(), s.data(), ref.data(), n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(got[i], ref[i], 1e-6f * ref[i] + 1e-37f) << ks->name << " x=" << x[i] << " s=" << s[i];
      ASSERT_EQ(got[n], -3.0f) << ks->name << ": wrote past n";
    }
    // NaN stays NaN; in place.
    std::vector<float> v = {std::nanf(""), 1.0f}, one = {1.0f, 1.0f};
    ks->sigmoid(v.data(), one.data(), v.data(), 2);
    EXPECT_TRUE(std::isnan(v[0])) << ks->name;
    EXPECT_NEAR(v[1], 1.0f / (1.0f + std::exp(-1.0f)), 1e-7f) << ks->name;
  }
}
