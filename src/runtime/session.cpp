#include "dory/session.h"

#include <algorithm>
#include <memory>

#include "model/forward_cpu.h"
#include "model/loop_plan.h"
#include "runtime/kv_cache.h"
#include "runtime/pool.h"

namespace dory {

constexpr int kMaxLoops = 16;

struct SessionState {
  SessionOptions opts;
  KvMode kv = KvMode::PerLoop;
  int loops = 1;
  int64_t pos = 0;
  std::vector<Step> plan;
  // caches[layer][kv_loop]; kv_loop is the pass index for recurrent layers
  // under per_loop, else 0. Created on first use.
  std::vector<std::vector<std::unique_ptr<KvCache>>> caches;
  Scratch scratch;

  // The cache `layer` uses at recurrent pass `loop`, created on first use.
  KvCache& cache_for(const DoryConfig& c, int layer, int loop);
};

KvCache& SessionState::cache_for(const DoryConfig& c, int layer, int loop) {
  const int64_t ring = c.swa_window + opts.rewind_margin + opts.chunk;
  const bool per_loop_slot = kv == KvMode::PerLoop && c.is_recurrent(layer);
  const int kv_loop = per_loop_slot ? loop : 0;
  auto& slots = caches[layer];
  if (static_cast<int>(slots.size()) <= kv_loop) slots.resize(kv_loop + 1);
  if (!slots[kv_loop]) {
    // A loop index first used mid-sequence starts from the deepest pass
    // that exists, so attention never sees a hole for earlier rows.
    KvCache* seed = nullptr;
    for (int l = kv_loop - 1; l >= 0 && !seed; --l) seed = slots[l].get();
    slots[kv_loop] = seed && pos > 0
                         ? std::make_unique<KvCache>(*seed)
                         : std::make_unique<KvCache>(c.n_kv_head * c.head_dim,
                                                     c.is_sliding(layer) ? ring : 0);
  }
  return *slots[kv_loop];
}

namespace {
void check_loops(int loops) {
  if (loops < 1 || loops > kMaxLoops)
    throw Error("loop count " + std::to_string(loops) + " is out of range (1.." +
                std::to_string(kMaxLoops) + ")");
}
void check_ids(std::span<const int32_t> ids, int64_t vocab) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      throw Error("token id " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                  " is out of range [0, " + std::to_string(vocab) + ")");
}
}  // namespace

Session::Session(std::shared_ptr<const Model> model, ThreadPool& pool, SessionOptions opts)
    : model_(std::move(model)), pool_(pool), st_(std::make_unique<SessionState>()) {
  const DoryConfig& c = model_->config();
  if (opts.chunk < 1 || opts.chunk > 4096)
    throw Error("chunk size " + std::to_string(opts.chunk) + " is out of range (1..4096)");
  if (opts.rewind_margin < 0) throw Error("rewind margin must not be negative");
  st_->opts = opts;
  st_->kv = opts.kv.value_or(c.kv_mode);
  st_->caches.resize(c.n_layer);
  set_loops(opts.loops ? opts.loops : static_cast<int>(c.n_loops));
}

Session::~Session() = default;

int64_t Session::position() const { return st_->pos; }
int Session::loops() const { return st_->loops; }
KvMode Session::kv_mode() const { return st_->kv; }

void Session::set_loops(int loops) {
  check_loops(loops);
  st_->loops = loops;
  st_->plan = build_plan(model_->config(), loops);
}

uint64_t Session::kv_bytes() const {
  uint64_t b = 0;
  for (const auto& per_layer : st_->caches)
    for (const auto& kc : per_layer)
      if (kc) b += kc->bytes();
  return b;
}

std::vector<float> Session::forward(std::span<const int32_t> ids, Logits want) {
  const DoryConfig& c = model_->config();
  const Weights& w = model_->weights();
  check_ids(ids, c.vocab);
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<float> logits;
  if (n == 0) return logits;
  const int64_t V = c.vocab;
  logits.resize(want == Logits::All ? n * V : want == Logits::Last ? V : 0);

  SessionState& S = *st_;
  CacheFor cache_for = [&](int layer, int loop) -> KvCache& { return S.cache_for(c, layer, loop); };

  for (int64_t b = 0; b < n; b += S.opts.chunk) {
    const int64_t T = std::min<int64_t>(S.opts.chunk, n - b);
    const bool last_chunk = b + T == n;
    int64_t row0 = T;
    float* out = nullptr;
    if (want == Logits::All) {
      row0 = 0;
      out = logits.data() + b * V;
    } else if (want == Logits::Last && last_chunk) {
      row0 = T - 1;
      out = logits.data();
    }
    ChunkArgs a{ids.data() + b, T, S.pos};
    forward_chunk(w, pool_, S.scratch, a, S.plan, cache_for, row0, out);
    S.pos += T;
  }
  return logits;
}

void Session::forward_batch(std::span<BatchEntry> entries) {
  // Check everything first: a refused batch changes no session.
  std::vector<BatchEntry*> live;
  for (BatchEntry& e : entries) {
    e.logits.clear();
    if (!e.session) throw Error("forward_batch: an entry has no session");
    if (e.ids.empty()) continue;
    Session& s = *e.session;
    if (!live.empty()) {
      const Session& first = *live.front()->session;
      if (s.model_ != first.model_ || &s.pool_ != &first.pool_)
        throw Error("forward_batch: the sessions must share one model and one thread pool");
    }
    for (const BatchEntry* o : live)
      if (o->session == e.session) throw Error("forward_batch: a session appears twice");
    // Sliding caches are rings sized for one chunk beyond the window.
    if (static_cast<int64_t>(e.ids.size()) > s.st_->opts.chunk)
      throw Error("forward_batch: " + std::to_string(e.ids.size()) +
                  " ids for one session exceed its chunk size " + std::to_string(s.st_->opts.chunk));
    check_ids(e.ids, s.model_->config().vocab);
    live.push_back(&e);
  }
  if (live.empty()) return;
  const Model& model = *live.front()->session->model_;
  const DoryConfig& c = model.config();
  const int64_t V = c.vocab;
  ThreadPool& pool = live.front()->session->pool_;

  // Sessions with the same loop count share a plan, so they share one pass.
  std::vector<bool> done(live.size(), false);
  for (size_t g = 0; g < live.size(); ++g) {
    if (done[g]) continue;
    const int loops = live[g]->session->st_->loops;
    std::vector<BatchEntry*> group;
    for (size_t i = g; i < live.size(); ++i)
      if (!done[i] && live[i]->session->st_->loops == loops) {
        group.push_back(live[i]);
        done[i] = true;
      }
    std::vector<int32_t> ids;
    std::vector<int64_t> pos, logit_rows;
    std::vector<int32_t> seq;
    for (size_t k = 0; k < group.size(); ++k) {
      const BatchEntry& e = *group[k];
      const int64_t p0 = e.session->st_->pos, n = static_cast<int64_t>(e.ids.size());
      const int64_t row0 = static_cast<int64_t>(ids.size());
      for (int64_t i = 0; i < n; ++i) {
        ids.push_back(e.ids[i]);
        pos.push_back(p0 + i);
        seq.push_back(static_cast<int32_t>(k));
        if (e.want == Logits::All || (e.want == Logits::Last && i == n - 1))
          logit_rows.push_back(row0 + i);
      }
    }
    std::vector<float> logits(logit_rows.size() * V);
    ChunkArgs a{ids.data(), static_cast<int64_t>(ids.size()), 0, pos.data(), seq.data()};
    SeqCacheFor cache_for = [&](int k, int layer, int loop) -> KvCache& {
      return group[k]->session->st_->cache_for(c, layer, loop);
    };
    // The first session's scratch serves the whole pass (none of them runs alone meanwhile).
    SessionState& S0 = *group.front()->session->st_;
    forward_rows(model.weights(), pool, S0.scratch, a, static_cast<int>(group.size()), S0.plan,
                 cache_for, logit_rows, logits.data());
    size_t r = 0;
    for (BatchEntry* e : group) {
      const int64_t n = static_cast<int64_t>(e->ids.size());
      const int64_t rows = e->want == Logits::All ? n : e->want == Logits::Last ? 1 : 0;
      e->logits.assign(logits.begin() + r * V, logits.begin() + (r + rows) * V);
      r += rows;
      e->session->st_->pos += n;
    }
  }
}

void Session::rollback(int64_t n) {
  SessionState& S = *st_;
  const DoryConfig& c = model_->config();
  if (n < 0 || n > S.pos)
    throw Error("rollback to position " + std::to_string(n) + " is outside 0.." +
                std::to_string(S.pos));
  // Check every cache first so a refused rollback changes nothing.
  for (int64_t layer = 0; layer < c.n_layer; ++layer)
    for (const auto& kc : S.caches[layer]) {
      if (!kc || !kc->ring()) continue;
      const int64_t need = std::max<int64_t>(0, n - c.swa_window + 1);
      if (need < kc->first())
        throw Error("cannot roll back to position " + std::to_string(n) + ": layer " +
                    std::to_string(layer) + " keeps its sliding window only from position " +
                    std::to_string(kc->first() + c.swa_window - 1) +
                    " on (raise the rewind margin, or start a new session)");
    }
  for (auto& per_layer : S.caches)
    for (auto& kc : per_layer)
      if (kc) kc->truncate(n);
  S.pos = n;
}

}  // namespace dory
