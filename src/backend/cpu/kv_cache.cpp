#include "backend/cpu/kv_cache.h"

#include <algorithm>

#include "backend/cpu/exact_rows.h"
#include "backend/cpu/far_field.h"

namespace dory {

KvCache::KvCache(int64_t row_width, int64_t ring) : width_(row_width), ring_(ring) {}

KvCache::KvCache(const KvCache& o)
    : width_(o.width_), ring_(o.ring_), rows_(o.rows_), first_(o.first_), k_(o.k_), v_(o.v_), far_on_(o.far_on_),
      o1_(o.o1_), n_head_(o.n_head_), n_kv_head_(o.n_kv_head_), head_dim_(o.head_dim_), q_width_(o.q_width_),
      ring_after_seal_(o.ring_after_seal_), q_(o.q_), far_(o.far_ ? std::make_unique<FarField>(*o.far_) : nullptr),
      exact_on_(o.exact_on_), exact_w_(o.exact_w_), exact_budget_(o.exact_budget_), spill_dir_(o.spill_dir_),
      tag_(o.tag_ + "c") {
  // A copy (a loop index first used mid-sequence) cannot share the waiting rows:
  // it keeps its far field as sealed and chooses no exact rows.
}

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

void KvCache::enable_exact(std::vector<float> layer_weights, int64_t budget, const std::string& spill_dir,
                           const std::string& tag) {
  if (!far_on_ || budget <= 0) return;
  exact_on_ = true;
  exact_w_ = std::move(layer_weights);
  exact_budget_ = budget;
  spill_dir_ = spill_dir;
  tag_ = tag;
}

void KvCache::put_q(int64_t pos, const float* q) {
  if (!far_) {
    std::copy_n(q, q_width_, q_.data() + pos * q_width_);
  } else if (store_ && pos % 8 == 0) {
    store_->put_q(pos, q);
  }
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
  // Exact rows: every row that goes into the far field waits in a store (and
  // one query row in 8) until the prompt's end.
  if (exact_on_) {
    store_ = std::make_unique<RowStore>(width_, q_width_, spill_dir_, tag_);
    for (int64_t j = o1_.sink; j < t - w && store_->ok(); ++j) store_->put(j, k_.data() + j * width_, v_.data() + j * width_);
    for (int64_t j = o1_.sink; j < t && store_->ok(); ++j)
      if (j % 8 == 0) store_->put_q(j, q_.data() + j * q_width_);
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
        if (store_) store_->put(j, k(j), v(j));
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

// Calls fn(K, V, Q) with accessors of every row [0, rows()) of a sealed slot with a
// store: sinks from the far field, far rows from the store, the window from the ring.
bool KvCache::with_all_rows(const std::function<void(const FarField::RowFn&, const FarField::RowFn&,
                                                     const FarField::RowFn&)>& fn,
                            std::string* why) {
  if (!far_ || !store_) {
    *why = "nothing waits";
    return false;
  }
  RowStore& store = *store_;
  const int64_t F = far_->far_end(), sink = o1_.sink;
  if (!store.ok() || store.first() != sink || store.end() != F) {
    *why = store.ok() ? "the store does not hold the far rows" : store.error();
    return false;
  }
  const FarField& old = *far_;
  std::vector<float> kb(width_), vb(width_);
  int64_t cached = -1;
  bool io_ok = true;
  auto fetch = [&](int64_t j) {
    if (j == cached) return;
    cached = j;
    if (j < sink) {
      std::copy_n(old.pinned_k(j), width_, kb.data());
      std::copy_n(old.pinned_v(j), width_, vb.data());
    } else if (j < F) {
      io_ok &= store.get(j, kb.data(), vb.data());
    } else {
      std::copy_n(k(j), width_, kb.data());
      std::copy_n(v(j), width_, vb.data());
    }
  };
  FarField::RowFn K = [&](int64_t j) -> const float* { return fetch(j), kb.data(); };
  FarField::RowFn V = [&](int64_t j) -> const float* { return fetch(j), vb.data(); };
  FarField::RowFn Q = [&](int64_t j) -> const float* { return store.q(j); };
  fn(K, V, Q);
  if (!io_ok || !store.ok()) {
    *why = store.ok() ? "a read failed" : store.error();
    return false;
  }
  return true;
}

bool KvCache::rebuild_exact(bool final, std::string* why) {
  const int64_t t = rows_, sink = o1_.sink, w = o1_.w;
  const int64_t reserve = exact_budget_ / 4;
  std::unique_ptr<FarField> rebuilt;
  std::vector<int64_t> chosen;
  const bool ok = with_all_rows(
      [&](const FarField::RowFn& K, const FarField::RowFn& V, const FarField::RowFn& Q) {
        int m = 0;
        const std::vector<double> landmarks = FarField::key_landmarks(o1_, t, n_kv_head_, head_dim_, K, &m);
        // Candidates: every row out of the window, or (final after a first stage) those
        // that left it since; ranks are shares within the candidates.
        const int64_t lo = final && chosen_hi_ >= 0 ? std::max(sink, chosen_hi_) : sink, hi = t - w;
        const int64_t budget = !final ? exact_budget_ - reserve : chosen_hi_ >= 0 ? reserve : exact_budget_;
        if (hi > lo) {
          const std::vector<double> score = exact_scores(K, V, lo, hi, landmarks, m, n_kv_head_, head_dim_, exact_w_);
          chosen = choose_exact_rows(score, lo, hi, budget);
        }
        if (final && chosen_hi_ >= 0) {
          chosen.insert(chosen.end(), chosen_.begin(), chosen_.end());
          std::sort(chosen.begin(), chosen.end());
          chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
        }
        rebuilt = std::make_unique<FarField>(o1_, n_head_, n_kv_head_, head_dim_);
        rebuilt->build(t, K, V, Q, chosen);
        rebuilt->reserve_pinned(sink + exact_budget_);  // the same bytes whatever was chosen
      },
      why);
  if (!ok || final) {
    store_.reset();  // the rows waited for this choice
    chosen_.clear();
    chosen_hi_ = -1;
  } else {
    chosen_ = chosen;
    chosen_hi_ = t - w;
    // The rebuilt far field ends at t - w; the rows between the old one's end and there
    // are still in the ring: the store takes them, so it goes on holding every far row.
    for (int64_t j = store_->end(); j < rebuilt->far_end() && store_->ok(); ++j) store_->put(j, k(j), v(j));
  }
  if (!ok) return false;
  far_ = std::move(rebuilt);
  return true;
}

bool KvCache::exact_features(int64_t* lo, int64_t* hi, std::vector<double>* f) {
  const int64_t t = rows_, sink = o1_.sink, w = o1_.w;
  std::string why;
  *lo = sink, *hi = t - w;
  return with_all_rows(
      [&](const FarField::RowFn& K, const FarField::RowFn& V, const FarField::RowFn&) {
        int m = 0;
        const std::vector<double> landmarks = FarField::key_landmarks(o1_, t, n_kv_head_, head_dim_, K, &m);
        *f = dory::exact_features(K, V, sink, t - w, landmarks, m, n_kv_head_, head_dim_);
      },
      &why);
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
  return (k_.capacity() + v_.capacity() + q_.capacity()) * sizeof(float) + far_bytes() +
         (store_ ? store_->ram_bytes() : 0);
}

}  // namespace dory
