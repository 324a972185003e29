// Session behaviour on a small random checkpoint made by the test fixture
// (scripts/make_checkpoint.py, tiny preset: W = 4, 12 layers, 2 loops).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>

#include "dory/session.h"
#include "tiny_model.h"

using namespace dory;
using dory::fixture::ids;
using dory::fixture::tiny;

namespace {

float max_diff(const float* a, const float* b, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

}  // namespace

TEST(Session, RollbackThenContinueEqualsStraightRun) {
  auto pool = fixture::cpu(2);
  const int64_t V = tiny()->config().vocab;
  for (KvMode kv : {KvMode::PerLoop, KvMode::LastLoop}) {
    SessionOptions o;
    o.kv = kv;
    o.chunk = 4;  // same chunk schedule on both paths, so last_loop agrees too
    const auto seq = ids(20, 1), junk = ids(4, 2);
    Session straight(pool, o);
    auto want = straight.forward(seq, Logits::All);

    Session s(pool, o);
    s.forward(std::span(seq).first(12), Logits::None);
    s.forward(junk, Logits::Last);  // rows 12..15 we will forget
    ASSERT_EQ(s.position(), 16);
    s.rollback(12);
    ASSERT_EQ(s.position(), 12);
    auto got = s.forward(std::span(seq).subspan(12), Logits::All);
    ASSERT_EQ(got.size(), 8u * V);
    // Same operations in the same order: equal to float rounding (none expected).
    EXPECT_LE(max_diff(got.data(), want.data() + 12 * V, got.size()), 1e-6f) << kv_mode_name(kv);
    // And the junk really changed things before the rollback (the test means something).
    Session s2(pool, o);
    s2.forward(std::span(seq).first(12), Logits::None);
    s2.forward(junk, Logits::None);
    auto wrong = s2.forward(std::span(seq).subspan(12), Logits::All);
    EXPECT_GT(max_diff(wrong.data(), want.data() + 12 * V, wrong.size()), 1e-3f);
  }
}

TEST(Session, RollbackPastTheSlidingMarginIsRefusedAndChangesNothing) {
  auto pool = fixture::cpu(1);
  SessionOptions o;
  o.chunk = 1;
  o.rewind_margin = 0;  // ring = W + 0 + 1 = 5 rows
  Session s(pool, o);
  const auto seq = ids(20, 3);
  s.forward(seq, Logits::None);
  EXPECT_THROW(s.rollback(5), Error);
  EXPECT_EQ(s.position(), 20);
  EXPECT_NO_THROW(s.rollback(19));  // one row back stays within the ring
  EXPECT_THROW(s.rollback(21), Error);
  EXPECT_THROW(s.rollback(-1), Error);
}

TEST(Session, DecodeEqualsPrefillAndLastEqualsAll) {
  auto pool = fixture::cpu(2);
  const int64_t V = tiny()->config().vocab;
  const auto seq = ids(10, 4);
  Session a(pool, {});
  auto all = a.forward(seq, Logits::All);
  Session b(pool, {});
  b.forward(std::span(seq).first(9), Logits::None);
  auto last = b.forward(std::span(seq).subspan(9), Logits::Last);  // one row: matvec path
  ASSERT_EQ(last.size(), size_t(V));
  EXPECT_LE(max_diff(last.data(), all.data() + 9 * V, V), 1e-4f);  // f32 matmat vs matvec order
  Session c(pool, {});
  auto only_last = c.forward(seq, Logits::Last);
  // Only the last row's logits: the head runs one row (matvec) instead of the
  // GEMM, so the two agree to rounding.
  EXPECT_LE(max_diff(only_last.data(), all.data() + 9 * V, V), 1e-4f);
  EXPECT_TRUE(c.forward({}, Logits::All).empty());
}

TEST(Session, OutOfRangeIdsAreRejectedBeforeAnythingMoves) {
  auto pool = fixture::cpu(1);
  Session s(pool, {});
  std::vector<int32_t> bad{1, 2, static_cast<int32_t>(tiny()->config().vocab)};
  EXPECT_THROW(s.forward(bad, Logits::All), Error);
  bad[2] = -1;
  EXPECT_THROW(s.forward(bad, Logits::All), Error);
  EXPECT_EQ(s.position(), 0);
}

TEST(Session, LoopCountIsPerRequestAndBounded) {
  auto pool = fixture::cpu(1);
  const auto seq = ids(6, 5);
  SessionOptions o;
  o.loops = 1;
  Session one(pool, o);
  o.loops = 3;
  Session three(pool, o);
  auto a = one.forward(seq, Logits::Last), b = three.forward(seq, Logits::Last);
  EXPECT_GT(max_diff(a.data(), b.data(), a.size()), 1e-3f);
  EXPECT_EQ(three.loops(), 3);
  EXPECT_THROW(one.set_loops(0), Error);
  EXPECT_THROW(one.set_loops(17), Error);
  o.loops = 17;
  EXPECT_THROW(Session(pool, o), Error);
}

TEST(Session, SlidingCachesStayBoundedFullCachesGrow) {
  auto pool = fixture::cpu(1);
  SessionOptions o;
  o.chunk = 8;
  Session s(pool, o);
  s.forward(ids(400, 6), Logits::None);
  const uint64_t at400 = s.kv_bytes();
  s.forward(ids(400, 7), Logits::None);
  const uint64_t at800 = s.kv_bytes();
  EXPECT_GT(at800, at400);  // full layers keep everything
  EXPECT_LT(at800, 2 * at400 + 1);  // sliding rings did not grow
}
