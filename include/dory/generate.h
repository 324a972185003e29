// Text generation over a Session: prompt reuse (longest common prefix),
// sampling, streaming detokenization, stop strings and limits.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dory/session.h"

namespace dory {

class Tokenizer;
class Sampler;

struct GenerateParams {
  int max_tokens = 256;            // -1: until end of text or the context is full
  std::vector<std::string> stop;   // stop strings (not included in the output)
  bool ignore_eos = false;
};

struct PrefillStats {
  int64_t reused = 0;   // tokens kept from the previous state
  int64_t fed = 0;      // tokens run through the model now
  double seconds = 0;
};

struct GenerateStats {
  int64_t tokens = 0;
  double seconds = 0;
  std::string stop_reason;  // "eos", "stop", "length", "context", "cancelled", "callback"
};

// A session plus the token ids it holds, so a new prompt only feeds what
// differs from the last one (chat turns, server slots).
class TextSession {
 public:
  TextSession(std::shared_ptr<const Model> model, ThreadPool& pool, SessionOptions opts,
              const Tokenizer& tok);
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

  const std::vector<int32_t>& tokens() const { return tokens_; }
  Session& session() { return *session_; }
  void reset();

 private:
  std::shared_ptr<const Model> model_;
  ThreadPool& pool_;
  SessionOptions opts_;
  const Tokenizer& tok_;
  std::unique_ptr<Session> session_;
  std::vector<int32_t> tokens_;
  std::vector<float> last_logits_;
};

// Length of the longest suffix of `text` that is a proper prefix of a stop
// string: text that must be held back until we know it is not a stop.
size_t stop_holdback(std::string_view text, const std::vector<std::string>& stops);

}  // namespace dory
