// Early exit (docs/model.md section 4): the decisions after a decode token's first
// recurrent pass. The forward pass itself lives in Session; this is the math.
#pragma once
#include <cstdint>
#include <vector>

#include "dory/options.h"

namespace dory {

// Top probability of a logit row: 1 / sum exp(x - max) over the entries with
// x - max > -20 (the rest add less than V * 2e-9 and need no exp).
double top_probability(const float* logits, int64_t n);

// The recon router: two "topologies" (easy, hard) over the state after pass 1,
// each a mean mu and an orthonormal basis B (rank rows of dim):
//   err(x) = |x - mu|^2 - sum_b (b . (x - mu))^2,  score = err_hard - err_easy,
// one pass when score >= bias.
struct Router {
  int64_t dim = 0, rank_easy = 0, rank_hard = 0;
  std::vector<float> easy_mean, hard_mean;    // [dim]
  std::vector<float> easy_basis, hard_basis;  // [rank x dim], rows orthonormal
  double bias = 0;                            // the file's default exit bias
  bool empty() const { return dim == 0; }
  double score(const float* x) const;
  // Throws Error unless the shapes agree with dim.
  void validate(const char* where) const;
};

// The conf gate's exit-rate tracker: an EMA of exits (factor 0.1, from 1.0);
// while the rate is under 0.35 read-outs are skipped, but one token in 8 is
// still read out (a probe) to notice when the text turns easy.
class ExitTracker {
 public:
  // Whether this token gets a read-out; *probe says it is a probe.
  bool read_out(bool* probe);
  void record(bool exited);  // after a read-out
  double rate() const { return rate_; }

 private:
  double rate_ = 1.0;
  int64_t skipped_ = 0;
};

}  // namespace dory
