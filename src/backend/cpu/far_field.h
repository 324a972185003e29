// The O(1) far field of a full-attention slot (docs/model.md section 5): after the seal a
// query attends exactly to the pinned rows (the `sink` first rows, and rows kept
// exact by section 6) and to the recent window, and approximately, through m
// Nystrom landmarks, to every other row, whose keys and values are folded into
// constant-size accumulators.
//
// Per KV head group (the query heads that share one KV head):
//   K~ = segment means of the sealed keys (m_eff contiguous segments of rows
//   [sink, t)), Q~_h = segment means of query head h's queries over the same
//   segments, M_h = ridge pseudo-inverse of exp(Q~_h K~^T / sqrt(d)) (Cholesky,
//   lambda = 1e-6 mean diag, x10 on failure), shifted by s_h = the largest
//   exponent so nothing overflows (M_h here is pinv(exp(A - s_h))).
//   Far accumulators per landmark i of head h, over the far rows j:
//     T_i = sum_j exp(q~_i.k_j/sqrt(d) - mx_i) v_j,  Z_i = sum_j exp(q~_i.k_j/sqrt(d) - mx_i),
//   with a running max mx_i.
//   A query q: a_i = q.k~_i/sqrt(d), f = max a, u = exp(a - f) M_h, and
//     g_b = u_b exp(f + mx_b - s_h - c)   (c: one shift shared with the exact rows)
//     out = (sum_near e_j v_j + sum_b g_b T_b) / (sum_near e_j + sum_b g_b Z_b);
//   a negative far denominator drops the far part ("aggregate" rectifier), or
//   each u_b is clamped at 0 first ("clamp").
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "dory/options.h"

namespace dory {

class FarField {
 public:
  FarField(const O1Params& p, int64_t n_head, int64_t n_kv_head, int64_t head_dim);

  // Row accessors by absolute position: keys and values (n_kv_head * head_dim
  // floats), queries (n_head * head_dim floats, or nullptr for a row whose
  // queries were not kept).
  using RowFn = std::function<const float*(int64_t pos)>;

  // (Re)builds the state over rows [0, t): the rows [0, sink) and `exact` (sorted
  // positions in [sink, t - w)) become pinned rows; landmarks from rows [sink, t);
  // rows [sink, t - w) that are not pinned go into the accumulators in order.
  // Afterwards far_end() == t - w. Needs t > w + sink + 8.
  void build(int64_t t, const RowFn& k, const RowFn& v, const RowFn& q, std::span<const int64_t> exact = {});

  // Row far_end() leaves the window: its key and value go into the accumulators.
  void insert(const float* k, const float* v);

  // The segment-mean landmark keys over rows [sink, t) ([n_kv_head x m x head_dim])
  // that build() would make; *m gets their count.
  static std::vector<double> key_landmarks(const O1Params& p, int64_t t, int64_t n_kv_head, int64_t head_dim,
                                           const RowFn& k, int* m);
  const float* pinned_k(int64_t i) const { return pinned_k_.data() + i * nk_ * hd_; }
  const float* pinned_v(int64_t i) const { return pinned_v_.data() + i * nk_ * hd_; }

  int64_t far_end() const { return far_end_; }
  int landmarks() const { return m_; }
  const O1Params& params() const { return p_; }
  int64_t pinned_rows() const { return static_cast<int64_t>(pinned_pos_.size()); }
  // Room for n pinned rows, so the bytes held do not depend on how many were chosen.
  void reserve_pinned(int64_t n) {
    pinned_pos_.reserve(n);
    pinned_k_.reserve(n * nk_ * hd_);
    pinned_v_.reserve(n * nk_ * hd_);
  }
  const std::vector<int64_t>& pinned_positions() const { return pinned_pos_; }

  // One query head's attention output (head_dim floats) for query q (already
  // scaled as the model's scores want) at position p: exact over the pinned rows
  // and the window rows [far_end(), p] (window(pos) gives their key/value rows),
  // approximate over the rest.
  void attend(int64_t h, const float* q, int64_t p, const RowFn& wk, const RowFn& wv, float* out) const;

  uint64_t bytes() const;

 private:
  O1Params p_;
  int64_t nh_, nk_, hd_, group_;
  int m_ = 0;               // landmarks in use (m_eff)
  int64_t far_end_ = 0;
  double inv_sqrt_d_;
  std::vector<int64_t> pinned_pos_;
  std::vector<float> pinned_k_, pinned_v_;  // [pinned x nk*hd]
  std::vector<double> kt_;                  // [nk x m x hd] landmark keys
  std::vector<double> qt_;                  // [nh x m x hd] landmark queries
  std::vector<double> M_;                   // [nh x m x m]
  std::vector<double> shift_;               // [nh] s_h
  std::vector<double> T_;                   // [nh x m x hd]
  std::vector<double> Z_, mx_;              // [nh x m]
};

// Ridge pseudo-inverse of the n x n matrix A (row-major): (A^T A + lam I)^-1 A^T
// with lam = lam0 * mean diag(A^T A), lam raised x10 until the Cholesky factor
// exists. Returns false only if no lam up to 1e6 * mean diag works.
bool ridge_pinv(const std::vector<double>& A, int n, double lam0, std::vector<double>& out);

}  // namespace dory
