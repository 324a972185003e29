#include "server/http.h"

#include <httplib.h>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <map>
#include <sstream>
#include <thread>

#include "backend/backend.h"
#include "dory/error.h"
#include "model/weights.h"
#include "server/api.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace dory::server {

// The chat page (src/server/chat_page.html, embedded by CMakeLists.txt).
extern const unsigned char kChatPage[];
extern const unsigned long kChatPageSize;

namespace {

constexpr auto kPoll =
    std::chrono::milliseconds(50);  // how often a waiting request looks at its client

int64_t unix_now() {
  return static_cast<int64_t>(std::time(nullptr));
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json; charset=utf-8");
}

void send_error(httplib::Response& res, const ApiError& e) {
  send_json(res, e.status, error_body(e));
}

ApiError make_error(int status, const std::string& message, const std::string& type,
                    const std::string& code = "") {
  ApiError e;
  e.status = status;
  e.message = message;
  e.type = type;
  e.code = code;
  return e;
}

// Compares without stopping at the first difference (no timing hint about the key).
bool same_secret(const std::string& given, const std::string& key) {
  if (given.size() != key.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ key[i]);
  return diff == 0;
}

}  // namespace

struct HttpServer::Impl {
  ServerOptions opts;
  httplib::Server svr;
  std::thread listener;
  int port = -1;
  std::atomic<bool> ready{false}, stopping{false}, listening_done{false};
  std::mutex stop_mu;

  std::shared_ptr<const Model> model;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<ChatTemplate> tmpl;
  std::mutex tmpl_mu;
  std::unique_ptr<Engine> engine;  // the server's skill (dory serve --skill)
  // Other skills' engines, made the first time a request names one (SkillBackend).
  EngineOptions eo;
  HttpServer::SkillBackend skill_backend;
  HttpServer::SkillRouter skill_router;
  HttpServer::SkillDynamic skill_dynamic;
  mutable std::mutex engines_mu;
  std::map<std::string, std::unique_ptr<Engine>> skill_engines;
  ApiContext api;
  int64_t created = 0;

  mutable std::mutex count_mu;
  std::map<int, int64_t> responses;  // HTTP status -> count
  std::atomic<int64_t> disconnects{0};

  explicit Impl(ServerOptions o) : opts(std::move(o)) {}
  void routes();
  void generate(Endpoint ep, const httplib::Request& req, httplib::Response& res);
  std::string metrics() const;
  EngineStats all_stats() const;
  Engine& engine_for(const std::string& skill);
  json model_card() const;
};

HttpServer::HttpServer(ServerOptions opts) : impl_(std::make_unique<Impl>(std::move(opts))) {
  Impl& m = *impl_;
  const int threads = std::max(4, m.opts.http_threads);
  m.svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  m.svr.set_payload_max_length(m.opts.max_body);
  m.svr.set_read_timeout(m.opts.timeout_s, 0);
  m.svr.set_write_timeout(m.opts.timeout_s, 0);
  m.svr.set_keep_alive_max_count(1000);
  // httplib's default also sets SO_REUSEPORT, which would let a second server bind the
  // same port and steal half its connections; an address in use must be an error.
  m.svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  m.routes();
}

HttpServer::~HttpServer() {
  stop();
}

void HttpServer::bind() {
  Impl& m = *impl_;
  if (m.opts.port == 0) {
    m.port = m.svr.bind_to_any_port(m.opts.host);
  } else {
    m.port = m.svr.bind_to_port(m.opts.host, m.opts.port) ? m.opts.port : -1;
  }
  if (m.port <= 0)
    throw Error("cannot listen on " + m.opts.host + ":" + std::to_string(m.opts.port) +
                " (address in use, not a local address, or not allowed)");
}

int HttpServer::port() const {
  return impl_->port;
}

void HttpServer::start() {
  Impl& m = *impl_;
  m.listener = std::thread([&m] {
    m.svr.listen_after_bind();
    m.listening_done.store(true);
  });
}

void HttpServer::ready(std::shared_ptr<Backend> backend, std::unique_ptr<Tokenizer> tok,
                       const std::string& chat_template, const EngineOptions& eo,
                       const RequestDefaults& rd, Skills skills) {
  Impl& m = *impl_;
  m.model = backend->model_ptr();
  m.tok = std::move(tok);
  m.tmpl = std::make_unique<ChatTemplate>(chat_template);
  m.engine = std::make_unique<Engine>(std::move(backend), *m.tok, eo);
  m.eo = eo;
  m.skill_backend = std::move(skills.backend);
  if (const cmf::File* f = m.model->weights().cmf.get())
    for (const cmf::Skill& k : f->skills()) m.api.skills.push_back(k.id);
  m.api.skill_per_request = static_cast<bool>(m.skill_backend);
  m.skill_router = std::move(skills.router);
  m.api.skill_auto = m.api.skill_per_request && static_cast<bool>(m.skill_router);
  m.skill_dynamic = std::move(skills.dynamic);
  m.api.skill_dynamic_why = m.skill_dynamic             ? ""
                            : skills.dynamic_why.empty() ? "not on this server"
                                                         : skills.dynamic_why;
  if (skills.request_default == "dynamic" && !m.skill_dynamic)
    throw Error("--skill-dynamic: " + m.api.skill_dynamic_why);
  if (skills.request_default == "auto" && !m.api.skill_auto)
    throw Error("--skill auto: this model has no skill with a router");
  m.api.skill_default = skills.request_default;
  m.api.tok = m.tok.get();
  m.api.tmpl = m.tmpl.get();
  m.api.tmpl_mu = &m.tmpl_mu;
  m.api.ctx = m.engine->ctx();
  m.api.vocab = m.model->config().vocab;
  m.api.skill = m.opts.skill == "none" ? "" : m.opts.skill;
  m.api.adapters = static_cast<int>(m.model->weights().adapter_names.size());
  m.api.sampling = rd.sampling;
  m.api.max_tokens = rd.max_tokens;
  m.api.stop = rd.stop;
  m.api.ignore_eos = rd.ignore_eos;
  m.created = unix_now();
  m.ready.store(true, std::memory_order_release);
}

void HttpServer::stop() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lk(m.stop_mu);
  m.stopping.store(true);
  if (m.engine) m.engine->shutdown();  // every waiting request sees its job end
  {
    std::lock_guard<std::mutex> lk(m.engines_mu);
    for (auto& [id, e] : m.skill_engines) e->shutdown();
  }
  if (m.listener.joinable()) {
    // stop() only acts on a running listener: wait until it runs (or gave up).
    while (!m.svr.is_running() && !m.listening_done.load())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    m.svr.stop();
    m.listener.join();
  }
}

EngineStats HttpServer::stats() const {
  return impl_->engine ? impl_->all_stats() : EngineStats{};
}

json HttpServer::Impl::model_card() const {
  const DoryConfig& c = model->config();
  // What "skill" takes besides an id: "none" where there are skills, "auto" and "dynamic"
  // where this server can run them.
  json modes = json::array();
  if (!api.skills.empty()) modes.push_back("none");
  if (api.skill_auto) modes.push_back("auto");
  if (api.skill_dynamic_why.empty()) modes.push_back("dynamic");
  return {
      {"id", opts.model_name},
      {"object", "model"},
      {"created", created},
      {"owned_by", "dory"},
      {"meta",
       {{"n_params", model->n_params()},
        {"n_vocab", c.vocab},
        {"n_ctx_train", c.max_positions},
        {"n_ctx", engine->ctx()},
        {"n_slots", engine->options().slots},
        {"loops", engine->options().session.loops ? engine->options().session.loops : c.n_loops},
        {"kv", kv_mode_name(engine->options().session.kv.value_or(c.kv_mode))},
        // A CMF file's skills, which a request may name ("skill"), and the server's own.
        {"skills", api.skills},
        {"skill", !api.skill_default.empty() ? api.skill_default
                  : api.skill.empty()         ? "none"
                                              : api.skill},
        {"skill_modes", modes}}}};
}

void HttpServer::Impl::routes() {
  // Authentication, and 503 while the model loads, before any route runs.
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // The chat page holds no data: it loads without a key, and asks for one for the API.
    if (req.path == "/health" || req.path == "/")
      return httplib::Server::HandlerResponse::Unhandled;
    if (!opts.api_key.empty()) {
      std::string given = req.get_header_value("Authorization");
      if (given.rfind("Bearer ", 0) == 0)
        given = given.substr(7);
      else
        given = req.get_header_value("X-Api-Key");
      if (!same_secret(given, opts.api_key)) {
        send_error(res,
                   make_error(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                              "authentication_error", "invalid_api_key"));
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (!ready.load(std::memory_order_acquire)) {
      send_error(res, make_error(503, "the model is loading", "unavailable_error"));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (stopping.load()) {
      send_error(res, make_error(503, "the server is shutting down", "unavailable_error"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // Errors httplib makes itself (no route, body too large, bad request line).
  svr.set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        ApiError e;
        e.status = res.status;
        if (res.status == 404) {
          e.type = "not_found_error";
          e.message = "no such endpoint: " + req.method + " " + req.path;
        } else if (res.status == 413) {
          e.message = "the request body is larger than the limit of " +
                      std::to_string(opts.max_body) + " bytes";
        } else {
          e.message = "HTTP status " + std::to_string(res.status);
        }
        send_error(res, e);
        return httplib::Server::HandlerResponse::Handled;
      }));
  svr.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "internal error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        send_error(res, make_error(500, what, "server_error"));
      });
  svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    {
      std::lock_guard<std::mutex> lk(count_mu);
      ++responses[res.status];
    }
    if (opts.verbose)
      std::fprintf(stderr, "%s %s %s -> %d\n", req.remote_addr.c_str(), req.method.c_str(),
                   req.path.c_str(), res.status);
  });

  // Routes turn ApiError into the error object; anything else is a 500.
  auto api = [](auto fn) {
    return [fn](const httplib::Request& req, httplib::Response& res) {
      try {
        fn(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      }
    };
  };

  svr.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(reinterpret_cast<const char*>(kChatPage), kChatPageSize,
                    "text/html; charset=utf-8");
  });
  svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (!ready.load(std::memory_order_acquire)) return send_json(res, 503, {{"status", "loading"}});
    const EngineStats s = all_stats();
    send_json(res, 200,
              {{"status", "ok"},
               {"slots_idle", s.slots - s.busy},
               {"slots_processing", s.busy},
               {"requests_queued", s.queued}});
  });
  auto models = [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"object", "list"}, {"data", json::array({model_card()})}});
  };
  svr.Get("/v1/models", models);
  svr.Get("/models", models);
  auto chat = api(
      [this](const httplib::Request& q, httplib::Response& r) { generate(Endpoint::Chat, q, r); });
  auto comp = api([this](const httplib::Request& q, httplib::Response& r) {
    generate(Endpoint::Completion, q, r);
  });
  svr.Post("/v1/chat/completions", chat);
  svr.Post("/chat/completions", chat);
  svr.Post("/v1/completions", comp);
  svr.Post("/completions", comp);

  svr.Post(
      "/tokenize", api([this](const httplib::Request& req, httplib::Response& res) {
        const json body = parse_object(req.body);
        auto c = body.find("content");
        if (c == body.end() || !c->is_string()) {
          ApiError e;
          e.param = "content";
          e.message = "'content' must be a string";
          throw e;
        }
        auto flag = [&](const char* k, bool d) {
          auto it = body.find(k);
          if (it == body.end() || it->is_null()) return d;
          if (!it->is_boolean()) {
            ApiError e;
            e.param = k;
            e.message = std::string("'") + k + "' must be true or false";
            throw e;
          }
          return it->get<bool>();
        };
        const bool add_special = flag("add_special", false), pieces = flag("with_pieces", false),
                   parse_special = flag("parse_special", true);
        const auto ids = tok->encode(c->get<std::string>(), add_special, parse_special);
        json out = json::array();
        for (int32_t id : ids) {
          if (!pieces) {
            out.push_back(id);
            continue;
          }
          out.push_back({{"id", id}, {"piece", tok->decode(std::span<const int32_t>(&id, 1))}});
        }
        send_json(res, 200, {{"tokens", out}});
      }));
  svr.Post("/detokenize", api([this](const httplib::Request& req, httplib::Response& res) {
             const json body = parse_object(req.body);
             auto t = body.find("tokens");
             ApiError e;
             e.param = "tokens";
             if (t == body.end() || !t->is_array()) {
               e.message = "'tokens' must be an array of token ids";
               throw e;
             }
             std::vector<int32_t> ids;
             for (const json& x : *t) {
               const bool is_int = x.is_number_integer() || x.is_number_unsigned();
               const int64_t v =
                   is_int && !(x.is_number_unsigned() && x.get<uint64_t>() > uint64_t(INT64_MAX))
                       ? x.get<int64_t>()
                       : -1;
               if (!is_int || v < 0 || v >= model->config().vocab) {
                 e.message = "token id " + x.dump() + " is not in [0, " +
                             std::to_string(model->config().vocab) + ")";
                 throw e;
               }
               ids.push_back(static_cast<int32_t>(v));
             }
             send_json(res, 200, {{"content", tok->decode(ids)}});
           }));
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics(), "text/plain; version=0.0.4; charset=utf-8");
  });
}

// A generation request: checked here (errors are a plain 4xx), then queued;
// the response is written as the engine produces it.
void HttpServer::Impl::generate(Endpoint ep, const httplib::Request& req, httplib::Response& res) {
  ParsedRequest pr = parse_request(ep, req.body, api);
  if (pr.skill == "auto") {
    try {
      pr.skill = skill_router(pr.job.prompt);
    } catch (const Error& e) {
      throw make_error(500, std::string("routing the prompt to a skill: ") + e.what(), "server_error");
    }
  }
  if (pr.skill == "dynamic") {
    // The job starts on the server's engine; its hooks move it between the skills' engines.
    try {
      pr.job.hooks = skill_dynamic(pr.job.prompt);
    } catch (const Error& e) {
      throw make_error(500, std::string("routing the prompt to a skill: ") + e.what(), "server_error");
    }
    pr.skill = api.skill;
  }
  std::shared_ptr<Job> job;
  try {
    job = engine_for(pr.skill).submit(std::move(pr.job));
  } catch (const Error& e) {
    throw make_error(503, e.what(), "unavailable_error");
  }
  struct State {
    std::shared_ptr<Job> job;
    Endpoint ep;
    std::string id, model;
    int64_t created;
    bool include_usage;
    std::string text;  // non-streaming: the answer so far
  };
  auto st = std::make_shared<State>(
      State{job, ep, new_id(ep), opts.model_name, unix_now(), pr.include_usage, {}});
  auto gone = [this, st] {
    st->job->cancel();
    disconnects.fetch_add(1);
    return false;  // ends the response; httplib closes the connection
  };
  auto write = [](httplib::DataSink& sink, const std::string& s) {
    return sink.write(s.data(), s.size());
  };
  auto sse = [write](httplib::DataSink& sink, const json& j) {
    return write(sink, "data: " + dump(j) + "\n\n");
  };
  // When the response object goes away for any reason, the job must not outlive it.
  auto release = [st](bool) { st->job->cancel(); };
  res.set_header("Cache-Control", "no-cache");

  // Chunked in both forms, so the wait can watch the connection and give up
  // the slot at once if the client leaves.
  res.set_chunked_content_provider(
      pr.stream ? "text/event-stream" : "application/json; charset=utf-8",
      [this, st, gone, write, sse, stream = pr.stream](size_t, httplib::DataSink& sink) {
        if (stream && st->ep == Endpoint::Chat &&
            !sse(sink, stream_chunk(st->ep, st->id, st->model, st->created, "", "", true)))
          return gone();
        std::vector<JobEvent> events;
        for (;;) {
          events.clear();
          const bool got = st->job->wait(events, kPoll);
          if (stopping.load()) return false;
          if (!sink.is_writable()) return gone();
          if (!got) continue;
          for (JobEvent& e : events) {
            if (e.kind == JobEvent::Kind::Text) {
              if (!stream)
                st->text += e.text;  // non-streaming: the answer so far
              else if (!sse(sink, stream_chunk(st->ep, st->id, st->model, st->created, e.text, "")))
                return gone();
              continue;
            }
            if (e.kind == JobEvent::Kind::Error) {
              const json err = error_body(make_error(500, e.text, "server_error"));
              if (stream)
                sse(sink, err);
              else
                write(sink, dump(err));
            } else if (e.result.finish_reason == "cancelled") {
              return false;
            } else if (stream) {
              json last =
                  stream_chunk(st->ep, st->id, st->model, st->created, "", e.result.finish_reason);
              last["timings"] = timings_json(e.result);
              sse(sink, last);
              if (st->include_usage)
                sse(sink, usage_chunk(st->ep, st->id, st->model, st->created, e.result));
              write(sink, "data: [DONE]\n\n");
            } else {
              write(sink, dump(final_response(st->ep, st->id, st->model, st->created, st->text,
                                              e.result)));
            }
            sink.done();
            return true;
          }
        }
      },
      release);
}

// Every engine's counters added up (the server's skill and those requests asked for).
EngineStats HttpServer::Impl::all_stats() const {
  EngineStats s = engine->stats();
  std::lock_guard<std::mutex> lk(engines_mu);
  for (const auto& [id, e] : skill_engines) {
    const EngineStats o = e->stats();
    s.slots += o.slots, s.busy += o.busy, s.queued += o.queued;
    s.kv_bytes += o.kv_bytes;
    s.prompt_tokens += o.prompt_tokens, s.cached_tokens += o.cached_tokens;
    s.generated_tokens += o.generated_tokens;
    s.jobs_done += o.jobs_done, s.jobs_cancelled += o.jobs_cancelled;
    s.steps += o.steps, s.rows += o.rows, s.decode_rows += o.decode_rows;
    s.busy_seconds += o.busy_seconds;
    s.prompt_tps += o.prompt_tps, s.gen_tps += o.gen_tps;
  }
  return s;
}

// The engine for a request's skill: the server's own, or one made for that skill now.
Engine& HttpServer::Impl::engine_for(const std::string& skill) {
  if (skill == api.skill) return *engine;
  std::lock_guard<std::mutex> lk(engines_mu);
  auto it = skill_engines.find(skill);
  if (it == skill_engines.end()) {
    if (stopping.load()) throw Error("the server is stopping");
    std::shared_ptr<Backend> be = skill_backend(skill);
    it = skill_engines.emplace(skill, std::make_unique<Engine>(std::move(be), *tok, eo)).first;
    std::fprintf(stderr, "dory serve: skill '%s' loaded for the requests that name it\n",
                 skill.empty() ? "none" : skill.c_str());
  }
  return *it->second;
}

std::string HttpServer::Impl::metrics() const {
  const EngineStats s = all_stats();
  std::ostringstream o;
  auto metric = [&](const char* name, const char* type, const char* help, double v) {
    o << "# HELP dory_" << name << ' ' << help << "\n# TYPE dory_" << name << ' ' << type
      << "\ndory_" << name << ' ' << v << '\n';
  };
  o.precision(10);
  metric("prompt_tokens_total", "counter", "Prompt tokens run through the model.",
         double(s.prompt_tokens));
  metric("prompt_tokens_cached_total", "counter", "Prompt tokens reused from a slot's KV cache.",
         double(s.cached_tokens));
  metric("generated_tokens_total", "counter", "Tokens generated.", double(s.generated_tokens));
  metric("prompt_tokens_per_second", "gauge", "Prompt tokens per second over the last 10 s.",
         s.prompt_tps);
  metric("generation_tokens_per_second", "gauge", "Generated tokens per second over the last 10 s.",
         s.gen_tps);
  metric("requests_in_flight", "gauge", "Requests holding a slot.", s.busy);
  metric("requests_queued", "gauge", "Requests waiting for a slot.", s.queued);
  metric("requests_finished_total", "counter", "Generation requests that ran to the end.",
         double(s.jobs_done));
  metric("requests_cancelled_total", "counter", "Generation requests whose client left first.",
         double(s.jobs_cancelled));
  metric("client_disconnects_total", "counter", "Responses cut short because the client went away.",
         double(disconnects.load()));
  metric("slots", "gauge", "Slots: sequences decoded together.", s.slots);
  metric("kv_cache_bytes", "gauge", "Bytes held by the slots' KV caches.", double(s.kv_bytes));
  metric("batch_steps_total", "counter", "Batched forward passes.", double(s.steps));
  metric("batch_rows_total", "counter",
         "Rows (tokens) through those passes; rows / steps is the mean batch.", double(s.rows));
  metric("batch_decode_rows_total", "counter",
         "Decode rows among them (one per busy slot and step).", double(s.decode_rows));
  metric("busy_seconds_total", "counter", "Seconds spent in forward passes.", s.busy_seconds);
  o << "# HELP dory_http_responses_total HTTP responses by status code.\n"
       "# TYPE dory_http_responses_total counter\n";
  std::lock_guard<std::mutex> lk(count_mu);
  for (const auto& [code, n] : responses)
    o << "dory_http_responses_total{code=\"" << code << "\"} " << n << '\n';
  return o.str();
}

}  // namespace dory::server
