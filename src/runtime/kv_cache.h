#pragma once
#include <cstdint>
#include <vector>

namespace dory {

// Keys and values of one attention slot, one float row of nk*hd per position.
// A full-attention slot keeps every row; a sliding slot is a ring of `ring`
// rows (window + rewind margin + chunk), so its memory is bounded at any length.
class KvCache {
 public:
  KvCache(int64_t row_width, int64_t ring /* 0 = keep all rows */)
      : width_(row_width), ring_(ring) {}

  // Makes rows [start, end) writable; rows past `end` are forgotten.
  void begin_write(int64_t start, int64_t end);
  float* k(int64_t pos) { return k_.data() + slot(pos) * width_; }
  float* v(int64_t pos) { return v_.data() + slot(pos) * width_; }
  const float* k(int64_t pos) const { return k_.data() + slot(pos) * width_; }
  const float* v(int64_t pos) const { return v_.data() + slot(pos) * width_; }

  int64_t rows() const { return rows_; }         // positions [first(), rows()) are held
  int64_t first() const { return first_; }
  int64_t ring() const { return ring_; }
  void truncate(int64_t n);
  uint64_t bytes() const { return (k_.capacity() + v_.capacity()) * sizeof(float); }

 private:
  int64_t slot(int64_t pos) const { return ring_ ? pos % ring_ : pos; }
  int64_t width_, ring_;
  int64_t rows_ = 0, first_ = 0;
  std::vector<float> k_, v_;
};

}  // namespace dory
