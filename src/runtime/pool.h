#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
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

}  // namespace dory
