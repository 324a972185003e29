// The one generation path: what the CLI (run, chat) and the server share.
//   Sequence    a session plus the ids its caches hold: prefix reuse, the rollback
//               fallback, the prompt's end (the exact-row rebuild point).
//   TextStream  sampled ids to text: end-of-text ids, streaming detokenization, stop
//               strings with their holdback.
//   TextSession both, for one synchronous conversation (dory run, dory chat).
// The server (src/server/engine.h) drives Sequences and TextStreams of several
// requests through one batched forward per step.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dory/session.h"

namespace dory {

class Sampler;
class StreamDecoder;
class Tokenizer;

struct GenerateParams {
  int max_tokens = 256;           // -1: until end of text or the context is full
  std::vector<std::string> stop;  // stop strings (not included in the output)
  bool ignore_eos = false;
  // After each sampled token's pass, before the next is sampled (--skill-dynamic re-routes
  // here: it may move the session to another engine).
  std::function<void(Session&)> after_token;
};

struct PrefillStats {
  int64_t reused = 0;  // tokens kept from the previous state
  int64_t fed = 0;     // tokens run through the model now
  double seconds = 0;
};

struct GenerateStats {
  int64_t tokens = 0;
  double seconds = 0;
  std::string stop_reason;  // "eos", "stop", "length", "context", "cancelled", "callback"
};

class Sequence {
 public:
  Sequence(std::shared_ptr<Backend> backend, SessionOptions opts);
  ~Sequence();

  // How many leading ids of `prompt` the caches hold already, computed at `loops` passes
  // (at most all but its last id: that one's logits give the first token).
  // (`lora`: the adapter scales the prompt runs with, Session::set_lora; a prefix computed
  // with other scales is not reused.)
  size_t reusable(std::span<const int32_t> prompt, int loops,
                  const std::vector<float>& lora = {}) const;
  // Makes the session ready for `prompt` (at least one id) at `loops` passes: keeps the
  // reusable prefix and rolls back the rest, or starts a new session when a sliding window
  // or a sealed far field cannot go back that far; tells the session where the prompt ends.
  // Returns the ids kept; the caller feeds prompt[kept..] (forward() or forward_batch(),
  // at most session().next_rows() ids a pass) and reports them with took().
  size_t start(std::span<const int32_t> prompt, int loops, const std::vector<float>& lora = {});
  // Ids the session took (a piece of the prompt, or a sampled token).
  void took(std::span<const int32_t> ids);
  Session& session() { return *session_; }
  const Session& session() const { return *session_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // A new, empty session.
  void reset();

 private:
  std::shared_ptr<Backend> backend_;
  SessionOptions opts_;
  std::unique_ptr<Session> session_;
  std::vector<int32_t> tokens_;     // the ids whose rows the caches hold
  int tokens_loops_ = 0;            // the loop count they were computed with
  std::vector<float> tokens_lora_;  // and the adapter scales
};

class TextStream {
 public:
  enum class Next { More, Eos, Stop, Refused };
  // emit gets complete UTF-8 pieces that can no longer be the start of a stop string;
  // returning false ends the stream (Refused).
  TextStream(const Tokenizer& tok, const DoryConfig& c, std::vector<std::string> stops,
             bool ignore_eos, std::function<bool(std::string_view)> emit);
  ~TextStream();
  TextStream(TextStream&&) noexcept;
  // Feeds a sampled id. Eos: an end-of-text id (shown as nothing; not to be fed back);
  // Stop: a stop string formed (the text before it went out); Refused: emit said no.
  Next push(int32_t id);
  // The stream ends: sends what was held back, unless a stop string or emit ended it.
  void finish();

 private:
  bool send(bool final);
  std::unique_ptr<StreamDecoder> dec_;
  std::vector<int32_t> eos_;
  std::vector<std::string> stops_;
  bool ignore_eos_;
  std::function<bool(std::string_view)> emit_;
  std::string pending_;  // decoded text not yet sent (it may start a stop string)
  bool ended_ = false;   // a stop string or emit ended it
};

// A Sequence and a TextStream for one conversation at a time.
class TextSession {
 public:
  TextSession(std::shared_ptr<Backend> backend, SessionOptions opts, const Tokenizer& tok);
  ~TextSession();

  // Makes the session hold exactly `prompt` (at least one id): keeps the
  // longest common prefix with what it holds, rolls back the rest and feeds the
  // new ids in chunks. progress(done, total) is called after each chunk.
  PrefillStats prefill(std::span<const int32_t> prompt,
                       const std::function<void(int64_t, int64_t)>& progress = {});

  // Samples after the prompt until end of text, a stop string, the limit, the
  // context end, `cancel`, or on_text returning false. on_text gets complete
  // UTF-8 pieces as they form.
  GenerateStats generate(Sampler& sampler, const GenerateParams& params,
                         const std::function<bool(std::string_view)>& on_text,
                         const std::atomic<bool>* cancel = nullptr);

  const std::vector<int32_t>& tokens() const { return seq_.tokens(); }
  Session& session() { return seq_.session(); }
  void reset();

 private:
  const Tokenizer& tok_;
  Sequence seq_;
  std::vector<float> last_logits_;
};

// Length of the longest suffix of `text` that is a proper prefix of a stop
// string: text that must be held back until we know it is not a stop.
size_t stop_holdback(std::string_view text, const std::vector<std::string>& stops);

}  // namespace dory
