#include <gtest/gtest.h>

#include "dory/generate.h"

using dory::stop_holdback;

TEST(Generate, StopHoldbackKeepsOnlyPossibleStopPrefixes) {
  const std::vector<std::string> stops{"</s>", "\n\nUser:"};
  EXPECT_EQ(stop_holdback("hello", stops), 0u);
  EXPECT_EQ(stop_holdback("hello<", stops), 1u);
  EXPECT_EQ(stop_holdback("hello</", stops), 2u);
  EXPECT_EQ(stop_holdback("hello</s", stops), 3u);
  EXPECT_EQ(stop_holdback("a\n\nUse", stops), 5u);
  EXPECT_EQ(stop_holdback("a\n", stops), 1u);
  EXPECT_EQ(stop_holdback("", stops), 0u);
  EXPECT_EQ(stop_holdback("x", {}), 0u);
  EXPECT_EQ(stop_holdback("ab", {""}), 0u);  // an empty stop string holds nothing back
}
