// A Session is all the state of one sequence: KV caches, position, scratch.
// Two sessions never share mutable state; both may share one Model.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dory/model.h"

namespace dory {

class ThreadPool;
struct SessionState;
struct ChunkArgs;

enum class Logits { None, Last, All };

// Early exit (SPEC section 4): after the first recurrent pass a decode token
// either leaves (its logits from one pass) or takes the remaining passes.
struct GateParams {
  enum class Kind { Off, Conf, Recon, Auto };
  Kind kind = Kind::Off;
  double theta = 0.7;          // conf: exit when the top probability >= theta
  std::optional<double> bias;  // recon: one pass when score >= bias (default: the model file's, else 0)
  std::string str() const;     // as parse_gate reads it
};
// "off" | "conf:THETA" | "recon" | "recon:BIAS" | "auto"; throws Error naming --gate.
GateParams parse_gate(const std::string& s);

// The O(1) far field of the full-attention layers (SPEC section 5).
struct O1Params {
  bool on = false;
  int m = 32;           // landmarks (at most)
  int w = 128;          // exact recent rows
  int sink = 4;         // exact first rows
  int64_t seal = 1024;  // rows a slot holds exactly before it seals
  bool clamp = false;   // rectifier: false = "aggregate" (drop a negative far part), true = clamp u at 0
  void validate() const;    // throws Error unless the numbers fit together
  std::string str() const;  // "off" or "m,w,sink,seal"
};
// "off" or "m,w,sink,seal" (e.g. "32,128,4,1024"); throws Error naming --o1.
O1Params parse_o1(const std::string& s);

// Rows kept exact past the seal (SPEC section 6).
struct ExactParams {
  bool on = false;
  int64_t budget = 0;          // rows per full-attention slot
  std::vector<float> weights;  // [full layers x n_kv_head x 2]; empty = the model file's
  std::string source;          // where the weights came from (for messages)
  std::string spill_dir;       // "" = keep the waiting rows in RAM
  std::string str() const;
};
// "off" | "ROWS" (the model file's weights) | "FILE:ROWS" (weights from FILE, a GGUF
// made by dory calibrate); throws Error naming --exact.
ExactParams parse_exact(const std::string& s);

// Every optional field left empty takes the model file's default (a "turbo"
// file, SPEC section 7), else the plain model's behaviour.
struct SessionOptions {
  int loops = 0;                  // recurrent passes per token, 1..16; 0 = the config's
  std::optional<KvMode> kv;       // default: the turbo file's last_loop, else the config's mode
  int chunk = 64;                 // prompt rows per batched forward
  int64_t rewind_margin = 256;    // rows a sliding layer keeps beyond its window
  // last_loop: a prompt chunk whose logits nobody reads runs min(loops, prompt_loops)
  // passes (SPEC section 3); 0 = off.
  std::optional<int> prompt_loops;
  std::optional<GateParams> gate;
  std::optional<O1Params> o1;
  std::optional<ExactParams> exact;
  std::string spill_dir;  // --spill: where exact rows wait between the seal and the prompt's end
};

// What the early-exit gate did (tokens that reached it, and how they went).
struct GateStats {
  int64_t gated = 0;     // decode tokens that came to the gate
  int64_t one_pass = 0;  // of them, left after one pass
  int64_t readouts = 0;  // conf: read-outs after pass 1 (the tracker skips some)
  int64_t probes = 0;    // conf: read-outs made while the tracker was skipping
  double one_pass_share() const { return gated ? double(one_pass) / double(gated) : 0.0; }
};

// Where the KV memory is: exact rows (windows, unsealed full slots, kept query
// rows) and the far fields' constant state.
struct KvBytes {
  uint64_t exact = 0, far = 0;
  uint64_t total() const { return exact + far; }
};

class Session;

// One session's share of a batched forward (Session::forward_batch).
struct BatchEntry {
  Session* session = nullptr;
  std::span<const int32_t> ids;  // fed at the session's position; at most its chunk size
  Logits want = Logits::Last;
  std::vector<float> logits;     // out: what forward(ids, want) would return
};

// What `dory calibrate` reads off a run (Session::probe): per row, the state after
// the first recurrent pass, and the top token and top probability of a read-out
// after that pass and after all of them.
struct ProbeRows {
  int64_t hidden = 0;
  std::vector<float> state1;              // [rows x hidden]
  std::vector<int32_t> top1, top_all;     // [rows]
  std::vector<float> p1;                  // top probability after pass 1 [rows]
};

// The exact-row features of one far-field slot (Session::exact_features): rows
// [lo, hi), each 2 x n_kv_head rank shares (per KV head: key residual, value norm).
struct SlotFeatures {
  int layer = 0, loop = 0;
  int64_t lo = 0, hi = 0;
  std::vector<double> f;  // [(hi - lo) x 2 n_kv_head]
};

class Session {
 public:
  Session(std::shared_ptr<const Model> model, ThreadPool& pool, SessionOptions opts = {});
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
  // Sessions must share one Model and ThreadPool; sessions with different loop
  // counts go through in one pass per loop count. Throws Error, changing no
  // session, on a bad id, a repeated session or more ids than a session's chunk.
  static void forward_batch(std::span<BatchEntry> entries);

  // Runs ids like forward() (last_loop only) with every row read out after its
  // first pass and again after all passes, as the conf gate does for a token that
  // goes on; what was read comes back.
  ProbeRows probe(std::span<const int32_t> ids);
  // The exact-row features of every sealed far-field slot whose rows still wait
  // for the choice (exact rows on, before the prompt's end).
  std::vector<SlotFeatures> exact_features();

  // The current prompt ends at position `end`: with exact rows on, the far fields
  // are rebuilt with their chosen rows before the prompt's last 512 rows go in.
  void prompt_end(int64_t end);

  // Forgets rows from position n on, in every cache. Throws Error if n is past
  // the end or older rows needed by a sliding window were already dropped.
  void rollback(int64_t n);

  int64_t position() const;
  int loops() const;
  void set_loops(int loops);  // 1..16, from the next forward on
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
  const Model& model() const { return *model_; }

 private:
  int gated_token(const ChunkArgs& a, float* logits);  // returns the passes it ran
  void rebuild_exact();
  std::shared_ptr<const Model> model_;
  ThreadPool& pool_;
  std::unique_ptr<SessionState> st_;
};

}  // namespace dory
