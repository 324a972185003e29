// The server's generation engine: a fixed set of slots (one Sequence each: a session and
// the ids its caches hold) and one thread that runs them all with continuous batching.
// Prefix reuse, the prompt's end, stop strings and end-of-text are the generation path's
// (dory/generate.h: Sequence, TextStream), as for dory run and dory chat.
//
// Every step of the loop makes one batched forward (Session::forward_batch):
// the next token of every decoding slot plus up to `prefill_rows` prompt rows
// of slots still reading their prompts, so each weight matrix is read once per
// step for all of them. A job waits in a FIFO queue until a slot is idle; it
// takes the idle slot whose cached tokens share the longest prefix with its
// prompt (ties: the least recently used) and feeds only what differs.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dory/generate.h"
#include "dory/session.h"
#include "runtime/sampler.h"

namespace dory {
class Tokenizer;
}

namespace dory::server {

using Clock = std::chrono::steady_clock;

// Work of a job's own around the engine's passes (a request's "skill": "dynamic"), run on
// the engine thread; either may throw Error, which fails the job. A job with hooks runs in
// its slot alone (Session::forward_batch runs probing sessions alone), starts from an empty
// cache and leaves none for the next job (its rows were written by other weights).
struct JobHooks {
  virtual ~JobHooks() = default;
  // Before the prompt's first row: may set_probe and move the session to another engine of
  // the same model (Session::switch_backend).
  virtual void start(Session& s) = 0;
  // After each pass that fed a generated token.
  virtual void after_token(Session& s) = 0;
};

// What a request asks for, already validated.
struct JobSpec {
  std::vector<int32_t> prompt;  // at least one id, shorter than the context
  SamplingParams sampling;
  int64_t max_tokens = -1;  // -1: until end of text or the context is full
  std::vector<std::string> stop;
  bool ignore_eos = false;
  int loops = 0;            // 0: the server's
  std::vector<float> lora;  // each loaded adapter's scale for this request; empty: the --lora ones
  std::shared_ptr<JobHooks> hooks;  // null: none
};

struct JobResult {
  std::string finish_reason;  // "stop", "length", "cancelled", "error"
  int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  double queue_ms = 0, prompt_ms = 0, gen_ms = 0;
  int slot = -1;
};

struct JobEvent {
  enum class Kind { Text, Done, Error } kind;
  std::string text;  // Text: complete UTF-8 pieces; Error: the message
  JobResult result;  // Done and Error
};

// Shared by the HTTP thread that submitted it and the engine thread.
class Job {
 public:
  explicit Job(JobSpec spec) : spec_(std::move(spec)), submitted_(Clock::now()) {}
  // Moves pending events into `out`; waits up to `timeout` when there are none.
  // Returns false if there still are none.
  bool wait(std::vector<JobEvent>& out, std::chrono::milliseconds timeout);
  // The client went away: the engine frees the slot before its next step.
  void cancel() { cancel_.store(true); }
  bool cancelled() const { return cancel_.load(); }
  const JobSpec& spec() const { return spec_; }

 private:
  friend class Engine;
  void push(JobEvent e);
  JobSpec spec_;
  Clock::time_point submitted_;
  std::atomic<bool> cancel_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<JobEvent> events_;
};

struct EngineOptions {
  int slots = 4;
  int64_t ctx = 0;         // positions per slot (<= the model's)
  SessionOptions session;  // loops, kv mode, chunk
  int prefill_rows = 0;    // prompt rows per step, all slots together; 0 = the chunk size
};

// Counters for /metrics; totals since start.
struct EngineStats {
  int slots = 0, busy = 0, queued = 0;
  uint64_t kv_bytes = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
  int64_t jobs_done = 0, jobs_cancelled = 0;
  int64_t steps = 0, rows = 0, decode_rows = 0;
  double busy_seconds = 0;
  double prompt_tps = 0, gen_tps = 0;  // over the last 10 s
};

class Engine {
 public:
  // The slots' sessions live on `backend` (which holds the model and the host threads).
  Engine(std::shared_ptr<Backend> backend, const Tokenizer& tok, EngineOptions opts);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a job (its prompt must fit the context; the caller checks).
  std::shared_ptr<Job> submit(JobSpec spec);
  // Ends every job (they get a Done "cancelled") and stops the thread.
  void shutdown();
  EngineStats stats() const;
  const EngineOptions& options() const { return opts_; }
  int64_t ctx() const { return opts_.ctx; }

 private:
  struct Slot;
  void run();
  void assign(Slot& slot, std::shared_ptr<Job> job);
  bool step();
  void take_token(Slot& slot, int32_t id);
  void finish(Slot& slot, const std::string& reason);
  void fail(Slot& slot, const std::string& message);
  // A job with hooks is done: the slot's session back on this engine, no probe, no cache.
  void release(Slot& slot, const JobSpec& spec);
  int default_loops() const { return default_loops_; }

  std::shared_ptr<Backend> backend_;
  const Tokenizer& tok_;
  EngineOptions opts_;
  std::vector<std::unique_ptr<Slot>> slots_;
  uint64_t use_counter_ = 0;
  int default_loops_ = 0;  // the loop count of a request that names none

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stop_ = false;
  EngineStats stats_;  // under mu_
  // Tokens per second over a sliding window of one-second buckets (under mu_).
  struct Bucket {
    int64_t second = -1, prompt = 0, gen = 0;
  };
  Bucket buckets_[16];
  Clock::time_point t0_;
  std::thread thread_;
};

}  // namespace dory::server
