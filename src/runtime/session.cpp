#include "dory/session.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>

#include "backend/backend.h"
#include "model/gate.h"
#include "model/loop_plan.h"
#include "model/turbo.h"
#include "model/weights.h"

namespace dory {

constexpr int kMaxLoops = 16;

struct SessionState {
  SessionOptions opts;
  KvMode kv = KvMode::PerLoop;
  int loops = 1;
  int prompt_loops = 0;
  std::vector<float> lora;       // per-adapter scales (Session::set_lora); empty: the --lora ones
  std::vector<float> lora_rows;  // lora repeated for each row of the pass in progress
  // The rows' scales for a pass of T rows (empty when the session has none of its own).
  std::span<const float> rows_lora(int64_t T) {
    lora_rows.clear();
    for (int64_t t = 0; t < T && !lora.empty(); ++t)
      lora_rows.insert(lora_rows.end(), lora.begin(), lora.end());
    return lora_rows;
  }
  GateParams gate;        // resolved: Off, Conf or Recon
  double recon_bias = 0;  // Recon: the threshold in force
  const Router* router = nullptr;
  std::unique_ptr<Router> own_router;  // --gate recon:FILE's
  O1Params o1;
  ExactParams exact;
  int64_t rebuild_at = -1;  // position before which the far fields are rebuilt (-1: none pending)
  int64_t final_at = -1;    // the final stage's position, when the pending one is the first
  int64_t prompt_end = -1;
  bool warned = false;
  int64_t pos = 0;
  std::map<int, std::vector<Step>> plans;             // whole-token plans by loop count
  int probe_layer = -1;       // set_probe: the whole-token plans keep the hidden state there
  std::vector<float> probed;  // [rows of the last pass x H]
  std::vector<Step> plan_first, plan_rest, plan_out;  // the gate's pieces
  std::unique_ptr<SeqCaches> caches;                  // on the session's backend
  ExitTracker tracker;
  GateStats gstats;
  std::vector<int> last_passes;
  std::vector<int64_t> rows;  // scratch: the rows whose logits a pass reads

  const std::vector<Step>& plan(const DoryConfig& c, int loops);
  // Passes a chunk of T rows runs (prompt_loops for chunks nobody reads).
  int chunk_loops(bool logits_wanted) const {
    return kv == KvMode::LastLoop && prompt_loops > 0 && !logits_wanted
               ? std::min(loops, prompt_loops)
               : loops;
  }
  bool gated(int64_t T, bool logits_wanted) const {
    return gate.kind != GateParams::Kind::Off && T == 1 && logits_wanted && loops >= 2;
  }
  // Rows [r0, r1) as a list.
  std::span<const int64_t> row_range(int64_t r0, int64_t r1) {
    rows.resize(r1 - r0);
    for (int64_t r = r0; r < r1; ++r) rows[r - r0] = r;
    return rows;
  }
};

const std::vector<Step>& SessionState::plan(const DoryConfig& c, int n) {
  auto it = plans.find(n);
  if (it == plans.end()) {
    std::vector<Step> p = build_plan(c, kv, n);
    if (probe_layer >= 0) {
      // After the first time the layer runs in a token (as mean_hidden reads it).
      const auto at = std::find_if(p.begin(), p.end(), [&](const Step& st) {
        return st.op == Step::Op::Layer && st.layer == probe_layer;
      });
      if (at != p.end()) p.insert(at + 1, Step{Step::Op::Probe, -1, 0, 0});
    }
    it = plans.emplace(n, std::move(p)).first;
  }
  return it->second;
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

Session::Session(std::shared_ptr<Backend> backend, SessionOptions opts)
    : backend_(std::move(backend)), st_(std::make_unique<SessionState>()) {
  if (!backend_) throw Error("a session needs a backend");
  const DoryConfig& c = backend_->model().config();
  const Turbo& turbo = backend_->model().weights().turbo;
  if (opts.chunk == 0) opts.chunk = backend_->default_chunk();
  if (opts.chunk < 1 || opts.chunk > 4096)
    throw Error("chunk size " + std::to_string(opts.chunk) + " is out of range (1..4096)");
  if (opts.rewind_margin < 0) throw Error("rewind margin must not be negative");
  SessionState& S = *st_;
  S.opts = opts;
  // A turbo file's defaults apply to what the options leave open.
  S.kv = opts.kv.value_or(turbo.present ? KvMode::LastLoop : c.kv_mode);
  S.prompt_loops = opts.prompt_loops.value_or(turbo.present ? 1 : 0);
  if (S.prompt_loops < 0 || S.prompt_loops > kMaxLoops)
    throw Error("prompt loops " + std::to_string(S.prompt_loops) +
                " is out of range (0..16, 0 = off)");
  if (S.prompt_loops > 0 && S.kv != KvMode::LastLoop && opts.prompt_loops)
    throw Error(
        "--prompt-loops needs --kv last_loop: under per_loop a chunk with fewer passes would leave "
        "holes in the later passes' caches");
  if (S.kv != KvMode::LastLoop) S.prompt_loops = 0;
  S.o1 = opts.o1.value_or(turbo.o1.value_or(O1Params{}));
  S.o1.validate();
  // Exact rows: the option's, else the turbo file's budget with its weights.
  if (opts.exact) {
    S.exact = *opts.exact;
  } else if (S.o1.on && turbo.exact_budget && *turbo.exact_budget > 0 &&
             !turbo.exact_weights.empty()) {
    // (the file's default follows the far field: with --o1 off there is nothing to keep exact)
    S.exact.on = true;
    S.exact.budget = *turbo.exact_budget;
    S.exact.source = "the model file";
  }
  if (S.exact.on) {
    if (!S.o1.on)
      throw Error(
          "--exact needs the far field (--o1 m,w,sink,seal): rows are kept exact past its seal");
    if (S.exact.weights.empty()) {
      if (S.exact.source.empty() || S.exact.source == "the model file") {
        if (turbo.exact_weights.empty())
          throw Error("--exact " + std::to_string(S.exact.budget) +
                      ": the model file has no exact-row weights (give --exact FILE:ROWS, or make "
                      "them with dory "
                      "calibrate)");
        S.exact.weights = turbo.exact_weights;
        S.exact.source = "the model file";
      } else {
        S.exact.weights = load_exact_weights(S.exact.source, c);
      }
    }
    const int64_t nf = full_layer_count(c);
    if (static_cast<int64_t>(S.exact.weights.size()) != nf * 2 * c.n_kv_head)
      throw Error("--exact: the weights have " + std::to_string(S.exact.weights.size()) +
                  " values; this model needs " + std::to_string(nf * 2 * c.n_kv_head) +
                  " (full layers x 2 x KV heads)");
    if (S.o1.w + S.o1.sink + S.exact.budget > 8192)
      throw Error("--exact: w + sink + budget = " +
                  std::to_string(S.o1.w + S.o1.sink + S.exact.budget) + " exceeds 8192 exact rows");
    if (S.exact.spill_dir.empty()) S.exact.spill_dir = opts.spill_dir;
  } else if (!opts.spill_dir.empty()) {
    throw Error("--spill needs --exact (it is where rows wait for the choice of exact rows)");
  }
  GateParams g = opts.gate.value_or(turbo.present && !turbo.router.empty() ? parse_gate("recon")
                                                                           : GateParams{});
  if (g.kind == GateParams::Kind::Auto)
    g = turbo.router.empty() ? parse_gate("conf:0.7") : parse_gate("recon");
  if (g.kind != GateParams::Kind::Off && S.kv != KvMode::LastLoop)
    throw Error("--gate " + g.str() +
                " needs --kv last_loop: under per_loop a token that leaves after one pass would "
                "leave a hole in "
                "the second pass's cache");
  if (g.kind == GateParams::Kind::Recon && !g.router_file.empty()) {
    S.own_router = std::make_unique<Router>(load_router(g.router_file, c));
    S.router = S.own_router.get();
    S.recon_bias = g.bias.value_or(S.router->bias);
  } else if (g.kind == GateParams::Kind::Recon) {
    if (turbo.router.empty())
      throw Error(
          "--gate recon: the model file has no router (make one with dory calibrate, give "
          "recon:FILE, or use conf:THETA)");
    S.router = &turbo.router;
    S.recon_bias = g.bias.value_or(turbo.router.bias);
  }
  S.gate = g;
  CacheSpec spec;
  spec.kv = S.kv;
  spec.rewind_margin = opts.rewind_margin;
  spec.chunk = opts.chunk;
  spec.o1 = S.o1;
  spec.exact = S.exact;
  S.caches = backend_->new_caches(spec);
  set_loops(opts.loops ? opts.loops : static_cast<int>(c.n_loops));
}

Session::~Session() = default;

const Model& Session::model() const {
  return backend_->model();
}
const SessionOptions& Session::options() const {
  return st_->opts;
}
int64_t Session::position() const {
  return st_->pos;
}
int Session::loops() const {
  return st_->loops;
}
KvMode Session::kv_mode() const {
  return st_->kv;
}
const GateParams& Session::gate() const {
  return st_->gate;
}
const O1Params& Session::o1() const {
  return st_->o1;
}
const ExactParams& Session::exact() const {
  return st_->exact;
}
int Session::prompt_loops() const {
  return st_->prompt_loops;
}
GateStats Session::gate_stats() const {
  return st_->gstats;
}
const std::vector<int>& Session::last_passes() const {
  return st_->last_passes;
}

void Session::prompt_end(int64_t end) {
  SessionState& S = *st_;
  if (!S.exact.on) return;
  // A first stage before the prompt's last 512 rows (at once when fewer are left), a final
  // one before its last row, so the row that predicts the first answer token reads every
  // chosen row (docs/model.md section 6).
  S.rebuild_at = std::max(S.pos, end - 512);
  S.final_at = end - 1 > S.rebuild_at ? end - 1 : -1;
  S.prompt_end = end;
}

int64_t Session::next_rows() const {
  const SessionState& S = *st_;
  int64_t n = S.opts.chunk;
  if (S.rebuild_at > S.pos) n = std::min(n, S.rebuild_at - S.pos);
  return n;
}

// A pending rebuild of the far fields (exact rows) happens at its position.
void Session::rebuild_if_due() {
  SessionState& S = *st_;
  if (S.rebuild_at < 0 || S.pos < S.rebuild_at) return;
  // No slot has sealed yet: the rebuild waits for the first that does (within this prompt).
  if (!S.caches->exact_waiting() && S.pos < S.prompt_end) return;
  const bool final = S.final_at < 0 || S.pos >= S.final_at;
  S.rebuild_at = final ? -1 : S.final_at;
  if (final) S.final_at = -1;
  const std::string why = S.caches->rebuild_exact(final);
  if (!why.empty() && !S.warned) {
    std::fprintf(stderr, "warning: exact rows: %s; the far field goes on as first sealed\n",
                 why.c_str());
    S.warned = true;
  }
}

void Session::set_lora(std::vector<float> scales) {
  const size_t n = backend_->model().weights().adapter_names.size();
  if (!scales.empty() && scales.size() != n)
    throw Error("adapter scales: " + std::to_string(scales.size()) + " given for " +
                std::to_string(n) + " loaded adapter" + (n == 1 ? "" : "s"));
  st_->lora = std::move(scales);
}

const std::vector<float>& Session::lora() const {
  return st_->lora;
}

void Session::set_probe(int layer) {
  SessionState& S = *st_;
  const DoryConfig& c = backend_->model().config();
  if (layer >= c.n_layer)
    throw Error("skill router: phi_layer " + std::to_string(layer) + " is not one of the model's " +
                std::to_string(c.n_layer) + " layers");
  if (layer >= 0 && S.gate.kind != GateParams::Kind::Off)
    throw Error("--skill-dynamic reads every token's full pass: it needs --gate off");
  S.probe_layer = layer < 0 ? -1 : layer;
  S.plans.clear();
  S.probed.clear();
}

const std::vector<float>& Session::probed() const {
  return st_->probed;
}

void Session::switch_backend(std::shared_ptr<Backend> backend) {
  if (!backend) throw Error("switch_backend: no backend");
  const DoryConfig &a = backend_->model().config(), &b = backend->model().config();
  if (std::string(backend->name()) != backend_->name() || a.hidden != b.hidden ||
      a.n_layer != b.n_layer || a.vocab != b.vocab || a.n_head != b.n_head ||
      a.n_kv_head != b.n_kv_head || a.head_dim != b.head_dim || a.pattern != b.pattern)
    throw Error("switch_backend: the two engines do not run the same model shape on one backend kind");
  backend_ = std::move(backend);
}

void Session::set_loops(int loops) {
  check_loops(loops);
  SessionState& S = *st_;
  const DoryConfig& c = backend_->model().config();
  S.loops = loops;
  S.plan_first = build_plan(c, S.kv, 1, 0, true, false);
  S.plan_rest = build_plan(c, S.kv, loops, 1, false, false);
  S.plan_out = build_plan(c, S.kv, 0, 0, false, true);
}

KvBytes Session::kv_bytes_split() const {
  return st_->caches->bytes();
}

uint64_t Session::kv_bytes() const {
  return kv_bytes_split().total();
}

// One pass of `plan` over ids at the current position (the position does not move here).
void Session::run_pass(std::span<const int32_t> ids, const std::vector<Step>& plan,
                       int64_t logit_row0, float* logits) {
  SessionState& S = *st_;
  SeqCaches* one = S.caches.get();
  S.caches->prepare(plan, S.pos);
  Backend& be = *backend_;
  be.begin(PassRows{ids,
                    S.pos,
                    {},
                    {},
                    std::span<SeqCaches* const>(&one, 1),
                    S.rows_lora(static_cast<int64_t>(ids.size()))});
  be.steps(plan);
  const int64_t T = static_cast<int64_t>(ids.size());
  if (logit_row0 < T) be.logits(S.row_range(logit_row0, T), logits);
  if (S.probe_layer >= 0) {
    S.probed.resize(T * backend_->model().config().hidden);
    be.probe(S.row_range(0, T), S.probed.data());
  }
}

std::vector<float> Session::forward(std::span<const int32_t> ids, Logits want) {
  const DoryConfig& c = backend_->model().config();
  check_ids(ids, c.vocab);
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<float> logits;
  SessionState& S = *st_;
  S.last_passes.assign(n, 0);
  if (n == 0) return logits;
  const int64_t V = c.vocab;
  logits.resize(want == Logits::All ? n * V : want == Logits::Last ? V : 0);

  for (int64_t b = 0, T; b < n; b += T) {
    rebuild_if_due();
    T = std::min<int64_t>(next_rows(), n - b);
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
    auto part = ids.subspan(b, T);
    int passes;
    if (S.gated(T, row0 < T)) {
      passes = gated_token(part, out);
    } else {
      passes = S.chunk_loops(row0 < T);
      run_pass(part, S.plan(c, passes), row0, out);
    }
    std::fill_n(S.last_passes.begin() + b, T, passes);
    S.pos += T;
  }
  return logits;
}

ProbeRows Session::probe(std::span<const int32_t> ids) {
  SessionState& S = *st_;
  const DoryConfig& c = backend_->model().config();
  if (S.kv != KvMode::LastLoop) throw Error("probe: needs --kv last_loop");
  check_ids(ids, c.vocab);
  const int64_t n = static_cast<int64_t>(ids.size()), H = c.hidden, V = c.vocab;
  ProbeRows out;
  out.hidden = H;
  out.state1.resize(n * H);
  out.p1.resize(n);
  out.kl.resize(n);
  out.dnll.assign(n, 0.0f);
  std::vector<float> logits, lsm1(static_cast<size_t>(S.opts.chunk) * V);
  auto log_softmax = [V](const float* l, float* o) {
    const float mx = *std::max_element(l, l + V);
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(l[v] - mx));
    const float lz = mx + static_cast<float>(std::log(z));
    for (int64_t v = 0; v < V; ++v) o[v] = l[v] - lz;
  };
  std::vector<float> lsm(V);
  Backend& be = *backend_;
  SeqCaches* one = S.caches.get();
  for (int64_t b = 0; b < n; b += S.opts.chunk) {
    const int64_t T = std::min<int64_t>(S.opts.chunk, n - b);
    logits.resize(T * V);
    for (const auto* plan : {&S.plan_first, &S.plan_out, &S.plan_rest})
      S.caches->prepare(*plan, S.pos);
    be.begin(PassRows{ids.subspan(b, T),
                      S.pos,
                      {},
                      {},
                      std::span<SeqCaches* const>(&one, 1),
                      S.rows_lora(static_cast<int64_t>(ids.subspan(b, T).size()))});
    be.steps(S.plan_first);
    const auto all = S.row_range(0, T);
    be.state(all, out.state1.data() + b * H);
    be.steps(S.plan_out);
    be.logits(all, logits.data());
    for (int64_t t = 0; t < T; ++t) {
      out.p1[b + t] = static_cast<float>(top_probability(logits.data() + t * V, V));
      log_softmax(logits.data() + t * V, lsm1.data() + t * V);
    }
    be.steps(S.plan_rest);
    be.steps(S.plan_out);
    be.logits(all, logits.data());
    for (int64_t t = 0; t < T; ++t) {
      log_softmax(logits.data() + t * V, lsm.data());
      const float* l1 = lsm1.data() + t * V;
      double kl = 0;
      for (int64_t v = 0; v < V; ++v) kl += std::exp(static_cast<double>(lsm[v])) * (lsm[v] - l1[v]);
      out.kl[b + t] = static_cast<float>(std::max(0.0, kl));
      if (b + t + 1 < n) {
        const int32_t nx = ids[b + t + 1];
        out.dnll[b + t] = lsm[nx] - l1[nx];
      }
    }
    S.pos += T;
  }
  return out;
}

std::vector<float> Session::mean_hidden(std::span<const int32_t> ids, int layer) {
  SessionState& S = *st_;
  const DoryConfig& c = backend_->model().config();
  if (layer < 0 || layer >= c.n_layer)
    throw Error("skill router: phi_layer " + std::to_string(layer) + " is not one of the model's " +
                std::to_string(c.n_layer) + " layers");
  if (ids.empty()) throw Error("skill router: an empty prompt has no hidden state to route on");
  check_ids(ids, c.vocab);
  // The token's plan up to the first time `layer` runs (a recurrent layer: pass 1; an
  // output-block layer: after all passes), then a LoopEnd step: it stores n(x) as the state
  // the backend hands out, and the layers' outputs are already on the unit sphere (nGPT).
  std::vector<Step> plan = build_plan(c, S.kv, S.loops);
  const auto cut = std::find_if(plan.begin(), plan.end(), [&](const Step& st) {
    return st.op == Step::Op::Layer && st.layer == layer;
  });
  plan.erase(cut + 1, plan.end());
  plan.push_back({Step::Op::LoopEnd, -1, 0, 0});
  const int64_t n = static_cast<int64_t>(ids.size()), H = c.hidden;
  std::vector<double> acc(H, 0.0);
  std::vector<float> rows;
  Backend& be = *backend_;
  SeqCaches* one = S.caches.get();
  for (int64_t b = 0; b < n; b += S.opts.chunk) {
    const int64_t T = std::min<int64_t>(S.opts.chunk, n - b);
    S.caches->prepare(plan, S.pos);
    be.begin(PassRows{ids.subspan(b, T),
                      S.pos,
                      {},
                      {},
                      std::span<SeqCaches* const>(&one, 1),
                      S.rows_lora(T)});
    be.steps(plan);
    rows.resize(T * H);
    be.state(S.row_range(0, T), rows.data());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < H; ++i) acc[i] += rows[t * H + i];
    S.pos += T;
  }
  std::vector<float> out(H);
  for (int64_t i = 0; i < H; ++i) out[i] = static_cast<float>(acc[i] / double(n));
  return out;
}

std::vector<SlotFeatures> Session::exact_features() {
  return st_->caches->exact_features();
}

int Session::gated_token(std::span<const int32_t> ids, float* logits) {
  SessionState& S = *st_;
  const DoryConfig& c = backend_->model().config();
  Backend& be = *backend_;
  SeqCaches* one = S.caches.get();
  for (const auto* plan : {&S.plan_first, &S.plan_rest, &S.plan_out})
    S.caches->prepare(*plan, S.pos);
  const auto row = S.row_range(0, 1);
  auto finish = [&] {  // the output block and the head on the current state
    be.steps(S.plan_out);
    be.logits(row, logits);
  };
  be.begin(PassRows{ids,
                    S.pos,
                    {},
                    {},
                    std::span<SeqCaches* const>(&one, 1),
                    S.rows_lora(static_cast<int64_t>(ids.size()))});
  be.steps(S.plan_first);
  ++S.gstats.gated;
  bool one_pass = false;
  if (S.gate.kind == GateParams::Kind::Recon) {
    // No read-out needed to decide: H floats of state cross from the backend.
    std::vector<float> state(c.hidden);
    be.state(row, state.data());
    one_pass = S.router->score(state.data()) >= S.recon_bias;
    if (!one_pass) be.steps(S.plan_rest);
    finish();
  } else {
    bool probe = false;
    if (S.tracker.read_out(&probe)) {
      ++S.gstats.readouts;
      S.gstats.probes += probe;
      finish();
      one_pass = top_probability(logits, c.vocab) >= S.gate.theta;
      S.tracker.record(one_pass);
    }
    if (!one_pass) {
      // The second read-out rewrites the output block's rows of this position.
      be.steps(S.plan_rest);
      finish();
    }
  }
  S.gstats.one_pass += one_pass;
  return one_pass ? 1 : S.loops;
}

void Session::forward_batch(std::span<BatchEntry> entries) {
  // Check everything first: a refused batch changes no session.
  std::vector<BatchEntry*> live;
  for (BatchEntry& e : entries) {
    e.logits.clear();
    if (!e.session) throw Error("forward_batch: an entry has no session");
    if (e.ids.empty()) continue;
    Session& s = *e.session;
    if (!live.empty() && std::string(s.backend_->name()) != live.front()->session->backend_->name())
      throw Error("forward_batch: the sessions must run on one backend kind");
    for (const BatchEntry* o : live)
      if (o->session == e.session) throw Error("forward_batch: a session appears twice");
    // Sliding caches are rings sized for one chunk beyond the window.
    if (static_cast<int64_t>(e.ids.size()) > s.st_->opts.chunk)
      throw Error("forward_batch: " + std::to_string(e.ids.size()) +
                  " ids for one session exceed its chunk size " +
                  std::to_string(s.st_->opts.chunk));
    check_ids(e.ids, s.model().config().vocab);
    live.push_back(&e);
  }
  if (live.empty()) return;

  auto wants = [](const BatchEntry& e) { return e.want != Logits::None; };
  std::vector<bool> done(live.size(), false);
  // The batch runs on the first session's engine; a session moved to another engine of the
  // same model (a CMF skill's: Session::switch_backend) runs alone, as does one that keeps
  // its hidden states (set_probe: --skill-dynamic reads them).
  Backend* main = nullptr;
  for (BatchEntry* e : live)
    if (e->session->st_->probe_layer < 0) {
      main = e->session->backend_.get();
      break;
    }
  for (size_t i = 0; i < live.size(); ++i) {
    BatchEntry& e = *live[i];
    Session& s = *e.session;
    s.rebuild_if_due();
    // A gated decode token decides its passes on its own, and rows that reach a
    // pending rebuild point must stop there (forward() cuts them): both run alone.
    const int64_t n = static_cast<int64_t>(e.ids.size());
    if (!s.st_->gated(n, wants(e)) && n <= s.next_rows() && s.st_->probe_layer < 0 &&
        s.backend_.get() == main)
      continue;
    e.logits = s.forward(e.ids, e.want);
    done[i] = true;
  }
  if (!main) return;
  Backend& be = *main;
  const DoryConfig& c = be.model().config();
  const int64_t V = c.vocab;
  // Sessions running the same number of passes with the same cache mode share a plan, so
  // they share one pass.
  auto passes = [&](const BatchEntry& e) { return e.session->st_->chunk_loops(wants(e)); };
  for (size_t g = 0; g < live.size(); ++g) {
    if (done[g]) continue;
    const int loops = passes(*live[g]);
    const KvMode kv = live[g]->session->st_->kv;
    std::vector<BatchEntry*> group;
    for (size_t i = g; i < live.size(); ++i)
      if (!done[i] && passes(*live[i]) == loops && live[i]->session->st_->kv == kv) {
        group.push_back(live[i]);
        done[i] = true;
      }
    std::vector<int32_t> ids;
    std::vector<int64_t> pos, logit_rows;
    std::vector<int32_t> seq;
    std::vector<SeqCaches*> caches;
    std::vector<float> lora;
    const Weights& W = be.model().weights();
    const int n_ad = static_cast<int>(W.adapter_names.size());
    const std::vector<float>& lora_default = W.adapter_scales;
    const std::vector<Step>& plan = group.front()->session->st_->plan(c, loops);
    for (size_t k = 0; k < group.size(); ++k) {
      const BatchEntry& e = *group[k];
      SessionState& S = *e.session->st_;
      const int64_t p0 = S.pos, n = static_cast<int64_t>(e.ids.size());
      const int64_t row0 = static_cast<int64_t>(ids.size());
      S.caches->prepare(plan, p0);
      caches.push_back(S.caches.get());
      for (int64_t i = 0; i < n; ++i) {
        ids.push_back(e.ids[i]);
        pos.push_back(p0 + i);
        seq.push_back(static_cast<int32_t>(k));
        if (n_ad > 0) {
          // Each row takes its own session's adapter scales (the --lora ones where it has none).
          for (int a = 0; a < n_ad; ++a)
            lora.push_back(S.lora.empty() ? lora_default[a] : S.lora[a]);
        }
        if (e.want == Logits::All || (e.want == Logits::Last && i == n - 1))
          logit_rows.push_back(row0 + i);
      }
    }
    std::vector<float> logits(logit_rows.size() * V);
    bool own = false;  // only when some session sets its own scales do rows carry them
    for (const BatchEntry* e : group) own |= !e->session->st_->lora.empty();
    if (!own) lora.clear();
    be.begin(PassRows{ids, 0, pos, seq, caches, lora});
    be.steps(plan);
    be.logits(logit_rows, logits.data());
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
  if (n < 0 || n > S.pos)
    throw Error("rollback to position " + std::to_string(n) + " is outside 0.." +
                std::to_string(S.pos));
  // Checked first, so a refused rollback changes nothing.
  S.caches->check_rollback(n);
  S.caches->truncate(n);
  S.pos = n;
}

}  // namespace dory
