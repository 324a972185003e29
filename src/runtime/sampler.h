#pragma once
#include <cstdint>
#include <deque>
#include <random>
#include <vector>

namespace dory {

// Defaults follow llama.cpp's common sampling parameters.
struct SamplingParams {
  float temperature = 0.8f;  // <= 0: greedy
  int top_k = 40;            // <= 0: off
  float top_p = 0.95f;       // >= 1: off
  float min_p = 0.05f;       // <= 0: off
  float repeat_penalty = 1.0f;    // 1: off
  int repeat_last_n = 64;         // tokens the penalties look at; -1 = all, 0 = off
  float presence_penalty = 0.0f;  // 0: off
  float frequency_penalty = 0.0f; // 0: off
  uint64_t seed = 0xFFFFFFFFu;    // 0xFFFFFFFF: a random seed (printed with --verbose)
};

// Order as llama.cpp: penalties, top-k, top-p, min-p, temperature, then a draw.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // Picks the next id from raw logits [V]. Does not record it: call accept().
  int32_t sample(const float* logits, int64_t V);
  // Records a token (prompt or generated) for the penalties.
  void accept(int32_t id);
  void reset();
  uint64_t seed() const { return seed_; }
  const SamplingParams& params() const { return p_; }

 private:
  SamplingParams p_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  std::deque<int32_t> recent_;
  struct Cand {
    int32_t id;
    float logit;
  };
  std::vector<Cand> cand_;
};

}  // namespace dory
