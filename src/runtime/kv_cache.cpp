#include "runtime/kv_cache.h"

#include <algorithm>

#include "model/far_field.h"

namespace dory {

KvCache::KvCache(int64_t row_width, int64_t ring) : width_(row_width), ring_(ring) {}

KvCache::KvCache(const KvCache& o)
    : width_(o.width_), ring_(o.ring_), rows_(o.rows_), first_(o.first_), k_(o.k_), v_(o.v_), far_on_(o.far_on_),
      o1_(o.o1_), n_head_(o.n_head_), n_kv_head_(o.n_kv_head_), head_dim_(o.head_dim_), q_width_(o.q_width_),
      ring_after_seal_(o.ring_after_seal_), q_(o.q_), far_(o.far_ ? std::make_unique<FarField>(*o.far_) : nullptr) {}

KvCache::~KvCache() = default;

void KvCache::enable_far(const O1Params& p, int64_t n_head, int64_t n_kv_head, int64_t head_dim,
                         int64_t ring_after_seal) {
  if (!p.on || ring_) return;
  far_on_ = true;
  o1_ = p;
  n_head_ = n_head;
  n_kv_head_ = n_kv_head;
  head_dim_ = head_dim;
  q_width_ = n_head * head_dim;
  ring_after_seal_ = std::max<int64_t>(ring_after_seal, p.w + 1);
}

void KvCache::seal(int64_t t) {
  const int64_t w = o1_.w;
  far_ = std::make_unique<FarField>(o1_, n_head_, n_kv_head_, head_dim_);
  far_->build(
      t, [&](int64_t j) -> const float* { return k_.data() + j * width_; },
      [&](int64_t j) -> const float* { return v_.data() + j * width_; },
      [&](int64_t j) -> const float* { return q_.data() + j * q_width_; });
  // The window [t - w, t) moves into a ring; every older row now lives in the
  // far field (or is pinned there), so its exact copy and all queries go.
  std::vector<float> k(ring_after_seal_ * width_), v(ring_after_seal_ * width_);
  for (int64_t j = t - w; j < t; ++j) {
    std::copy_n(k_.data() + j * width_, width_, k.data() + (j % ring_after_seal_) * width_);
    std::copy_n(v_.data() + j * width_, width_, v.data() + (j % ring_after_seal_) * width_);
  }
  k_.swap(k);
  v_.swap(v);
  std::vector<float>().swap(q_);
  ring_ = ring_after_seal_;
  rows_ = t;
  first_ = t - w;
}

void KvCache::begin_write(int64_t start, int64_t end) {
  if (far_on_) {
    // Rows before `start` are final: seal over them, or fold those that left the window.
    if (!far_ && start >= o1_.seal && start > int64_t(o1_.w) + o1_.sink + 8 && start <= rows_) seal(start);
    if (far_) {
      while (far_->far_end() < start - o1_.w) {
        const int64_t j = far_->far_end();
        far_->insert(k(j), v(j));
      }
      first_ = std::max(first_, far_->far_end());
    } else if (static_cast<int64_t>(q_.size()) < end * q_width_) {
      q_.resize(std::max<size_t>(end * q_width_, q_.size() * 3 / 2));
    }
  }
  const int64_t slots = ring_ ? std::min(end, ring_) : end;
  if (static_cast<int64_t>(k_.size()) < slots * width_) {
    // Geometric growth keeps appends amortized O(1) for full-attention slots.
    const size_t want = std::max<size_t>(slots * width_, k_.size() * 3 / 2);
    k_.resize(ring_ ? slots * width_ : want);
    v_.resize(k_.size());
  }
  rows_ = end;
  if (ring_) first_ = std::max(first_, end - ring_);
}

int64_t KvCache::rollback_floor(int64_t window) const {
  if (far_) return std::max(far_->far_end(), first_);
  if (ring_) return first_ > 0 ? first_ + window - 1 : 0;
  return 0;
}

void KvCache::truncate(int64_t n) {
  rows_ = std::min(rows_, n);
  first_ = std::min(first_, rows_);
}

uint64_t KvCache::far_bytes() const { return far_ ? far_->bytes() : 0; }

uint64_t KvCache::bytes() const {
  return (k_.capacity() + v_.capacity() + q_.capacity()) * sizeof(float) + far_bytes();
}

}  // namespace dory
