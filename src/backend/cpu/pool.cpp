#include "backend/cpu/pool.h"

#include <algorithm>

namespace dory {

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this] { worker(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : threads_) t.join();
}

int ThreadPool::default_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n ? static_cast<int>(n) : 1;
}

void ThreadPool::work_on_current() {
  for (;;) {
    int64_t t = next_.fetch_add(1, std::memory_order_relaxed);
    if (t >= n_tasks_) break;
    (*fn_)(t);
    done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

namespace {
// ~0.1 ms of pause instructions (a pause is 20-140 cycles depending on the core).
constexpr int kSpins = 4000;
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

void ThreadPool::worker() {
  uint64_t seen = 0;
  for (;;) {
    for (int i = 0; i < kSpins && generation_.load(std::memory_order_acquire) == seen; ++i) cpu_relax();
    {
      std::unique_lock<std::mutex> lk(mu_);
      if (!stop_ && generation_.load() == seen) {
        ++sleepers_;
        cv_start_.wait(lk, [&] { return stop_ || generation_.load() != seen; });
        --sleepers_;
      }
      if (stop_) return;
      seen = generation_.load();
      // Woke after that run already finished: nothing to do. Registering as
      // busy only while fn_ is set keeps the job fields stable for the worker
      // (run() clears fn_ under the lock only once busy_workers_ == 0).
      if (fn_ == nullptr) continue;
      busy_workers_.fetch_add(1);
    }
    work_on_current();
    {
      std::lock_guard<std::mutex> lk(mu_);
      busy_workers_.fetch_sub(1);
    }
    cv_done_.notify_one();
  }
}

void ThreadPool::run(int64_t n_tasks, const std::function<void(int64_t)>& fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(t);
    return;
  }
  bool wake;
  {
    std::lock_guard<std::mutex> lk(mu_);
    fn_ = &fn;
    n_tasks_ = n_tasks;
    next_.store(0);
    done_.store(0);
    generation_.fetch_add(1, std::memory_order_release);
    wake = sleepers_ > 0;
  }
  if (wake) cv_start_.notify_all();
  work_on_current();
  // Wait until all tasks finished and no worker still touches fn_/n_tasks_.
  auto finished = [&] { return done_.load() == n_tasks_ && busy_workers_.load() == 0; };
  for (int i = 0; i < kSpins && !finished(); ++i) cpu_relax();
  std::unique_lock<std::mutex> lk(mu_);
  cv_done_.wait(lk, finished);
  fn_ = nullptr;
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int64_t parts = std::min<int64_t>(static_cast<int64_t>(n_threads_) * 4, (n + grain - 1) / grain);
  parts = std::max<int64_t>(1, parts);
  const int64_t step = (n + parts - 1) / parts;
  run(parts, [&](int64_t p) {
    int64_t b = p * step, e = std::min(n, b + step);
    if (b < e) fn(b, e);
  });
}

}  // namespace dory
