#include <gtest/gtest.h>

#include <atomic>

#include "runtime/pool.h"

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
