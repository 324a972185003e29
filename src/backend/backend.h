// The one narrow interface a backend (CPU, CUDA) implements: what a forward pass and a
// sequence's caches must do. Everything above it (Session, the generation path, the
// server, the tools) holds a Backend and never a thread pool, a scratch buffer or a
// device pointer; everything below it (src/backend/<name>/) is that backend's own.
//
// A pass is: begin() with the rows (ids, positions, the sequences' caches), steps() with
// a list of plan steps (any number of times: the early-exit gate decides between runs),
// then reads of chosen rows: logits() after an output block, state() after a LoopEnd.
// The plan steps name their cache slots as data (model/loop_plan.h), so a backend never
// asks anyone which cache to use: SeqCaches::prepare() makes the slots a plan names
// before the pass.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dory/model.h"
#include "dory/options.h"
#include "model/loop_plan.h"

namespace dory {

// What a sequence's caches hold, resolved from its session's options and the model file.
struct CacheSpec {
  KvMode kv = KvMode::PerLoop;
  int64_t rewind_margin = 256;  // rows a sliding layer keeps beyond its window
  int64_t chunk = 64;           // the most rows one pass writes for this sequence
  O1Params o1;                  // the far field of the full layers (on or off)
  ExactParams exact;            // rows kept exact past the seal; weights resolved when on
};

// One sequence's KV caches on a backend: a slot per (physical attention layer, Step::slot).
class SeqCaches {
 public:
  virtual ~SeqCaches() = default;
  // Creates the slots `plan` names that do not exist yet. A slot first used at a position
  // pos > 0 starts as a copy of the deepest slot its layer has, so attention never sees a
  // hole for earlier rows (a per_loop loop index used for the first time mid-sequence).
  virtual void prepare(std::span<const Step> plan, int64_t pos) = 0;
  // Throws Error (naming the layer and the oldest row it can go back to) when the caches
  // cannot forget rows from position n on; changes nothing either way.
  virtual void check_rollback(int64_t n) const = 0;
  // Forgets rows from position n on, in every slot (check_rollback first).
  virtual void truncate(int64_t n) = 0;
  virtual KvBytes bytes() const = 0;
  // Exact rows: whether a sealed slot holds rows that wait for the choice.
  virtual bool exact_waiting() const = 0;
  // Rebuilds every waiting slot's far field with its chosen rows. Returns "" or why the
  // first slot that failed did (that slot's far field goes on as first sealed). In two
  // stages (docs/model.md section 6): `final` false chooses most of the budget among the
  // rows so far and keeps the rows waiting; `final` true chooses the rest among the rows
  // that left the window since (all of the budget when no first stage ran) and ends the wait.
  virtual std::string rebuild_exact(bool final) = 0;
  // The exact-row features of every waiting slot, without choosing.
  virtual std::vector<SlotFeatures> exact_features() = 0;
};

// The rows of one pass. One sequence: row t is at position start + t of caches[0] (pos and
// seq empty). Several (continuous batching): row t is at pos[t] of sequence seq[t]; each
// sequence's rows are contiguous and at consecutive positions.
struct PassRows {
  std::span<const int32_t> ids;
  int64_t start = 0;
  std::span<const int64_t> pos;
  std::span<const int32_t> seq;
  std::span<SeqCaches* const> caches;  // per sequence, made by this backend's new_caches()
  // Adapter scales per row (rows x the model's adapter count, Weights::adapter_names): row t
  // applies adapter a at lora[t * n + a] x its alpha / rank. Empty: every --lora at its own
  // scale. Only the CPU backend runs adapters.
  std::span<const float> lora;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const Model& model() const = 0;
  virtual std::shared_ptr<const Model> model_ptr() const = 0;
  // "cpu" or "cuda".
  virtual const char* name() const = 0;
  // One line for --verbose and dory info, e.g. "cpu: 2 threads, kernels avx512bf16".
  virtual std::string describe() const = 0;

  virtual std::unique_ptr<SeqCaches> new_caches(const CacheSpec& spec) = 0;

  // Starts a pass over `rows` (embeddings, RoPE positions). The spans must stay valid
  // until the pass's last call; the slots its steps name must exist (prepare()).
  virtual void begin(const PassRows& rows) = 0;
  // Runs plan steps on the pass's rows (the input block, loops, the output block).
  virtual void steps(std::span<const Step> plan) = 0;
  // The head on the pass's current hidden rows `rows` (after an output block):
  // [rows.size() x V] logits into out.
  virtual void logits(std::span<const int64_t> rows, float* out) = 0;
  // The recurrent state of rows `rows` (after a LoopEnd): [rows.size() x H] into out
  // (what the recon router scores and dory calibrate fits).
  virtual void state(std::span<const int64_t> rows, float* out) = 0;
  // The hidden state of rows `rows` where the pass's Probe step stood: [rows.size() x H].
  // A backend without Probe steps says so (Error).
  virtual void probe(std::span<const int64_t> rows, float* out);

  // Host work beside the passes (sampling several sequences' tokens) on the backend's
  // host threads: fn(i) for i in [0, n), returning when all are done.
  virtual void host_parallel(int64_t n, const std::function<void(int64_t)>& fn) = 0;
  virtual int host_threads() const = 0;
  // Bytes a second the device's memory gives a read-only kernel of this backend (what dory
  // bench sets decode against); 0 where the backend does not measure it (the CPU: see
  // bench/stream.c and bench/peer_ab.sh).
  virtual double measured_read_bandwidth() { return 0; }
  // Prompt rows per pass when the session leaves it open (SessionOptions::chunk = 0).
  virtual int default_chunk() const { return 64; }
};

// The slot-table walk both backends' SeqCaches::prepare share: for every attention step of
// `plan` whose slot slots[layer][slot] does not exist yet, make(layer, slot, seed) builds it,
// where seed is the deepest existing slot of that layer below it (or null): a slot first used
// mid-sequence starts from it, so attention never sees a hole for earlier rows.
template <class Slot, class Make>
void make_missing_slots(const DoryConfig& c, std::span<const Step> plan,
                        std::vector<std::vector<std::unique_ptr<Slot>>>& slots, const Make& make) {
  for (const Step& st : plan) {
    if (st.op != Step::Op::Layer || !c.is_attention(st.layer)) continue;
    auto& per_layer = slots[st.layer];
    if (static_cast<int>(per_layer.size()) <= st.slot) per_layer.resize(st.slot + 1);
    if (per_layer[st.slot]) continue;
    Slot* seed = nullptr;
    for (int l = st.slot - 1; l >= 0 && !seed; --l) seed = per_layer[l].get();
    per_layer[st.slot] = make(st.layer, st.slot, seed);
  }
}

// The backends this binary was built with, in order of preference ("cuda", "cpu").
std::vector<std::string> compiled_backends();
// One line per backend for dory info: what it is, or why it is not there.
std::vector<std::string> backend_report();

}  // namespace dory
