// `dory serve`'s HTTP side: an OpenAI-compatible API over the Engine, through
// cpp-httplib (Debian's libcpp-httplib-dev; kept out of this header).
//
// It listens before the model is loaded (GET /health answers 503 until then),
// so a supervisor sees the port at once. Each connection gets a thread of
// httplib's pool; a generation request parks its thread on its Job's events
// and writes them out (server-sent events when streaming), checking between
// events that the client is still there: a client that leaves cancels its job
// and the engine frees the slot before its next step.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server/engine.h"

namespace dory {
class Tokenizer;
}

namespace dory::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;             // 0: any free port (port() tells which)
  std::string api_key;         // "": no authentication
  size_t max_body = 8u << 20;  // bytes; a larger body gets 413
  int http_threads = 64;       // connections served at once
  int timeout_s = 30;          // socket read/write timeout
  std::string model_name;      // what /v1/models and responses call the model
  std::string skill;           // the CMF skill the model was loaded with ("" = none)
  bool verbose = false;        // one line per request on stderr
};

// What requests get when they do not say (dory serve's sampling flags).
struct RequestDefaults {
  SamplingParams sampling;
  int64_t max_tokens = -1;
  std::vector<std::string> stop;
  bool ignore_eos = false;
};

class HttpServer {
 public:
  explicit HttpServer(ServerOptions opts);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the socket; throws Error naming host and port if it cannot.
  void bind();
  int port() const;
  // Serves in a background thread (503 for everything until ready()).
  void start();
  // A CMF model's skills for requests that name one ("skill": ID, or "none" for the base
  // weights): the backend of the model loaded with that skill's tensors in place. Called the
  // first time a request names a skill other than the server's; that skill then has its own
  // engine (slots, KV caches, host threads) beside the first one.
  using SkillBackend = std::function<std::shared_ptr<Backend>(const std::string& skill)>;
  // "skill": "auto": the skill the file's routers pick for a prompt (CMF.md section 3, on the
  // base weights); called from request threads, so it serialises itself.
  using SkillRouter = std::function<std::string(const std::vector<int32_t>& prompt)>;
  // "skill": "dynamic": the hooks that make a request's skill follow its text (SkillSwitch:
  // the first decision on the prompt, then every few generated tokens), made for its prompt
  // from a request thread (so it serialises itself); the job runs on the server's engine.
  using SkillDynamic = std::function<std::shared_ptr<JobHooks>(const std::vector<int32_t>& prompt)>;
  struct Skills {
    SkillBackend backend;          // a request may name a skill (CMF files with skills)
    SkillRouter router;            // and "auto"
    SkillDynamic dynamic;          // and "dynamic"
    std::string dynamic_why;       // why not, when dynamic is empty (the 400's message)
    std::string request_default;   // a request that names no skill: "auto" or "dynamic" (dory
                                   // serve --skill auto / --skill-dynamic); "": the server's own
  };
  // The model is loaded: starts the engine and serves requests.
  void ready(std::shared_ptr<Backend> backend, std::unique_ptr<Tokenizer> tok,
             const std::string& chat_template, const EngineOptions& eo, const RequestDefaults& rd,
             Skills skills);
  // Ends every request, stops the engine and the listener; idempotent.
  void stop();
  EngineStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dory::server
