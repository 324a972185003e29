// A Session is all the state of one sequence: its caches (on its backend), position,
// loop count and gate. Two sessions never share mutable state; both may share one Backend.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dory/model.h"
#include "dory/options.h"

namespace dory {

class Backend;
struct SessionState;
class SeqCaches;
struct Step;

class Session;

// One session's share of a batched forward (Session::forward_batch).
struct BatchEntry {
  Session* session = nullptr;
  std::span<const int32_t> ids;  // fed at the session's position; at most its chunk size
  Logits want = Logits::Last;
  std::vector<float> logits;  // out: what forward(ids, want) would return
};

class Session {
 public:
  // A sequence on `backend` (which holds the model): its caches live there.
  explicit Session(std::shared_ptr<Backend> backend, SessionOptions opts = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Runs `ids` at the current position. Returns the requested logits, row-major
  // [rows x vocab]: no rows, the last id's row, or one row per id.
  std::vector<float> forward(std::span<const int32_t> ids, Logits want);

  // Continuous batching: runs the ids of several sessions in one pass, so each
  // weight product reads the weights once for all their rows (a batched
  // product), while attention runs per session against its own KV cache. Each
  // entry's logits equal what its session's forward() gives, to float rounding
  // (a one-row matrix-vector product becomes a row of a batched one).
  // The batch runs on the first session's Backend; a session on another engine of the
  // same kind (switch_backend) or keeping its hidden states (set_probe) runs alone, as
  // forward() would. Sessions with different loop counts go through in one pass per loop
  // count. Throws Error, changing no session, on a bad id, a repeated session, sessions on
  // different backend kinds or more ids than a session's chunk.
  static void forward_batch(std::span<BatchEntry> entries);

  // Runs ids like forward() (last_loop only) with every row read out after its
  // first pass and again after all passes, as the conf gate does for a token that
  // goes on; what was read comes back.
  ProbeRows probe(std::span<const int32_t> ids);
  // A skill router's phi (CMF skills): the mean over `ids` (fed at the session's position,
  // which moves past them) of the hidden state after physical layer `layer` the first time
  // it runs in a token (input block; recurrent block: pass 1; output block: after every
  // pass of the session's loop count).
  std::vector<float> mean_hidden(std::span<const int32_t> ids, int layer);
  // From the next forward on, every whole-token pass keeps the rows' hidden state after
  // physical layer `layer` (where mean_hidden reads it): probed() gives the last pass's
  // rows [T x H]. -1: off. Gate off (Error otherwise).
  void set_probe(int layer);
  const std::vector<float>& probed() const;
  // Runs the next passes on another engine of the same model shape and backend kind (a CMF
  // skill's: --skill-dynamic), keeping this session's caches and position. Error otherwise.
  void switch_backend(std::shared_ptr<Backend> backend);
  // The exact-row features of every sealed far-field slot whose rows still wait
  // for the choice (exact rows on, before the prompt's end).
  std::vector<SlotFeatures> exact_features();

  // The current prompt ends at position `end`: with exact rows on, the far fields
  // are rebuilt with their chosen rows before the prompt's last 512 rows go in
  // (forward() and forward_batch() both stop at that point and rebuild).
  void prompt_end(int64_t end);
  // The most ids the next forward may take in one batched pass: the chunk size, cut
  // at a pending rebuild point (what a caller feeding a prompt in pieces asks).
  int64_t next_rows() const;

  // Forgets rows from position n on, in every cache. Throws Error if n is past
  // the end or older rows needed by a sliding window were already dropped.
  void rollback(int64_t n);

  int64_t position() const;
  int loops() const;
  void set_loops(int loops);  // 1..16, from the next forward on
  // Each loaded adapter's scale for this session's rows (one per --lora, in order; it
  // replaces that adapter's --lora scale); empty: the --lora scales. From the next forward on.
  void set_lora(std::vector<float> scales);
  const std::vector<float>& lora() const;
  KvMode kv_mode() const;
  uint64_t kv_bytes() const;
  KvBytes kv_bytes_split() const;
  // The settings in force (options resolved against the model file's defaults).
  const GateParams& gate() const;
  const O1Params& o1() const;
  const ExactParams& exact() const;
  int prompt_loops() const;
  GateStats gate_stats() const;
  // Recurrent passes each position of the last forward() ran (for the tests and
  // --verbose: the gate and prompt_loops change it).
  const std::vector<int>& last_passes() const;
  const Model& model() const;
  Backend& backend() const { return *backend_; }
  const std::shared_ptr<Backend>& backend_ptr() const { return backend_; }
  const SessionOptions& options() const;

 private:
  int gated_token(std::span<const int32_t> ids, float* logits);  // returns the passes it ran
  void run_pass(std::span<const int32_t> ids, const std::vector<Step>& plan, int64_t logit_row0,
                float* logits);
  void rebuild_if_due();
  std::shared_ptr<Backend> backend_;
  std::unique_ptr<SessionState> st_;
};

}  // namespace dory
