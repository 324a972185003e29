// Rows kept exact past the seal (docs/model.md section 6). Landmarks lose rare facts (a
// password, a number); at a prompt's end, before its last 512 rows, each sealed
// full slot rebuilds its far field over all the prompt's rows with a budget of
// chosen rows kept exact (pinned next to the sinks).
//
// The choice, per KV head g of the slot's layer: the part of a row's key outside
// the span of the m segment-mean landmarks (ridge 1e-4), and its value's squared
// norm, each turned into its rank share in [0, 1] over the candidate rows;
// score = sum_g w[g][0] rank(key residual) + w[g][1] rank(|v|^2), with weights
// fitted per layer (dory calibrate). Rows in [sink, rows - w) are taken
// best-first, each with its 2 neighbours on each side, until the budget is spent.
//
// Between the seal and the prompt's end the rows wait in a RowStore, in RAM or in
// files under a spill directory; only one row in 8 keeps its queries (for the
// rebuilt landmarks). A store that fails is dropped with a warning and the far
// field goes on as first sealed.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace dory {

// k, v rows of consecutive positions from `first`, and query rows of some
// positions: in memory, or appended to two files under a spill directory (removed
// when the store goes). Any I/O error turns the store off (ok() false) and
// records why; it never throws.
class RowStore {
 public:
  RowStore(int64_t kv_width, int64_t q_width, const std::string& spill_dir, const std::string& tag);
  ~RowStore();
  RowStore(const RowStore&) = delete;
  RowStore& operator=(const RowStore&) = delete;

  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  bool spilled() const { return fd_kv_ >= 0; }
  const std::vector<std::string>& files() const { return paths_; }

  void put(int64_t pos, const float* k, const float* v);  // pos == end()
  void put_q(int64_t pos, const float* q);
  int64_t first() const { return first_; }
  int64_t end() const { return first_ + count_; }
  // Reads row pos (first() <= pos < end()) into k and v; false on an I/O error.
  bool get(int64_t pos, float* k, float* v);
  // The kept query row of pos, or nullptr (valid until the next q() call).
  const float* q(int64_t pos);
  uint64_t ram_bytes() const;

 private:
  void fail(const std::string& why);
  int64_t kvw_, qw_;
  bool ok_ = true;
  std::string error_;
  int64_t first_ = -1, count_ = 0;
  std::vector<float> kv_;                         // RAM: [count x 2 kvw]
  std::unordered_map<int64_t, int64_t> q_index_;  // pos -> row in q_ / the q file
  std::vector<float> q_;                          // RAM: [n x qw]
  std::vector<float> qbuf_;
  int fd_kv_ = -1, fd_q_ = -1;
  std::vector<std::string> paths_;
};

// Rank shares in [0, 1] (0 = smallest; ties share their mean rank).
std::vector<double> rank_shares(const std::vector<double>& x);

// Best-first choice of rows in [lo, hi) by score (score[i] is row lo + i),
// each taken with `neighbours` rows on each side, until `budget` rows are chosen.
// Returns sorted positions.
std::vector<int64_t> choose_exact_rows(const std::vector<double>& score, int64_t lo, int64_t hi, int64_t budget,
                                       int neighbours = 2);

// The rows' features for one slot: [(hi - lo) x 2 nk], per KV head the rank
// shares of the key residual and of the value's squared norm.
std::vector<double> exact_features(const std::function<const float*(int64_t)>& k,
                                   const std::function<const float*(int64_t)>& v, int64_t lo, int64_t hi,
                                   const std::vector<double>& landmarks, int m, int64_t nk, int64_t hd);

// The rows' scores for one slot: k(j), v(j) give rows j in [lo, hi) (key and
// value rows of nk heads of hd); landmarks [nk x m x hd]; weights [nk x 2].
std::vector<double> exact_scores(const std::function<const float*(int64_t)>& k,
                                 const std::function<const float*(int64_t)>& v, int64_t lo, int64_t hi,
                                 const std::vector<double>& landmarks, int m, int64_t nk, int64_t hd,
                                 std::span<const float> weights);

}  // namespace dory
