// The O(1) far field (docs/model.md section 5): the Nystrom read against exact attention
// where it should be close, constant memory after the seal, rollback limits,
// and the gate's exit-rate tracker (docs/model.md section 4).
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>

#include "dory/error.h"
#include "dory/session.h"
#include "backend/cpu/exact_rows.h"
#include "backend/cpu/far_field.h"
#include "model/gate.h"
#include "model/turbo.h"
#include "format/gguf.h"
#include "tiny_model.h"

using namespace dory;

namespace {

// Exact softmax attention of one query over rows [0, p] (one KV head).
std::vector<double> exact_attention(const std::vector<float>& K, const std::vector<float>& V, const float* q,
                                    int64_t p, int64_t hd) {
  std::vector<double> s(p + 1), out(hd, 0.0);
  double mx = -1e300, den = 0;
  for (int64_t j = 0; j <= p; ++j) {
    double d = 0;
    for (int64_t i = 0; i < hd; ++i) d += double(q[i]) * K[j * hd + i];
    s[j] = d / std::sqrt(double(hd));
    mx = std::max(mx, s[j]);
  }
  for (int64_t j = 0; j <= p; ++j) {
    const double e = std::exp(s[j] - mx);
    den += e;
    for (int64_t i = 0; i < hd; ++i) out[i] += e * V[j * hd + i];
  }
  for (double& x : out) x /= den;
  return out;
}

// Keys on a smooth trajectory in a rank-r subspace (coefficients 2 cos(j (f+1) / 50 + f)),
// queries on another smooth trajectory in the same subspace, random values.
double far_field_error(int rank, int m) {
  const int64_t nh = 2, nk = 1, hd = 16, t = 600;
  std::mt19937 rng(rank * 100 + m);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // An orthonormal basis of the subspace (Gram-Schmidt on random vectors).
  std::vector<std::vector<double>> B;
  while (static_cast<int>(B.size()) < rank) {
    std::vector<double> b(hd);
    for (double& x : b) x = nd(rng);
    for (const auto& c : B) {
      double d = 0;
      for (int64_t i = 0; i < hd; ++i) d += b[i] * c[i];
      for (int64_t i = 0; i < hd; ++i) b[i] -= d * c[i];
    }
    double nrm = 0;
    for (double x : b) nrm += x * x;
    for (double& x : b) x /= std::sqrt(nrm);
    B.push_back(b);
  }
  std::vector<float> K(t * hd, 0.0f), V(t * hd), Q(t * nh * hd, 0.0f);
  for (float& x : V) x = nd(rng);
  for (int64_t j = 0; j < t; ++j)
    for (int f = 0; f < rank; ++f) {
      const double kc = 2 * std::cos(double(j) / 50 * (f + 1) + f), qc = 3 * std::sin(double(j) / 40 + f);
      for (int64_t i = 0; i < hd; ++i) {
        K[j * hd + i] += static_cast<float>(kc * B[f][i]);
        for (int64_t h = 0; h < nh; ++h) Q[(j * nh + h) * hd + i] += static_cast<float>(qc * B[f][i]);
      }
    }
  O1Params p;
  p.on = true, p.m = m, p.w = 64, p.sink = 4, p.seal = 300;
  FarField ff(p, nh, nk, hd);
  ff.build(
      t, [&](int64_t j) { return K.data() + j * hd; }, [&](int64_t j) { return V.data() + j * hd; },
      [&](int64_t j) { return Q.data() + j * nh * hd; });
  EXPECT_EQ(ff.far_end(), t - p.w);
  double worst = 0;
  std::vector<float> out(hd);
  for (int trial = 0; trial < 40; ++trial) {
    const float* q = Q.data() + (rng() % t) * nh * hd;  // head 0's query at a random position
    ff.attend(0, q, t - 1, [&](int64_t j) { return K.data() + j * hd; }, [&](int64_t j) { return V.data() + j * hd; },
              out.data());
    const std::vector<double> ref = exact_attention(K, V, q, t - 1, hd);
    double err = 0, mag = 0;
    for (int64_t i = 0; i < hd; ++i) err = std::max(err, std::fabs(out[i] - ref[i])), mag = std::max(mag, std::fabs(ref[i]));
    worst = std::max(worst, err / mag);
  }
  return worst;
}

}  // namespace

// With keys (and queries) on smooth low-rank trajectories the landmarks span what
// the far rows hold, and the Nystrom read approaches exact attention as m grows.
// Measured (600 rows, w 64, sink 4): rank 1: m 8 2.1e-3, m 32 1.4e-4; rank 2: m 16
// 6.0e-3, m 32 1.4e-3; rank 3, m 32: 4.2e-3 (max relative error over 40 queries).
// The bounds below leave a factor ~3.
TEST(FarField, LowRankKeysAreCloseToExactAttention) {
  const struct {
    int rank, m;
    double bound;
  } cases[] = {{1, 32, 5e-4}, {1, 8, 7e-3}, {2, 32, 5e-3}, {3, 32, 1.5e-2}};
  for (const auto& c : cases) {
    const double e = far_field_error(c.rank, c.m);
    std::printf("  rank %d, m %2d: max relative error %.2e (bound %.0e)\n", c.rank, c.m, e, c.bound);
    EXPECT_LT(e, c.bound) << "rank " << c.rank << " m " << c.m;
  }
}

TEST(FarField, RidgeInverseInvertsAWellConditionedMatrix) {
  const int n = 5;
  std::vector<double> A(n * n), M;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) A[i * n + j] = (i == j ? 3.0 : 0.0) + 0.1 * (i + 2 * j % 3);
  ASSERT_TRUE(ridge_pinv(A, n, 1e-12, M));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int k = 0; k < n; ++k) s += M[i * n + k] * A[k * n + j];
      EXPECT_NEAR(s, i == j ? 1.0 : 0.0, 1e-9);
    }
}

// KV memory after the seal does not grow with the context: the same bytes at 2k, 8k and
// 32k positions, while exact attention grows linearly.
TEST(FarField, KvBytesAreConstantAfterTheSeal) {
  auto pool = fixture::cpu(2);
  SessionOptions o;
  o.o1 = parse_o1("8,16,2,64");
  o.kv = KvMode::LastLoop;
  Session s(pool, o);
  SessionOptions ox = o;
  ox.o1 = O1Params{};
  Session exact(pool, ox);
  std::vector<uint64_t> bytes, exact_bytes;
  int64_t fed = 0;
  for (int64_t at : {2048, 8192, 32768}) {
    const auto more = fixture::ids(static_cast<int>(at - fed), static_cast<int>(at));
    s.forward(more, Logits::None);
    if (at <= 8192) exact.forward(more, Logits::None);
    fed = at;
    bytes.push_back(s.kv_bytes());
    if (at <= 8192) exact_bytes.push_back(exact.kv_bytes());
    const KvBytes kb = s.kv_bytes_split();
    EXPECT_GT(kb.far, 0u);
    std::printf("  %6lld positions: kv %llu bytes (exact %llu + far %llu)\n", (long long)at,
                (unsigned long long)bytes.back(), (unsigned long long)kb.exact, (unsigned long long)kb.far);
  }
  EXPECT_EQ(bytes[0], bytes[1]);
  EXPECT_EQ(bytes[1], bytes[2]);
  EXPECT_GT(exact_bytes[1], 2 * exact_bytes[0]);
  EXPECT_LT(bytes[0], exact_bytes[0]);
  // Decoding past the seal goes on, logits finite.
  const auto next = fixture::ids(3, 99);
  for (int32_t id : next) {
    auto l = s.forward({&id, 1}, Logits::Last);
    for (float v : l) ASSERT_TRUE(std::isfinite(v));
  }
}

TEST(FarField, RollbackIntoTheFarFieldIsRefusedAndChangesNothing) {
  auto pool = fixture::cpu(2);
  SessionOptions o;
  o.o1 = parse_o1("8,16,2,64");
  Session s(pool, o);
  const auto seq = fixture::ids(200, 5);
  s.forward(seq, Logits::None);
  EXPECT_THROW(s.rollback(100), Error);  // rows < 200 - 64 - 16 live only in the far field
  EXPECT_EQ(s.position(), 200);
  s.rollback(190);  // inside the window: fine
  EXPECT_EQ(s.position(), 190);
}

TEST(Gate, TrackerSkipsReadOutsWhenExitsAreRareAndProbesOneInEight) {
  ExitTracker t;
  bool probe = false;
  for (int i = 0; i < 10; ++i) {  // rate 0.9^k: still >= 0.35 for k <= 9
    ASSERT_TRUE(t.read_out(&probe)) << i;
    EXPECT_FALSE(probe);
    t.record(false);
  }
  EXPECT_LT(t.rate(), 0.35);
  int reads = 0, probes = 0;
  for (int i = 0; i < 32; ++i)
    if (t.read_out(&probe)) {
      ++reads;
      probes += probe;
      t.record(false);
    }
  EXPECT_EQ(reads, 4);
  EXPECT_EQ(probes, 4);
  // Easy text again: exits pull the rate back over 0.35 and every token is read out.
  for (int i = 0; i < 8 * 12; ++i)
    if (t.read_out(&probe)) t.record(true);
  EXPECT_GE(t.rate(), 0.35);
  EXPECT_TRUE(t.read_out(&probe));
  EXPECT_FALSE(probe);
}

TEST(Gate, TopProbabilityAndParsing) {
  std::vector<float> l = {0.0f, 0.0f, -30.0f, std::log(2.0f)};
  EXPECT_NEAR(top_probability(l.data(), 4), 0.5, 1e-6);  // 2 / (1 + 1 + 2); -30 is left out
  EXPECT_EQ(parse_gate("conf:0.5").kind, GateParams::Kind::Conf);
  EXPECT_EQ(parse_gate("recon:-1.5").bias.value(), -1.5);
  EXPECT_FALSE(parse_gate("recon").bias.has_value());
  EXPECT_EQ(parse_gate("off").kind, GateParams::Kind::Off);
  for (const char* bad : {"conf", "conf:", "conf:2", "recon:x", "on", ""}) EXPECT_THROW(parse_gate(bad), Error) << bad;
}

// --- Rows kept exact (docs/model.md section 6) ---------------------------------------

// Keys on a smooth rank-2 trajectory, but one row has a component outside that
// plane: its key residual is the largest, so it is chosen first, with its two
// neighbours on each side.
TEST(ExactRows, AKeyOffAThinSubspaceIsChosenWithItsNeighbours) {
  const int64_t nk = 1, hd = 16, t = 400, star = 211;
  O1Params p;
  p.on = true, p.m = 16, p.w = 32, p.sink = 4, p.seal = 100;
  std::vector<float> K(t * hd, 0.0f), V(t * hd, 1.0f);
  for (int64_t j = 0; j < t; ++j) {
    K[j * hd + 0] = static_cast<float>(2 * std::cos(j / 30.0));
    K[j * hd + 1] = static_cast<float>(2 * std::sin(j / 45.0));
  }
  K[star * hd + 7] = 1.5f;  // off the plane
  FarField::RowFn k = [&](int64_t j) { return K.data() + j * hd; };
  FarField::RowFn v = [&](int64_t j) { return V.data() + j * hd; };
  int m = 0;
  const auto lm = FarField::key_landmarks(p, t, nk, hd, k, &m);
  EXPECT_EQ(m, 16);
  const std::vector<float> w = {1.0f, 0.0f};  // key residual only
  const auto score = exact_scores(k, v, p.sink, t - p.w, lm, m, nk, hd, w);
  const auto chosen = choose_exact_rows(score, p.sink, t - p.w, 5);
  EXPECT_EQ(chosen, (std::vector<int64_t>{star - 2, star - 1, star, star + 1, star + 2}));
  // A budget beyond the candidates takes them all, each once.
  const auto all = choose_exact_rows(score, p.sink, t - p.w, 10000);
  EXPECT_EQ(static_cast<int64_t>(all.size()), t - p.w - p.sink);
  EXPECT_EQ(rank_shares({3.0, 1.0, 2.0, 1.0}), (std::vector<double>{1.0, 1.0 / 6, 2.0 / 3, 1.0 / 6}));
}

namespace {
std::vector<float> prompt_logits(const SessionOptions& o, const std::vector<int32_t>& ids, std::string* err = nullptr) {
  auto pool = fixture::cpu(2);
  Session s(pool, o);
  s.prompt_end(static_cast<int64_t>(ids.size()));
  testing::internal::CaptureStderr();
  // Fed in three parts split where the exact-row rebuild's two stages happen (512 rows
  // before the end, and before the last row), so runs with and without it go through the
  // same chunks (last_loop results depend on the chunk schedule).
  const size_t split = ids.size() - 512, last = ids.size() - 1;
  s.forward(std::span(ids).first(split), Logits::None);
  s.forward(std::span(ids).subspan(split, last - split), Logits::None);
  auto l = s.forward(std::span(ids).subspan(last), Logits::Last);
  const std::string e = testing::internal::GetCapturedStderr();
  if (err) *err = e;
  const auto more = fixture::ids(4, 77);
  for (int32_t id : more) {
    auto d = s.forward({&id, 1}, Logits::Last);
    l.insert(l.end(), d.begin(), d.end());
  }
  return l;
}

SessionOptions far_options() {
  SessionOptions o;
  o.kv = KvMode::LastLoop;
  o.o1 = parse_o1("8,16,2,64");
  return o;
}

int files_in(const char* dir_path) {
  int n = 0;
  if (DIR* dir = opendir(dir_path)) {
    while (dirent* e = readdir(dir)) n += e->d_name[0] != '.';
    closedir(dir);
  }
  return n;
}
}  // namespace

TEST(ExactRows, RamAndSpillFilesGiveIdenticalLogitsAndTheFilesGo) {
  const auto ids = fixture::ids(900, 3);
  SessionOptions o = far_options();
  const std::vector<float> plain = prompt_logits(o, ids);
  o.exact = parse_exact("12");
  o.exact->weights.assign(3 * 2 * 2, 1.0f);  // 3 full layers x 2 features x 2 KV heads
  const std::vector<float> ram = prompt_logits(o, ids);
  // The rebuild with exact rows changes what later rows see.
  float d = 0;
  for (size_t i = 0; i < ram.size(); ++i) d = std::max(d, std::fabs(ram[i] - plain[i]));
  EXPECT_GT(d, 1e-3f);

  char tmpl[] = "/tmp/dory_spill_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  o.spill_dir = tmpl;
  {
    // Between the seal and the prompt's end the rows wait in files: two per far-field slot
    // (3 full layers under last_loop), and they go with the session.
    auto pool = fixture::cpu(2);
    Session s(pool, o);
    s.forward(std::span(ids).first(300), Logits::None);
    EXPECT_EQ(files_in(tmpl), 6);
  }
  EXPECT_EQ(files_in(tmpl), 0);
  const std::vector<float> spilled = prompt_logits(o, ids);
  ASSERT_EQ(spilled.size(), ram.size());
  EXPECT_EQ(std::memcmp(spilled.data(), ram.data(), ram.size() * sizeof(float)), 0);
  // Every spill file is gone once the far fields were rebuilt.
  EXPECT_EQ(files_in(tmpl), 0);
  rmdir(tmpl);
}

TEST(ExactRows, AnUnusableSpillDirectoryLeavesTheFarFieldWorkingWithAWarning) {
  const auto ids = fixture::ids(900, 3);
  SessionOptions o = far_options();
  const std::vector<float> plain = prompt_logits(o, ids);
  o.exact = parse_exact("12");
  o.exact->weights.assign(12, 1.0f);
  o.spill_dir = "/nonexistent/dory-spill";
  std::string err;
  const std::vector<float> got = prompt_logits(o, ids, &err);
  EXPECT_NE(err.find("warning: exact rows: cannot create /nonexistent/dory-spill"), std::string::npos) << err;
  EXPECT_NE(err.find("the far field goes on as first sealed"), std::string::npos) << err;
  ASSERT_EQ(got.size(), plain.size());
  EXPECT_EQ(std::memcmp(got.data(), plain.data(), got.size() * sizeof(float)), 0);
}

TEST(ExactRows, OptionsAreChecked) {
  auto pool = fixture::cpu(1);
  SessionOptions o;
  o.exact = parse_exact("12");
  o.exact->weights.assign(12, 1.0f);
  EXPECT_THROW(Session(pool, o), Error);  // needs --o1
  o.o1 = parse_o1("8,16,2,64");
  o.exact->weights.assign(5, 1.0f);
  EXPECT_THROW(Session(pool, o), Error);  // wrong weight count
  SessionOptions o2;
  o2.o1 = parse_o1("8,16,2,64");
  o2.exact = parse_exact("12");  // the tiny model file has no weights
  EXPECT_THROW(Session(pool, o2), Error);
  for (const char* bad : {"", "x", "0", "99999", ":5", "f:"}) EXPECT_THROW(parse_exact(bad), Error) << bad;
  EXPECT_EQ(parse_exact("t.gguf:64").source, "t.gguf");
  EXPECT_FALSE(parse_exact("off").on);
}

// --- Turbo files (docs/model.md section 7) --------------------------------------------

namespace {
std::string write_turbo_gguf(const std::function<void(gguf::Writer&)>& fill, const std::vector<std::vector<float>>& data) {
  char tmpl[] = "/tmp/dory_turbo_XXXXXX";
  const int fd = mkstemp(tmpl);
  close(fd);
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::str("dory"));
  fill(w);
  w.begin(tmpl);
  for (const auto& d : data) w.write_tensor(d.data(), d.size() * 4);
  w.finish();
  return tmpl;
}
}  // namespace

TEST(Turbo, KeysAndTensorsAreReadAndCheckedWithClearErrors) {
  DoryConfig c = fixture::tiny()->config();  // H 64, 2 KV heads, 3 full layers
  Turbo t;
  t.present = true;
  t.o1 = parse_o1("8,16,2,64");
  t.exact_budget = 12;
  t.router.dim = c.hidden;
  t.router.rank_easy = 2, t.router.rank_hard = 1;
  t.router.easy_mean.assign(64, 0.5f), t.router.hard_mean.assign(64, -0.5f);
  t.router.easy_basis.assign(128, 0.1f), t.router.hard_basis.assign(64, 0.2f);
  t.router.bias = -0.25;
  t.exact_weights.assign(3 * 4, 0.75f);
  const std::string ok = write_turbo_gguf([&](gguf::Writer& w) { declare_turbo(w, t, c); },
                                          {t.router.easy_mean, t.router.easy_basis, t.router.hard_mean,
                                           t.router.hard_basis, t.exact_weights});
  const Turbo r = read_turbo(gguf::File(ok), c);
  EXPECT_TRUE(r.present);
  EXPECT_EQ(r.o1->str(), "8,16,2,64");
  EXPECT_EQ(*r.exact_budget, 12);
  EXPECT_EQ(r.router.rank_easy, 2);
  EXPECT_EQ(r.router.rank_hard, 1);
  EXPECT_FLOAT_EQ(static_cast<float>(r.router.bias), -0.25f);
  EXPECT_EQ(r.exact_weights, t.exact_weights);
  EXPECT_EQ(load_exact_weights(ok, c), t.exact_weights);
  std::remove(ok.c_str());

  auto expect_error = [&](const std::function<void(gguf::Writer&)>& fill, const std::vector<std::vector<float>>& d,
                          const char* what) {
    const std::string p = write_turbo_gguf(fill, d);
    try {
      read_turbo(gguf::File(p), c);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    std::remove(p.c_str());
  };
  expect_error([](gguf::Writer& w) { w.set("dory.turbo.o1", gguf::Value::array(gguf::VType::U32, {gguf::Value::u32(8)})); },
               {}, "dory.turbo.o1");
  expect_error([](gguf::Writer& w) {
    w.set("dory.turbo.o1", gguf::Value::array(gguf::VType::U32, {gguf::Value::u32(8), gguf::Value::u32(16),
                                                                  gguf::Value::u32(2), gguf::Value::u32(20)}));
  }, {}, "seal");
  expect_error([](gguf::Writer& w) { w.set("dory.turbo.exit_bias", gguf::Value::str("x")); }, {}, "dory.turbo.exit_bias");
  expect_error([](gguf::Writer& w) { w.set("dory.turbo.exact_budget", gguf::Value::u32(100000)); }, {},
               "dory.turbo.exact_budget");
  expect_error([](gguf::Writer& w) { w.add_tensor("dory_router.easy_mean", DType::F32, {64}); },
               {std::vector<float>(64, 1.0f)}, "needs all four");
  expect_error([](gguf::Writer& w) { w.add_tensor("dory_exact.weight", DType::F32, {2, 4}); },
               {std::vector<float>(8, 1.0f)}, "one row per full-attention layer");
  expect_error([](gguf::Writer& w) { w.add_tensor("dory_exact.weight", DType::F32, {3, 5}); },
               {std::vector<float>(15, 1.0f)}, "wrong shape");
}

// --gate recon:FILE[:BIAS]: the router of a dory calibrate GGUF, or a raw f32 file (one header
// float, then easy mean, easy basis, hard mean, hard basis; docs/turbo.md), both written here
// and read back equal; a raw file of the wrong size and a missing file are one-line errors.
TEST(Turbo, RouterFilesRawAndGguf) {
  DoryConfig c = fixture::tiny()->config();  // H 64
  Router r;
  r.dim = c.hidden, r.rank_easy = r.rank_hard = 2;
  std::mt19937 g(3);
  std::normal_distribution<float> nd;
  for (auto* v : {&r.easy_mean, &r.hard_mean}) for (int i = 0; i < 64; ++i) v->push_back(nd(g));
  for (auto* v : {&r.easy_basis, &r.hard_basis}) for (int i = 0; i < 128; ++i) v->push_back(nd(g));
  const std::string raw = testing::TempDir() + "router_test.f32";
  write_raw_router(raw, r);
  const Router back = load_router(raw, c);
  EXPECT_EQ(back.rank_easy, 2);
  EXPECT_EQ(back.easy_mean, r.easy_mean);
  EXPECT_EQ(back.easy_basis, r.easy_basis);
  EXPECT_EQ(back.hard_mean, r.hard_mean);
  EXPECT_EQ(back.hard_basis, r.hard_basis);
  EXPECT_EQ(back.bias, 0.0);  // a raw file carries no bias: recon:FILE:BIAS gives one
  std::vector<float> x(64);
  for (float& v : x) v = nd(g);
  EXPECT_EQ(back.score(x.data()), r.score(x.data()));

  const GateParams gp = parse_gate("recon:" + raw + ":-0.5");
  EXPECT_EQ(gp.router_file, raw);
  EXPECT_EQ(gp.bias.value(), -0.5);
  EXPECT_EQ(gp.str(), "recon:" + raw + ":-0.5");
  EXPECT_FALSE(parse_gate("recon:" + raw).bias.has_value());
  EXPECT_EQ(parse_gate("recon:" + raw).router_file, raw);

  Turbo t;
  t.router = r;
  t.router.bias = 0.125;
  const std::string gg = write_turbo_gguf([&](gguf::Writer& w) { declare_turbo(w, t, c); },
                                          {r.easy_mean, r.easy_basis, r.hard_mean, r.hard_basis});
  const Router from_gguf = load_router(gg, c);
  EXPECT_EQ(from_gguf.hard_basis, r.hard_basis);
  EXPECT_FLOAT_EQ(static_cast<float>(from_gguf.bias), 0.125f);  // the file's exit bias
  std::remove(gg.c_str());

  auto message = [&](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  {  // one float short
    std::FILE* f = std::fopen(raw.c_str(), "wb");
    std::vector<float> v(1 + 2 * 3 * 64 - 1, 0.0f);
    std::fwrite(v.data(), 4, v.size(), f);
    std::fclose(f);
  }
  EXPECT_NE(message([&] { load_router(raw, c); }).find("1 + 2 x (1 + rank) x 64 floats"), std::string::npos);
  {  // a mean only: rank 0 is refused
    std::FILE* f = std::fopen(raw.c_str(), "wb");
    std::vector<float> v(1 + 2 * 64, 0.0f);
    std::fwrite(v.data(), 4, v.size(), f);
    std::fclose(f);
  }
  EXPECT_NE(message([&] { load_router(raw, c); }).find("rank >= 1"), std::string::npos);
  {  // not a whole number of floats
    std::FILE* f = std::fopen(raw.c_str(), "wb");
    std::fwrite("abcdefg", 1, 7, f);
    std::fclose(f);
  }
  EXPECT_NE(message([&] { load_router(raw, c); }).find("4-byte floats"), std::string::npos);
  std::remove(raw.c_str());
  EXPECT_NE(message([&] { parse_gate("recon:" + raw + ":1"); }).find("no file"), std::string::npos);
}
