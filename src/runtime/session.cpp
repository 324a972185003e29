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
};

namespace {
void check_loops(int loops) {
  if (loops < 1 || loops > kMaxLoops)
    throw Error("loop count " + std::to_string(loops) + " is out of range (1.." +
                std::to_string(kMaxLoops) + ")");
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
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= c.vocab)
      throw Error("token id " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                  " is out of range [0, " + std::to_string(c.vocab) + ")");
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<float> logits;
  if (n == 0) return logits;
  const int64_t V = c.vocab;
  logits.resize(want == Logits::All ? n * V : want == Logits::Last ? V : 0);

  SessionState& S = *st_;
  const int64_t ring = c.swa_window + S.opts.rewind_margin + S.opts.chunk;
  CacheFor cache_for = [&](int layer, int loop) -> KvCache& {
    const bool per_loop_slot = S.kv == KvMode::PerLoop && c.is_recurrent(layer);
    const int kv_loop = per_loop_slot ? loop : 0;
    auto& slots = S.caches[layer];
    if (static_cast<int>(slots.size()) <= kv_loop) slots.resize(kv_loop + 1);
    if (!slots[kv_loop]) {
      // A loop index first used mid-sequence starts from the deepest pass
      // that exists, so attention never sees a hole for earlier rows.
      KvCache* seed = nullptr;
      for (int l = kv_loop - 1; l >= 0 && !seed; --l) seed = slots[l].get();
      slots[kv_loop] = seed && S.pos > 0
                           ? std::make_unique<KvCache>(*seed)
                           : std::make_unique<KvCache>(c.n_kv_head * c.head_dim,
                                                       c.is_sliding(layer) ? ring : 0);
    }
    return *slots[kv_loop];
  };

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
