// dory serve: an OpenAI-compatible HTTP server (src/server) with --parallel
// slots decoded together by continuous batching.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "commands.h"
#include "common.h"
#include "model_text.h"
#include "model/skill_switch.h"
#include "model/weights.h"
#include "server/http.h"

namespace dory::cli {

namespace {

struct ServeOpts {
  RunOpts run;
  GenOpts gen;
  server::ServerOptions http;
  int parallel = 4;
  int64_t ctx = 0;
  int prefill_rows = 0;
  std::string alias;
};

std::string model_name(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

// "skill": "dynamic" (dory serve --skill-dynamic for every request): the skill follows the text
// as for dory run --skill-dynamic (SkillSwitch), each request with its own switch. The prompt's
// phi runs on a base-weights engine of its own (one prompt at a time); the jobs' sessions move
// between engines of the skills (and of the base weights) that only the server's engine thread
// uses. Errors (not a CMF file with such skills, the gate on) are thrown here, at
// start-up, with one line.
server::HttpServer::SkillDynamic dynamic_skills(const RunOpts& run, const Loaded& m) {
  const cmf::File* f = m.model->weights().cmf.get();
  if (!f) throw Error(m.model->path() + ": skills live in CMF files; this model is not one");
  struct Shared {
    RunOpts run;
    std::shared_ptr<const Model> model;  // keeps the file (and the routers sw points into) alive
    SkillSwitch sw;                      // the candidates, found once; each request a copy
    Shared(const RunOpts& r, std::shared_ptr<const Model> mod, SkillSwitch s)
        : run(r), model(std::move(mod)), sw(std::move(s)) {}
    std::mutex phi_mu;
    Loaded base;  // phi of the prompts
    SkillEngines engines{run};  // the jobs' sessions run here
  };
  auto d = std::make_shared<Shared>(run, m.model, SkillSwitch(*f, m.model->config(), "\"skill\": \"dynamic\""));
  check_skill_probe(run, m.backend, d->sw);
  struct Hooks final : server::JobHooks {
    std::shared_ptr<Shared> d;
    SkillSwitch sw;
    Hooks(std::shared_ptr<Shared> shared, SkillSwitch s) : d(std::move(shared)), sw(std::move(s)) {}
    void start(Session& s) override {
      s.set_probe(sw.layer());
      s.switch_backend(d->engines.get(sw.active()));
    }
    void after_token(Session& s) override {
      const std::string line = follow_skill(sw, s, [this](const std::string& id) { return d->engines.get(id); });
      if (!line.empty()) std::fprintf(stderr, "dory serve: skill dynamic: %s\n", line.c_str());
    }
  };
  return [d](const std::vector<int32_t>& prompt) -> std::shared_ptr<server::JobHooks> {
    SkillSwitch sw = d->sw;
    std::string line;
    {
      std::lock_guard<std::mutex> lk(d->phi_mu);
      if (!d->base.model) {
        d->base.model = Model::load(d->run.model_path(), d->run.placement(), "", d->run.lora);
        d->base.backend = d->run.open(d->base.model);
      }
      line = sw.start(prompt_phi(d->run, d->base.backend, prompt, sw.layer()));
    }
    std::fprintf(stderr, "dory serve: skill dynamic: %s\n", line.c_str());
    return std::make_shared<Hooks>(d, std::move(sw));
  };
}

int run_serve(ServeOpts o) {
  // Signals go to sigwait below, never to a worker thread mid-step: block them
  // before any thread exists (threads inherit the mask).
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that left is a failed write, not a dead server

  check_device(o.run.backend_options());  // before the port is bound
  const std::string path = o.run.model_path();  // -m, or the built-in model
  o.http.model_name = o.alias.empty() ? model_name(path) : o.alias;
  // --skill auto: the server's own engine runs the base weights, and each request that names
  // no skill is routed on its prompt (as "skill": "auto").
  o.http.skill = o.run.skill == "auto" ? "" : o.run.skill;
  server::HttpServer http(o.http);
  http.bind();
  http.start();
  std::fprintf(stderr, "dory serve: listening on http://%s:%d (loading %s)\n", o.http.host.c_str(),
               http.port(), path.c_str());

  // Test hook: hold /health at 503 a while, as a slow load would.
  if (const char* d = std::getenv("DORY_SERVE_TEST_LOAD_DELAY_MS"))
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(d)));
  const auto t0 = std::chrono::steady_clock::now();
  if (o.run.skill_dynamic && !o.run.skill.empty())
    throw Error("--skill-dynamic picks the skill itself: leave out --skill " + o.run.skill);
  Loaded m = load_model_and_tokenizer(o.run, o.gen.tokenizer);
  const DoryConfig& c = m.model->config();
  if (o.ctx > c.max_positions)
    throw Error("--ctx-size " + std::to_string(o.ctx) + " exceeds the model's context of " +
                std::to_string(c.max_positions) + " positions");
  const std::string tmpl = chat_template_source(*m.tok);

  server::EngineOptions eo;
  eo.slots = o.parallel;
  eo.ctx = o.ctx > 0 ? o.ctx : c.max_positions;
  eo.session = o.run.session();
  eo.prefill_rows = o.prefill_rows;
  server::RequestDefaults rd;
  rd.sampling = o.gen.sampling();
  rd.max_tokens = o.gen.n_predict;
  rd.stop = o.gen.stop;
  rd.ignore_eos = o.gen.ignore_eos;
  const int loops = o.run.loops ? o.run.loops : static_cast<int>(c.n_loops);
  const char* kv = kv_mode_name(eo.session.kv.value_or(c.kv_mode));
  const std::string where = m.backend->describe();
  // A CMF model with skills: a request may name another one ("skill": ID or "none"), which
  // gets the model loaded with that skill's tensors (mapped views, nothing copied) and an
  // engine of its own the first time.
  server::HttpServer::Skills sk;
  server::HttpServer::SkillBackend& skills = sk.backend;
  server::HttpServer::SkillRouter& router = sk.router;
  sk.dynamic_why = m.model->weights().cmf ? "this model has no skills"
                                          : "skills live in CMF files; this model is not one";
  if (const cmf::File* f = m.model->weights().cmf.get(); f && !f->skills().empty()) {
    const RunOpts run = o.run;
    try {
      sk.dynamic = dynamic_skills(run, m);
    } catch (const Error& e) {
      sk.dynamic_why = e.what();
    }
    skills = [run](const std::string& id) {
      return run.open(Model::load(run.model_path(), run.placement(), id, run.lora));
    };
    bool routable = false;
    for (const cmf::Skill& k : f->skills()) routable |= k.routable;
    if (routable) {
      // "skill": "auto": the routers' E of the prompt on the base weights (one backend of its
      // own, made on the first such request; one prompt at a time), the smallest wins.
      struct Router {
        std::mutex mu;
        Loaded base;
      };
      auto r = std::make_shared<Router>();
      router = [run, r](const std::vector<int32_t>& prompt) {
        std::lock_guard<std::mutex> lk(r->mu);
        if (!r->base.model) {
          r->base.model = Model::load(run.model_path(), run.placement(), "", run.lora);
          r->base.backend = run.open(r->base.model);
        }
        const auto errs = skill_errors(run, r->base, prompt);
        size_t best = 0;
        for (size_t i = 1; i < errs.size(); ++i)
          if (errs[i].second < errs[best].second) best = i;
        std::fprintf(stderr, "dory serve: skill auto: '%s' (E %.4f)\n", errs[best].first.c_str(),
                     errs[best].second);
        return errs[best].first;
      };
    }
  }
  // A default the server cannot honour stops it here (HttpServer::ready), with its reason.
  if (o.run.skill_dynamic) sk.request_default = "dynamic";
  if (o.run.skill == "auto") sk.request_default = "auto";
  http.ready(m.backend, std::move(m.tok), tmpl, eo, rd, std::move(sk));
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr,
               "dory serve: ready in %.2f s: model '%s', %d slots x %lld positions, %s, "
               "loops %d, kv %s%s\n",
               load_s, o.http.model_name.c_str(), eo.slots, (long long)eo.ctx, where.c_str(), loops, kv,
               o.http.api_key.empty() ? "" : ", API key required");

  int sig = 0;
  sigwait(&sigs, &sig);
  std::fprintf(stderr, "dory serve: %s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  const server::EngineStats s = http.stats();
  http.stop();
  std::fprintf(stderr,
               "dory serve: %lld requests (%lld cancelled), %lld prompt tokens (%lld from cache), "
               "%lld generated, %lld batched steps (%.2f rows each)\n",
               (long long)s.jobs_done, (long long)s.jobs_cancelled, (long long)s.prompt_tokens,
               (long long)s.cached_tokens, (long long)s.generated_tokens, (long long)s.steps,
               s.steps ? double(s.rows) / double(s.steps) : 0.0);
  return 0;
}

}  // namespace

Runner add_serve(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "serve",
      "OpenAI-compatible HTTP server: a chat page at / (open it in a browser), "
      "/v1/chat/completions, /v1/completions, /v1/models, /health, /metrics, /tokenize, "
      "/detokenize");
  auto o = std::make_shared<ServeOpts>();
  o->gen.n_predict = -1;  // a request without max_tokens runs to end of text or the context
  add_run_opts(cmd, o->run);
  add_gen_opts(cmd, o->gen);
  // add_gen_opts says "tokens to generate"; for the server these are the defaults of a request.
  cmd->get_option("--n-predict")->description("max_tokens of a request that gives none (-1 = until end of text or context)");
  cmd->add_option("--host", o->http.host, "address to listen on (0.0.0.0: every interface)")
      ->capture_default_str();
  cmd->add_option("--port", o->http.port, "port to listen on (0: any free port, printed at start)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--parallel", o->parallel, "slots: requests decoded together, each with its own KV cache")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("-c,--ctx-size", o->ctx, "positions per slot (default: the model's context)")
      ->check(CLI::Range(int64_t(2), int64_t(1) << 30));
  cmd->add_option("--prefill-rows", o->prefill_rows,
                  "prompt rows per batched step, all slots together (default: --chunk)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--api-key", o->http.api_key,
                  "require 'Authorization: Bearer KEY' on every endpoint but /health")
      ->envname("DORY_API_KEY");
  cmd->add_option("--alias", o->alias, "model name in /v1/models and responses (default: the model's file or directory name)");
  cmd->add_option("--max-body", o->http.max_body, "largest request body in bytes (larger: 413)")
      ->check(CLI::Range(size_t(1024), size_t(1) << 32))
      ->capture_default_str();
  cmd->add_option("--threads-http", o->http.http_threads, "connections served at once")
      ->check(CLI::Range(4, 4096))
      ->capture_default_str();
  cmd->add_option("--timeout", o->http.timeout_s, "seconds a socket read or write may wait")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  cmd->add_flag("-v,--verbose", o->http.verbose, "one line per request on stderr");
  return [o] { return run_serve(*o); };
}

static const bool registered = register_command(45, add_serve);

}  // namespace dory::cli
