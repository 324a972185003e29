#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dory/options.h"

namespace dory {

class FarField;
class RowStore;

// Keys and values of one attention slot, one float row of nk*hd per position.
// A full-attention slot keeps every row; a sliding slot is a ring of `ring`
// rows (window + rewind margin + chunk), so its memory is bounded at any length.
//
// A full slot with the far field on (enable_far) also keeps its query rows
// until it seals; at the first write starting at or past `seal` it seals over
// the rows it holds (all final by then: every pass of earlier positions is
// done), keeps the window in a ring of w + chunk + margin rows and folds older
// rows into the far field, and at every later write first folds the rows that
// left the window. A second pass over the same rows folds nothing, so a
// position enters the far field once, with its last pass's key and value.
class KvCache {
 public:
  KvCache(int64_t row_width, int64_t ring /* 0 = keep all rows */);
  KvCache(const KvCache& o);
  KvCache& operator=(const KvCache&) = delete;
  ~KvCache();

  // Full slots only, before the first write: the O(1) far field (docs/model.md section 5).
  void enable_far(const O1Params& p, int64_t n_head, int64_t n_kv_head, int64_t head_dim, int64_t ring_after_seal);

  // Full slots with the far field: keep rows for a later choice of exact rows
  // (docs/model.md section 6), with this layer's weights [n_kv_head x 2].
  void enable_exact(std::vector<float> layer_weights, int64_t budget, const std::string& spill_dir,
                    const std::string& tag);
  // Near a prompt's end: rebuilds the far field over every row with the chosen rows
  // kept exact. First stage (final false, 512 rows before the end): the budget less a
  // reserve (a quarter) among rows [sink, rows - w); the store keeps taking the rows
  // that leave the window. Final stage (before the prompt's last row): the reserve among
  // the rows that left since, the first stage's rows kept, then the store goes. A final
  // stage with no first stage before it spends the whole budget. False (with *why) when
  // the store failed; the far field is then left as it was (and the store dropped).
  bool rebuild_exact(bool final, std::string* why);
  bool has_store() const { return static_cast<bool>(store_); }
  // The exact-row features of rows [*lo, *hi) (see exact_rows.h), without choosing.
  bool exact_features(int64_t* lo, int64_t* hi, std::vector<double>* f);

  // Makes rows [start, end) writable; rows past `end` are forgotten.
  void begin_write(int64_t start, int64_t end);
  float* k(int64_t pos) { return k_.data() + slot(pos) * width_; }
  float* v(int64_t pos) { return v_.data() + slot(pos) * width_; }
  const float* k(int64_t pos) const { return k_.data() + slot(pos) * width_; }
  const float* v(int64_t pos) const { return v_.data() + slot(pos) * width_; }
  // Query rows (n_head * head_dim): kept while the slot waits for its seal, and
  // one in 8 afterwards while a store waits for the prompt's end.
  bool wants_q(int64_t pos) const { return far_on_ && (!far_ || (store_ && pos % 8 == 0)); }
  void put_q(int64_t pos, const float* q);

  // Rows from pos on that lie one after another in memory (a ring wraps), up to end.
  int64_t run_end(int64_t pos, int64_t end) const {
    return ring_ ? std::min(end, pos - pos % ring_ + ring_) : end;
  }
  int64_t row_width() const { return width_; }

  int64_t rows() const { return rows_; }         // positions [first(), rows()) are held
  int64_t first() const { return first_; }
  int64_t ring() const { return ring_; }
  const FarField* far() const { return far_.get(); }
  // The smallest position a rollback may go back to (a sliding window of W
  // needs rows W - 1 back; a sealed slot cannot take rows out of its far field).
  int64_t rollback_floor(int64_t window) const;
  void truncate(int64_t n);
  uint64_t bytes() const;
  uint64_t far_bytes() const;

 private:
  bool with_all_rows(const std::function<void(const std::function<const float*(int64_t)>&,
                                              const std::function<const float*(int64_t)>&,
                                              const std::function<const float*(int64_t)>&)>& fn,
                     std::string* why);
  int64_t slot(int64_t pos) const { return ring_ ? pos % ring_ : pos; }
  void seal(int64_t t);
  int64_t width_, ring_;
  int64_t rows_ = 0, first_ = 0;
  std::vector<float> k_, v_;
  // far field
  bool far_on_ = false;
  O1Params o1_;
  int64_t n_head_ = 0, n_kv_head_ = 0, head_dim_ = 0, q_width_ = 0, ring_after_seal_ = 0;
  std::vector<float> q_;
  std::unique_ptr<FarField> far_;
  // exact rows
  bool exact_on_ = false;
  std::vector<float> exact_w_;
  int64_t exact_budget_ = 0;
  std::string spill_dir_, tag_;
  std::unique_ptr<RowStore> store_;
  std::vector<int64_t> chosen_;  // the first stage's exact rows
  int64_t chosen_hi_ = -1;       // its candidates ended here (-1: no first stage yet)
};

}  // namespace dory
