#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "dory/error.h"

namespace dory {

Sampler::Sampler(const SamplingParams& p) : p_(p) {
  if (std::isnan(p.temperature)) throw Error("temperature is not a number");
  if (!std::isfinite(p.top_p) || !std::isfinite(p.min_p) || !std::isfinite(p.repeat_penalty) ||
      !std::isfinite(p.presence_penalty) || !std::isfinite(p.frequency_penalty))
    throw Error("sampling parameters must be finite numbers");
  if (p.repeat_penalty <= 0) throw Error("repeat penalty must be positive");
  if (p.repeat_last_n < -1) throw Error("repeat_last_n must be -1 (all), 0 (off) or positive");
  seed_ = p.seed == 0xFFFFFFFFu ? std::random_device{}() : p.seed;
  rng_.seed(seed_);
}

void Sampler::reset() {
  recent_.clear();
  rng_.seed(seed_);
}

void Sampler::accept(int32_t id) {
  if (p_.repeat_last_n == 0) return;
  recent_.push_back(id);
  if (p_.repeat_last_n > 0 && static_cast<int>(recent_.size()) > p_.repeat_last_n)
    recent_.pop_front();
}

int32_t Sampler::sample(const float* logits, int64_t V) {
  if (V <= 0) throw Error("no logits to sample from");
  cand_.resize(V);
  for (int64_t i = 0; i < V; ++i) cand_[i] = {static_cast<int32_t>(i), logits[i]};

  // Penalties over the recent window, as llama.cpp: a repeated token's logit
  // is divided (positive) or multiplied (negative) by the repeat penalty, then
  // lowered by count * frequency + presence.
  const bool penalize =
      p_.repeat_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f;
  if (penalize && !recent_.empty()) {
    std::unordered_map<int32_t, int> count;
    for (int32_t id : recent_) ++count[id];
    for (auto [id, n] : count) {
      if (id < 0 || id >= V) continue;
      float& l = cand_[id].logit;
      l = l > 0 ? l / p_.repeat_penalty : l * p_.repeat_penalty;
      l -= n * p_.frequency_penalty + p_.presence_penalty;
    }
  }

  auto by_logit = [](const Cand& a, const Cand& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  if (p_.temperature <= 0) return std::min_element(cand_.begin(), cand_.end(), by_logit)->id;

  size_t n = cand_.size();
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    n = p_.top_k;
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Softmax over the kept candidates (at temperature 1, as llama.cpp's top-p
  // and min-p see them).
  std::vector<double> prob(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += prob[i] = std::exp(double(cand_[i].logit) - cand_[0].logit);
  for (double& q : prob) q /= sum;
  if (p_.top_p < 1.0f) {
    double cum = 0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += prob[i];
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = std::max<size_t>(1, keep);
  }
  if (p_.min_p > 0.0f) {
    const double floor = prob[0] * p_.min_p;
    size_t keep = 1;
    while (keep < n && prob[keep] >= floor) ++keep;
    n = keep;
  }
  // Temperature, then a draw from the renormalized distribution.
  std::vector<double> w(n);
  double total = 0;
  for (size_t i = 0; i < n; ++i)
    total += w[i] = std::exp((double(cand_[i].logit) - cand_[0].logit) / p_.temperature);
  // 53 random bits -> [0, 1): the same on every platform for a given seed.
  const double u = static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0) * total;
  double acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += w[i];
    if (u < acc) return cand_[i].id;
  }
  return cand_[n - 1].id;
}

}  // namespace dory
