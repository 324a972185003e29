#include <gtest/gtest.h>

#include <cmath>

#include "tensor/dtype.h"

TEST(DType, HalfDecodesKnownValues) {
  EXPECT_EQ(dory::f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(dory::f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(dory::f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(dory::f16_to_f32(0x7bff), 65504.0f);
}
