// Session::forward_batch (continuous batching) against each session run alone,
// on the tiny random checkpoint of the test fixture (W = 4, 12 layers, 2 loops).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>

#include "dory/session.h"
#include "tiny_model.h"

using namespace dory;
using dory::fixture::ids;
using dory::fixture::tiny;

namespace {

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// The tolerance for a batched row against the same row alone: the weights are
// bf16 with f32 accumulation, and a batch only changes the summation order of
// each product (matvec -> matmat over 512-column blocks). On the tiny fixture
// (64 columns: one block, the same order) the difference is exactly 0; on a
// 1024-wide checkpoint (DORY_TINY_MODEL pointed at one) it was <= 3.3e-5 on
// logits of magnitude ~5-9 with AVX2 and AVX-512. A wrong cache, position or
// row is >= 1e-2.
constexpr float kTol = 1e-4f;

}  // namespace

// K sessions at different positions (prompts shorter and longer than the
// sliding window, so ring caches wrap), decoded together step by step, give
// each session's own logits.
TEST(Batch, DecodeOfKSessionsEqualsEachDecodedAlone) {
  auto pool = fixture::cpu(2);
  for (KvMode kv : {KvMode::PerLoop, KvMode::LastLoop}) {
    SessionOptions o;
    o.kv = kv;
    o.chunk = 8;
    const int lens[] = {1, 3, 9, 20};
    const int K = 4;
    std::vector<std::unique_ptr<Session>> batched, alone;
    for (int k = 0; k < K; ++k) {
      batched.push_back(std::make_unique<Session>(pool, o));
      alone.push_back(std::make_unique<Session>(pool, o));
      const auto p = ids(lens[k], 10 + k);
      batched[k]->forward(p, Logits::None);
      alone[k]->forward(p, Logits::None);
    }
    float worst = 0;
    for (int step = 0; step < 6; ++step) {
      const auto next = ids(K, 100 + step);
      std::vector<BatchEntry> entries(K);
      for (int k = 0; k < K; ++k) {
        entries[k].session = batched[k].get();
        entries[k].ids = std::span(next).subspan(k, 1);
      }
      Session::forward_batch(entries);
      for (int k = 0; k < K; ++k) {
        const auto want = alone[k]->forward(std::span(next).subspan(k, 1), Logits::Last);
        ASSERT_EQ(entries[k].logits.size(), want.size());
        const float d = max_diff(entries[k].logits, want);
        EXPECT_LE(d, kTol) << kv_mode_name(kv) << " session " << k << " step " << step;
        worst = std::max(worst, d);
        EXPECT_EQ(batched[k]->position(), alone[k]->position());
      }
    }
    std::printf("[ batch ] %s: max |batched - alone| = %.3g over 4 sessions x 6 steps\n",
                kv_mode_name(kv), worst);
  }
}

// A batch of one is the single-session path itself: the same products in the
// same order, so bit-identical.
TEST(Batch, BatchOfOneIsBitIdentical) {
  auto pool = fixture::cpu(2);
  Session a(pool), b(pool);
  const auto p = ids(11, 7);
  a.forward(p, Logits::None);
  b.forward(p, Logits::None);
  for (int step = 0; step < 4; ++step) {
    const auto t = ids(1, 50 + step);
    std::vector<BatchEntry> e(1);
    e[0].session = &a;
    e[0].ids = t;
    Session::forward_batch(e);
    EXPECT_EQ(max_diff(e[0].logits, b.forward(t, Logits::Last)), 0.0f);
  }
}

// Prompt chunks (several rows, all logits wanted) ride in the same pass as
// decode rows, and sessions with different loop counts are grouped by plan.
TEST(Batch, PrefillChunksAndMixedLoopCountsInOneBatch) {
  auto pool = fixture::cpu(2);
  SessionOptions o;
  o.chunk = 8;
  struct Case {
    int loops, prompt, feed;
    Logits want;
  };
  const Case cases[] = {{2, 5, 1, Logits::Last}, {1, 0, 8, Logits::All}, {3, 12, 6, Logits::Last},
                        {2, 2, 7, Logits::All},  {2, 6, 3, Logits::None}};
  const int K = 5;
  std::vector<std::unique_ptr<Session>> batched, alone;
  std::vector<std::vector<int32_t>> feed(K);
  std::vector<BatchEntry> entries(K);
  for (int k = 0; k < K; ++k) {
    SessionOptions ok = o;
    ok.loops = cases[k].loops;
    batched.push_back(std::make_unique<Session>(pool, ok));
    alone.push_back(std::make_unique<Session>(pool, ok));
    const auto p = ids(cases[k].prompt, 20 + k);
    if (!p.empty()) {
      batched[k]->forward(p, Logits::None);
      alone[k]->forward(p, Logits::None);
    }
    feed[k] = ids(cases[k].feed, 40 + k);
    entries[k] = {batched[k].get(), feed[k], cases[k].want, {}};
  }
  Session::forward_batch(entries);
  for (int k = 0; k < K; ++k) {
    const auto want = alone[k]->forward(feed[k], cases[k].want);
    EXPECT_LE(max_diff(entries[k].logits, want), kTol) << "entry " << k;
    EXPECT_EQ(batched[k]->position(), alone[k]->position());
  }
}

TEST(Batch, RefusedBatchChangesNoSession) {
  auto pool = fixture::cpu(1), other = fixture::cpu(1);
  SessionOptions o;
  o.chunk = 4;
  Session a(pool, o), b(pool, o), c(other, o);
  const auto one = ids(1, 1), five = ids(5, 2);
  const int32_t bad[] = {static_cast<int32_t>(tiny()->config().vocab)};
  auto run = [](std::vector<BatchEntry> e) { Session::forward_batch(e); };
  auto E = [](Session* s, std::span<const int32_t> v) { return BatchEntry{s, v, Logits::Last, {}}; };
  EXPECT_THROW(run({E(&a, one), E(&a, one)}), Error);   // a session twice
  EXPECT_THROW(run({E(&a, one), E(&b, five)}), Error);  // more ids than b's chunk
  EXPECT_THROW(run({E(&a, one), E(&b, bad)}), Error);   // id out of range
  EXPECT_THROW(run({E(nullptr, one)}), Error);
  EXPECT_EQ(a.position(), 0);
  EXPECT_EQ(b.position(), 0);
  EXPECT_EQ(c.position(), 0);
  EXPECT_NO_THROW(run({E(&a, one), E(&b, {})}));  // an empty entry is skipped
  EXPECT_EQ(a.position(), 1);
  EXPECT_EQ(b.position(), 0);
}

// A session on another engine of the same kind (a CMF skill's, after switch_backend) runs
// alone on its own engine, as forward() would, beside the batch of the first one's.
TEST(Batch, SessionOnAnotherEngineRunsAlone) {
  auto pool = fixture::cpu(1), other = fixture::cpu(1);
  SessionOptions o;
  o.chunk = 4;
  Session a(pool, o), b(pool, o), c(other, o), a1(pool, o), c1(other, o);
  const auto one = ids(1, 1), two = ids(2, 3);
  std::vector<BatchEntry> e{{&a, one, Logits::Last, {}}, {&c, two, Logits::All, {}}, {&b, one, Logits::Last, {}}};
  Session::forward_batch(e);
  EXPECT_EQ(e[1].logits, c1.forward(two, Logits::All));  // alone: the same pass, bit for bit
  EXPECT_LE(max_diff(e[0].logits, a1.forward(one, Logits::Last)), kTol);
  EXPECT_EQ(a.position(), 1);
  EXPECT_EQ(c.position(), 2);
  EXPECT_EQ(b.position(), 1);
}
