#pragma once
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

namespace dory {

// A fixed set of worker threads. run() hands out task indices from a shared
// counter; the calling thread works too and returns when every task is done.
// One run() at a time (callers serialize; a Session is used by one thread).
//
// Decode calls run() about 300 times a token, a few microseconds apart, so
// sleeping on a condition variable between runs (a futex wake is 5-50 us)
// costs more than the gaps: workers and the waiting caller spin (with pause)
// for up to ~0.1 ms before they sleep.
class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // total threads, the caller included
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  void run(int64_t n_tasks, const std::function<void(int64_t task)>& fn);

  // Splits [0, n) into about size()*4 ranges of at least `grain` items.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  static int default_threads();

 private:
  void worker();
  void work_on_current();

  int n_threads_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  std::atomic<uint64_t> generation_{0};  // written under mu_, read by spinners
  bool stop_ = false;
  int sleepers_ = 0;                      // workers waiting on cv_start_ (under mu_)
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_tasks_ = 0;
  std::atomic<int64_t> next_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<int> busy_workers_{0};      // changed under mu_, read by the spinning caller
};

// Guided scheduling of [0, n): each claim takes a contiguous range of the
// remaining items / `parts` (at least `min_size`), so ranges start long and
// shrink as the work runs out, and never cross one of `cuts` (ascending, the
// last one n). For streams through memory, where every new range restarts the
// stream: long ranges first, short ones to even out the end. Claims from any
// number of threads at once.
class GuidedRanges {
 public:
  GuidedRanges(std::span<const int64_t> cuts, int64_t min_size, int64_t parts)
      : cuts_(cuts), min_(std::max<int64_t>(1, min_size)), parts_(std::max<int64_t>(1, parts)) {}

  // The next range [first, second); empty (first == second) once all are taken.
  std::pair<int64_t, int64_t> claim() {
    const int64_t n = cuts_.empty() ? 0 : cuts_.back();
    int64_t cur = next_.load(std::memory_order_relaxed);
    for (;;) {
      if (cur >= n) return {n, n};
      int64_t e = cur + std::max(min_, (n - cur) / parts_);
      for (int64_t c : cuts_)
        if (c > cur) {
          e = std::min(e, c);
          break;
        }
      if (next_.compare_exchange_weak(cur, e, std::memory_order_relaxed)) return {cur, e};
    }
  }

 private:
  std::span<const int64_t> cuts_;
  int64_t min_, parts_;
  std::atomic<int64_t> next_{0};
};

}  // namespace dory
