#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

#include "backend/cpu/pool.h"

TEST(ThreadPool, EveryTaskRunsExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    dory::ThreadPool pool(threads);
    for (int rep = 0; rep < 300; ++rep) {
      const int n = 1 + rep % 97;
      std::vector<std::atomic<int>> hits(n);
      pool.run(n, [&](int64_t t) { hits[t].fetch_add(1); });
      for (int i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " threads, rep " << rep;
    }
  }
}

TEST(ThreadPool, ParallelForCoversTheRange) {
  dory::ThreadPool pool(3);
  for (int64_t n : {1, 2, 7, 100, 1001}) {
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, 4, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1);
  }
}

TEST(GuidedRanges, CoverEveryItemOnceWithinCutsShrinkingToTheMinimum) {
  dory::ThreadPool pool(4);
  const std::vector<std::vector<int64_t>> cut_sets = {{1}, {10}, {4096, 5120, 6144, 10240}, {3, 1000, 1001, 5000}};
  for (const auto& cuts : cut_sets) {
    const int64_t n = cuts.back();
    std::vector<std::atomic<int>> hits(n);
    std::vector<std::pair<int64_t, int64_t>> got;
    std::mutex mu;
    dory::GuidedRanges ranges(cuts, 32, 8);
    pool.run(pool.size(), [&](int64_t) {
      for (auto r = ranges.claim(); r.first < r.second; r = ranges.claim()) {
        for (int64_t i = r.first; i < r.second; ++i) hits[i].fetch_add(1);
        std::lock_guard<std::mutex> lk(mu);
        got.push_back(r);
      }
    });
    EXPECT_EQ(ranges.claim(), std::make_pair(n, n));  // all taken: empty from then on
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "item " << i << " of " << n;
    std::sort(got.begin(), got.end());
    for (size_t k = 0; k < got.size(); ++k) {
      const auto [b, e] = got[k];
      const int64_t cut = *std::upper_bound(cuts.begin(), cuts.end(), b);  // the end of b's part
      EXPECT_LE(e, cut) << "range [" << b << ", " << e << ") crosses the cut " << cut;
      // At least the minimum unless cut short by a cut; never more than a
      // share of what was left when it was taken.
      if (e < cut) {
        EXPECT_GE(e - b, 32) << b;
      }
      EXPECT_LE(e - b, std::max<int64_t>(32, (n - b) / 8)) << b;
    }
    if (n == 10240) {
      // Long first: the first range is n / 8 items, the last one at most the minimum.
      EXPECT_EQ(got.front(), std::make_pair(int64_t{0}, int64_t{1280}));
      EXPECT_LE(got.back().second - got.back().first, 32);
    }
  }
}
