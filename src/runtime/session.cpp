#include "dory/session.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>

#include "model/forward_cpu.h"
#include "model/gate.h"
#include "model/turbo.h"
#include "model/weights.h"
#include "model/loop_plan.h"
#include "runtime/kv_cache.h"
#include "runtime/pool.h"

namespace dory {

constexpr int kMaxLoops = 16;

struct SessionState {
  SessionOptions opts;
  KvMode kv = KvMode::PerLoop;
  int loops = 1;
  int prompt_loops = 0;
  GateParams gate;        // resolved: Off, Conf or Recon
  double recon_bias = 0;  // Recon: the threshold in force
  const Router* router = nullptr;
  O1Params o1;
  ExactParams exact;
  int64_t rebuild_at = -1;  // position before which the far fields are rebuilt (-1: none pending)
  int64_t prompt_end = -1;
  bool warned = false;
  int64_t pos = 0;
  std::map<int, std::vector<Step>> plans;  // whole-token plans by loop count
  std::vector<Step> plan_first, plan_rest, plan_out;  // the gate's pieces
  // caches[layer][kv_loop]; kv_loop is the pass index for recurrent layers
  // under per_loop, else 0. Created on first use.
  std::vector<std::vector<std::unique_ptr<KvCache>>> caches;
  Scratch scratch;
  ExitTracker tracker;
  GateStats gstats;
  std::vector<int> last_passes;

  // The cache `layer` uses at recurrent pass `loop`, created on first use.
  KvCache& cache_for(const DoryConfig& c, int layer, int loop);
  const std::vector<Step>& plan(const DoryConfig& c, int loops);
  // Passes a chunk of T rows runs (prompt_loops for chunks nobody reads).
  int chunk_loops(bool logits_wanted) const {
    return kv == KvMode::LastLoop && prompt_loops > 0 && !logits_wanted ? std::min(loops, prompt_loops) : loops;
  }
  bool gated(int64_t T, bool logits_wanted) const {
    return gate.kind != GateParams::Kind::Off && T == 1 && logits_wanted && loops >= 2;
  }
};

const std::vector<Step>& SessionState::plan(const DoryConfig& c, int n) {
  auto it = plans.find(n);
  if (it == plans.end()) it = plans.emplace(n, build_plan(c, n)).first;
  return it->second;
}

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
    if (seed && pos > 0) {
      slots[kv_loop] = std::make_unique<KvCache>(*seed);
    } else {
      slots[kv_loop] = std::make_unique<KvCache>(c.n_kv_head * c.head_dim, c.is_sliding(layer) ? ring : 0);
      if (!c.is_sliding(layer) && o1.on) {
        KvCache& kc = *slots[kv_loop];
        kc.enable_far(o1, c.n_head, c.n_kv_head, c.head_dim, o1.w + opts.rewind_margin + opts.chunk);
        if (exact.on) {
          // This layer's row of the weights: full layers in order.
          int64_t idx = 0;
          for (int l = 0; l < layer; ++l) idx += c.pattern[l] == '*';
          const int64_t wn = 2 * c.n_kv_head;
          kc.enable_exact(std::vector<float>(exact.weights.begin() + idx * wn, exact.weights.begin() + (idx + 1) * wn),
                          exact.budget, exact.spill_dir, "L" + std::to_string(layer) + "-" + std::to_string(kv_loop));
        }
      }
    }
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
  const Turbo& turbo = model_->weights().turbo;
  if (opts.chunk < 1 || opts.chunk > 4096)
    throw Error("chunk size " + std::to_string(opts.chunk) + " is out of range (1..4096)");
  if (opts.rewind_margin < 0) throw Error("rewind margin must not be negative");
  SessionState& S = *st_;
  S.opts = opts;
  // A turbo file's defaults apply to what the options leave open.
  S.kv = opts.kv.value_or(turbo.present ? KvMode::LastLoop : c.kv_mode);
  S.prompt_loops = opts.prompt_loops.value_or(turbo.present ? 1 : 0);
  if (S.prompt_loops < 0 || S.prompt_loops > kMaxLoops)
    throw Error("prompt loops " + std::to_string(S.prompt_loops) + " is out of range (0..16, 0 = off)");
  if (S.prompt_loops > 0 && S.kv != KvMode::LastLoop && opts.prompt_loops)
    throw Error("--prompt-loops needs --kv last_loop: under per_loop a chunk with fewer passes would leave "
                "holes in the later passes' caches");
  if (S.kv != KvMode::LastLoop) S.prompt_loops = 0;
  S.o1 = opts.o1.value_or(turbo.o1.value_or(O1Params{}));
  S.o1.validate();
  // Exact rows: the option's, else the turbo file's budget with its weights.
  if (opts.exact) {
    S.exact = *opts.exact;
  } else if (S.o1.on && turbo.exact_budget && *turbo.exact_budget > 0 && !turbo.exact_weights.empty()) {
    // (the file's default follows the far field: with --o1 off there is nothing to keep exact)
    S.exact.on = true;
    S.exact.budget = *turbo.exact_budget;
    S.exact.source = "the model file";
  }
  if (S.exact.on) {
    if (!S.o1.on) throw Error("--exact needs the far field (--o1 m,w,sink,seal): rows are kept exact past its seal");
    if (S.exact.weights.empty()) {
      if (S.exact.source.empty() || S.exact.source == "the model file") {
        if (turbo.exact_weights.empty())
          throw Error("--exact " + std::to_string(S.exact.budget) +
                      ": the model file has no exact-row weights (give --exact FILE:ROWS, or make them with dory "
                      "calibrate)");
        S.exact.weights = turbo.exact_weights;
        S.exact.source = "the model file";
      } else {
        S.exact.weights = load_exact_weights(S.exact.source, c);
      }
    }
    const int64_t nf = full_layer_count(c);
    if (static_cast<int64_t>(S.exact.weights.size()) != nf * 2 * c.n_kv_head)
      throw Error("--exact: the weights have " + std::to_string(S.exact.weights.size()) + " values; this model needs " +
                  std::to_string(nf * 2 * c.n_kv_head) + " (full layers x 2 x KV heads)");
    if (S.o1.w + S.o1.sink + S.exact.budget > 8192)
      throw Error("--exact: w + sink + budget = " + std::to_string(S.o1.w + S.o1.sink + S.exact.budget) +
                  " exceeds 8192 exact rows");
    if (S.exact.spill_dir.empty()) S.exact.spill_dir = opts.spill_dir;
  } else if (!opts.spill_dir.empty()) {
    throw Error("--spill needs --exact (it is where rows wait for the choice of exact rows)");
  }
  GateParams g = opts.gate.value_or(turbo.present && !turbo.router.empty() ? parse_gate("recon") : GateParams{});
  if (g.kind == GateParams::Kind::Auto) g = turbo.router.empty() ? parse_gate("conf:0.7") : parse_gate("recon");
  if (g.kind != GateParams::Kind::Off && S.kv != KvMode::LastLoop)
    throw Error("--gate " + g.str() +
                " needs --kv last_loop: under per_loop a token that leaves after one pass would leave a hole in "
                "the second pass's cache");
  if (g.kind == GateParams::Kind::Recon) {
    if (turbo.router.empty())
      throw Error("--gate recon: the model file has no router (make one with dory calibrate, or use conf:THETA)");
    S.router = &turbo.router;
    S.recon_bias = g.bias.value_or(turbo.router.bias);
  }
  S.gate = g;
  S.caches.resize(c.n_layer);
  set_loops(opts.loops ? opts.loops : static_cast<int>(c.n_loops));
}

Session::~Session() = default;

int64_t Session::position() const { return st_->pos; }
int Session::loops() const { return st_->loops; }
KvMode Session::kv_mode() const { return st_->kv; }
const GateParams& Session::gate() const { return st_->gate; }
const O1Params& Session::o1() const { return st_->o1; }
const ExactParams& Session::exact() const { return st_->exact; }

void Session::prompt_end(int64_t end) {
  SessionState& S = *st_;
  if (!S.exact.on) return;
  // Before the prompt's last 512 rows (at once when fewer are left).
  S.rebuild_at = std::max(S.pos, end - 512);
  S.prompt_end = end;
}

void Session::rebuild_exact() {
  SessionState& S = *st_;
  bool any = false;
  for (const auto& per_layer : S.caches)
    for (const auto& kc : per_layer) any |= kc && kc->has_store();
  // No slot has sealed yet: the rebuild waits for the first that does (within this prompt).
  if (!any && S.pos < S.prompt_end) return;
  S.rebuild_at = -1;
  for (auto& per_layer : S.caches)
    for (auto& kc : per_layer) {
      if (!kc || !kc->has_store()) continue;
      std::string why;
      if (!kc->rebuild_exact(&why) && !S.warned) {
        std::fprintf(stderr, "warning: exact rows: %s; the far field goes on as first sealed\n", why.c_str());
        S.warned = true;
      }
    }
}
int Session::prompt_loops() const { return st_->prompt_loops; }
GateStats Session::gate_stats() const { return st_->gstats; }
const std::vector<int>& Session::last_passes() const { return st_->last_passes; }

void Session::set_loops(int loops) {
  check_loops(loops);
  SessionState& S = *st_;
  const DoryConfig& c = model_->config();
  S.loops = loops;
  S.plan_first = build_plan(c, 1, 0, true, false);
  S.plan_rest = build_plan(c, loops, 1, false, false);
  S.plan_out = build_plan(c, 0, 0, false, true);
}

KvBytes Session::kv_bytes_split() const {
  KvBytes b;
  for (const auto& per_layer : st_->caches)
    for (const auto& kc : per_layer)
      if (kc) {
        b.far += kc->far_bytes();
        b.exact += kc->bytes() - kc->far_bytes();
      }
  return b;
}

uint64_t Session::kv_bytes() const { return kv_bytes_split().total(); }

std::vector<float> Session::forward(std::span<const int32_t> ids, Logits want) {
  const DoryConfig& c = model_->config();
  const Weights& w = model_->weights();
  check_ids(ids, c.vocab);
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<float> logits;
  SessionState& S = *st_;
  S.last_passes.assign(n, 0);
  if (n == 0) return logits;
  const int64_t V = c.vocab;
  logits.resize(want == Logits::All ? n * V : want == Logits::Last ? V : 0);

  CacheFor cache_for = [&](int layer, int loop) -> KvCache& { return S.cache_for(c, layer, loop); };

  for (int64_t b = 0, T; b < n; b += T) {
    // A pending rebuild of the far fields (exact rows) happens at its position.
    if (S.rebuild_at >= 0 && S.pos >= S.rebuild_at) rebuild_exact();
    T = std::min<int64_t>(S.opts.chunk, n - b);
    if (S.rebuild_at > S.pos) T = std::min(T, S.rebuild_at - S.pos);
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
    int passes;
    if (S.gated(T, row0 < T)) {
      passes = gated_token(a, out);
    } else {
      passes = S.chunk_loops(row0 < T);
      forward_chunk(w, pool_, S.scratch, a, S.plan(c, passes), cache_for, row0, out);
    }
    std::fill_n(S.last_passes.begin() + b, T, passes);
    S.pos += T;
  }
  return logits;
}

ProbeRows Session::probe(std::span<const int32_t> ids) {
  SessionState& S = *st_;
  const DoryConfig& c = model_->config();
  const Weights& w = model_->weights();
  if (S.kv != KvMode::LastLoop) throw Error("probe: needs --kv last_loop");
  check_ids(ids, c.vocab);
  const int64_t n = static_cast<int64_t>(ids.size()), H = c.hidden, V = c.vocab;
  ProbeRows out;
  out.hidden = H;
  out.state1.resize(n * H);
  out.top1.resize(n);
  out.top_all.resize(n);
  out.p1.resize(n);
  CacheFor cache_for = [&](int layer, int loop) -> KvCache& { return S.cache_for(c, layer, loop); };
  std::vector<float> logits;
  auto argmax = [&](const float* l) {
    return static_cast<int32_t>(std::max_element(l, l + V) - l);
  };
  for (int64_t b = 0; b < n; b += S.opts.chunk) {
    const int64_t T = std::min<int64_t>(S.opts.chunk, n - b);
    ChunkArgs a{ids.data() + b, T, S.pos};
    Scratch& s = S.scratch;
    logits.resize(T * V);
    forward_begin(w, s, a);
    forward_steps(w, pool_, s, a, S.plan_first, cache_for);
    std::copy_n(s.state.data(), T * H, out.state1.data() + b * H);
    forward_steps(w, pool_, s, a, S.plan_out, cache_for);
    forward_head(w, pool_, s, a, 0, logits.data());
    for (int64_t t = 0; t < T; ++t) {
      out.top1[b + t] = argmax(logits.data() + t * V);
      out.p1[b + t] = static_cast<float>(top_probability(logits.data() + t * V, V));
    }
    forward_steps(w, pool_, s, a, S.plan_rest, cache_for);
    forward_steps(w, pool_, s, a, S.plan_out, cache_for);
    forward_head(w, pool_, s, a, 0, logits.data());
    for (int64_t t = 0; t < T; ++t) out.top_all[b + t] = argmax(logits.data() + t * V);
    S.pos += T;
  }
  return out;
}

std::vector<SlotFeatures> Session::exact_features() {
  std::vector<SlotFeatures> out;
  for (size_t layer = 0; layer < st_->caches.size(); ++layer)
    for (size_t loop = 0; loop < st_->caches[layer].size(); ++loop) {
      KvCache* kc = st_->caches[layer][loop].get();
      if (!kc || !kc->has_store()) continue;
      SlotFeatures f;
      f.layer = static_cast<int>(layer);
      f.loop = static_cast<int>(loop);
      if (kc->exact_features(&f.lo, &f.hi, &f.f)) out.push_back(std::move(f));
    }
  return out;
}

int Session::gated_token(const ChunkArgs& a, float* logits) {
  SessionState& S = *st_;
  const DoryConfig& c = model_->config();
  const Weights& w = model_->weights();
  Scratch& s = S.scratch;
  CacheFor cache_for = [&](int layer, int loop) -> KvCache& { return S.cache_for(c, layer, loop); };
  auto finish = [&] {  // the output block and the head on the current state
    forward_steps(w, pool_, s, a, S.plan_out, cache_for);
    forward_head(w, pool_, s, a, 0, logits);
  };
  forward_begin(w, s, a);
  forward_steps(w, pool_, s, a, S.plan_first, cache_for);
  ++S.gstats.gated;
  bool one = false;
  if (S.gate.kind == GateParams::Kind::Recon) {
    one = S.router->score(s.state.data()) >= S.recon_bias;  // no read-out needed to decide
    if (!one) forward_steps(w, pool_, s, a, S.plan_rest, cache_for);
    finish();
  } else {
    bool probe = false;
    if (S.tracker.read_out(&probe)) {
      ++S.gstats.readouts;
      S.gstats.probes += probe;
      finish();
      one = top_probability(logits, c.vocab) >= S.gate.theta;
      S.tracker.record(one);
    }
    if (!one) {
      // The second read-out rewrites the output block's rows of this position.
      forward_steps(w, pool_, s, a, S.plan_rest, cache_for);
      finish();
    }
  }
  S.gstats.one_pass += one;
  return one ? 1 : S.loops;
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

  // A gated decode token decides its passes on its own: it runs alone.
  auto wants = [](const BatchEntry& e) { return e.want != Logits::None; };
  std::vector<bool> done(live.size(), false);
  for (size_t i = 0; i < live.size(); ++i) {
    BatchEntry& e = *live[i];
    if (!e.session->st_->gated(static_cast<int64_t>(e.ids.size()), wants(e))) continue;
    e.logits = e.session->forward(e.ids, e.want);
    done[i] = true;
  }
  // Sessions running the same number of passes share a plan, so they share one pass.
  auto passes = [&](const BatchEntry& e) { return e.session->st_->chunk_loops(wants(e)); };
  for (size_t g = 0; g < live.size(); ++g) {
    if (done[g]) continue;
    const int loops = passes(*live[g]);
    std::vector<BatchEntry*> group;
    for (size_t i = g; i < live.size(); ++i)
      if (!done[i] && passes(*live[i]) == loops) {
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
    forward_rows(model.weights(), pool, S0.scratch, a, static_cast<int>(group.size()), S0.plan(c, loops),
                 cache_for, logit_rows, logits.data());
    size_t r = 0;
    for (BatchEntry* e : group) {
      const int64_t n = static_cast<int64_t>(e->ids.size());
      const int64_t rows = e->want == Logits::All ? n : e->want == Logits::Last ? 1 : 0;
      e->logits.assign(logits.begin() + r * V, logits.begin() + (r + rows) * V);
      r += rows;
      e->session->st_->pos += n;
      e->session->st_->last_passes.assign(n, loops);
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
      if (!kc) continue;
      const int64_t floor = kc->rollback_floor(c.swa_window);
      if (n >= floor) continue;
      if (kc->far())
        throw Error("cannot roll back to position " + std::to_string(n) + ": layer " + std::to_string(layer) +
                    " holds rows before position " + std::to_string(floor) +
                    " only in its far field (start a new session)");
      throw Error("cannot roll back to position " + std::to_string(n) + ": layer " +
                  std::to_string(layer) + " keeps its sliding window only from position " +
                  std::to_string(floor) + " on (raise the rewind margin, or start a new session)");
    }
  for (auto& per_layer : S.caches)
    for (auto& kc : per_layer)
      if (kc) kc->truncate(n);
  S.pos = n;
}

}  // namespace dory
