// A Session is all the state of one sequence: KV caches, position, scratch.
// Two sessions never share mutable state; both may share one Model.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "dory/model.h"

namespace dory {

class ThreadPool;
struct SessionState;

enum class Logits { None, Last, All };

struct SessionOptions {
  int loops = 0;                  // recurrent passes per token, 1..16; 0 = the config's
  std::optional<KvMode> kv;       // default: the config's recurrent_kv_cache_mode
  int chunk = 64;                 // prompt rows per batched forward
  int64_t rewind_margin = 256;    // rows a sliding layer keeps beyond its window
};

class Session;

// One session's share of a batched forward (Session::forward_batch).
struct BatchEntry {
  Session* session = nullptr;
  std::span<const int32_t> ids;  // fed at the session's position; at most its chunk size
  Logits want = Logits::Last;
  std::vector<float> logits;     // out: what forward(ids, want) would return
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

  // Forgets rows from position n on, in every cache. Throws Error if n is past
  // the end or older rows needed by a sliding window were already dropped.
  void rollback(int64_t n);

  int64_t position() const;
  int loops() const;
  void set_loops(int loops);  // 1..16, from the next forward on
  KvMode kv_mode() const;
  uint64_t kv_bytes() const;
  const Model& model() const { return *model_; }

 private:
  std::shared_ptr<const Model> model_;
  ThreadPool& pool_;
  std::unique_ptr<SessionState> st_;
};

}  // namespace dory
