#include "runtime/kv_cache.h"

#include <algorithm>

namespace dory {

void KvCache::begin_write(int64_t start, int64_t end) {
  const int64_t slots = ring_ ? std::min(end, ring_) : end;
  if (static_cast<int64_t>(k_.size()) < slots * width_) {
    // Geometric growth keeps appends amortized O(1) for full-attention slots.
    const size_t want = std::max<size_t>(slots * width_, k_.size() * 3 / 2);
    k_.resize(ring_ ? slots * width_ : want);
    v_.resize(k_.size());
  }
  rows_ = end;
  (void)start;
  if (ring_) first_ = std::max(first_, end - ring_);
}

void KvCache::truncate(int64_t n) {
  rows_ = std::min(rows_, n);
  first_ = std::min(first_, rows_);
}

}  // namespace dory
