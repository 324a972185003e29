#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "dory/error.h"
#include "runtime/sampler.h"

using dory::Sampler;
using dory::SamplingParams;

namespace {

std::map<int32_t, int> histogram(SamplingParams p, const std::vector<float>& logits, int n) {
  Sampler s(p);
  std::map<int32_t, int> h;
  for (int i = 0; i < n; ++i) ++h[s.sample(logits.data(), logits.size())];
  return h;
}

SamplingParams plain() {  // everything off but temperature 1
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 42;
  return p;
}

}  // namespace

TEST(Sampler, DefaultsAreLlamaCpps) {
  SamplingParams p;
  EXPECT_FLOAT_EQ(p.temperature, 0.8f);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_FLOAT_EQ(p.top_p, 0.95f);
  EXPECT_FLOAT_EQ(p.min_p, 0.05f);
  EXPECT_FLOAT_EQ(p.repeat_penalty, 1.0f);
  EXPECT_EQ(p.repeat_last_n, 64);
}

TEST(Sampler, GreedyTakesTheArgmaxAndBreaksTiesByLowestId) {
  SamplingParams p = plain();
  p.temperature = 0;
  Sampler s(p);
  std::vector<float> l{0.1f, 3.0f, -1.0f, 3.0f};
  for (int i = 0; i < 10; ++i) EXPECT_EQ(s.sample(l.data(), l.size()), 1);
}

TEST(Sampler, TemperatureOneFollowsTheSoftmax) {
  std::vector<float> l{0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};  // p = 1,2,3,4 / 10
  const int n = 40000;
  auto h = histogram(plain(), l, n);
  for (int i = 0; i < 4; ++i) {
    const double want = (i + 1) / 10.0;
    // binomial sd at n=40000 is <= 0.0025: 4 sd
    EXPECT_NEAR(h[i] / double(n), want, 0.01) << "id " << i;
  }
  // Temperature 0.5 squares the odds: p ~ 1,4,9,16 / 30
  SamplingParams p = plain();
  p.temperature = 0.5f;
  h = histogram(p, l, n);
  EXPECT_NEAR(h[3] / double(n), 16.0 / 30.0, 0.01);
  EXPECT_NEAR(h[0] / double(n), 1.0 / 30.0, 0.01);
}

TEST(Sampler, TopKKeepsOnlyTheKBest) {
  SamplingParams p = plain();
  p.top_k = 2;
  auto h = histogram(p, {1.0f, 0.9f, 5.0f, 4.9f, 0.0f}, 5000);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_GT(h[2], 0);
  EXPECT_GT(h[3], 0);
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
  // p = 0.5, 0.3, 0.15, 0.05: top_p 0.7 keeps the first two (0.5 < 0.7 <= 0.8)
  SamplingParams p = plain();
  p.top_p = 0.7f;
  auto h = histogram(p, {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)}, 5000);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_GT(h[0], h[1]);
}

TEST(Sampler, MinPDropsTokensBelowAShareOfTheBest) {
  // p ~ 0.6, 0.3, 0.06, 0.04 ; min_p 0.2 -> floor 0.12 keeps ids 0 and 1
  SamplingParams p = plain();
  p.min_p = 0.2f;
  auto h = histogram(p, {std::log(0.6f), std::log(0.3f), std::log(0.06f), std::log(0.04f)}, 5000);
  EXPECT_EQ(h.size(), 2u);
}

TEST(Sampler, RepeatPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplingParams p = plain();
  p.temperature = 0;
  p.repeat_penalty = 2.0f;
  Sampler s(p);
  std::vector<float> l{3.0f, 2.0f, -1.0f};
  EXPECT_EQ(s.sample(l.data(), 3), 0);
  s.accept(0);  // 3.0 -> 1.5 < 2.0
  EXPECT_EQ(s.sample(l.data(), 3), 1);
  // Window: only the last repeat_last_n tokens count.
  p.repeat_last_n = 1;
  Sampler w(p);
  w.accept(0);
  w.accept(1);  // 0 fell out of the window, 1 is penalized: 2.0 -> 1.0
  EXPECT_EQ(w.sample(l.data(), 3), 0);
}

TEST(Sampler, PresenceAndFrequencyPenalties) {
  SamplingParams p = plain();
  p.temperature = 0;
  p.presence_penalty = 0.5f;
  Sampler s(p);
  std::vector<float> l{3.0f, 2.8f};
  s.accept(0);
  EXPECT_EQ(s.sample(l.data(), 2), 1);  // 3.0 - 0.5 < 2.8
  p.presence_penalty = 0;
  p.frequency_penalty = 0.15f;
  Sampler f(p);
  f.accept(0);
  EXPECT_EQ(f.sample(l.data(), 2), 0);  // 3.0 - 0.15 > 2.8
  f.accept(0);
  EXPECT_EQ(f.sample(l.data(), 2), 1);  // 3.0 - 0.30 < 2.8
}

TEST(Sampler, TheSameSeedReproducesARun) {
  std::vector<float> l(100);
  for (int i = 0; i < 100; ++i) l[i] = std::sin(i * 0.7f) * 3;
  SamplingParams p;  // the defaults
  p.seed = 1234;
  Sampler a(p), b(p);
  p.seed = 4321;
  Sampler c(p);
  std::vector<int32_t> ra, rb, rc;
  for (int i = 0; i < 50; ++i) {
    ra.push_back(a.sample(l.data(), 100));
    rb.push_back(b.sample(l.data(), 100));
    rc.push_back(c.sample(l.data(), 100));
  }
  EXPECT_EQ(ra, rb);
  EXPECT_NE(ra, rc);
  a.reset();
  EXPECT_EQ(a.sample(l.data(), 100), ra[0]);
}

TEST(Sampler, RejectsNonsense) {
  SamplingParams p;
  p.repeat_penalty = 0;
  EXPECT_THROW(Sampler{p}, dory::Error);
  p = SamplingParams{};
  p.top_p = NAN;
  EXPECT_THROW(Sampler{p}, dory::Error);
  p = SamplingParams{};
  p.temperature = NAN;
  EXPECT_THROW(Sampler{p}, dory::Error);
  Sampler ok{SamplingParams{}};
  EXPECT_THROW(ok.sample(nullptr, 0), dory::Error);
}
