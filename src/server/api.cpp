#include "server/api.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "dory/error.h"

namespace dory::server {

namespace {

constexpr int kMaxDepth = 64;     // JSON nesting a request may use
constexpr size_t kMaxStops = 16;  // OpenAI allows 4; llama.cpp any number
constexpr size_t kMaxStopBytes = 1024;

[[noreturn]] void bad(const std::string& param, const std::string& message,
                      const std::string& code = "") {
  ApiError e;
  e.param = param;
  e.message = message;
  e.code = code;
  throw e;
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::number_float:
      return "a number";
    default:
      return "an integer";
  }
}

// A field that is absent or null gives nullptr (the default applies).
const json* field(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

double number(const json& body, const char* key, double dflt, double lo, double hi) {
  const json* v = field(body, key);
  if (!v) return dflt;
  if (!v->is_number())
    bad(key, std::string("'") + key + "' must be a number, not " + type_name(*v));
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    bad(key, std::string("'") + key + "' must be between " + json(lo).dump() + " and " +
                 json(hi).dump() + ", got " + v->dump());
  return x;
}

int64_t integer(const json& body, const char* key, int64_t dflt, int64_t lo, int64_t hi) {
  const json* v = field(body, key);
  if (!v) return dflt;
  // 5.0 is accepted as 5 (JavaScript clients cannot tell them apart).
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && d >= double(lo) && d <= double(hi))
      return static_cast<int64_t>(d);
  }
  if (!v->is_number_integer() && !v->is_number_unsigned() && !v->is_number_float())
    bad(key, std::string("'") + key + "' must be an integer, not " + type_name(*v));
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX))
    bad(key, std::string("'") + key + "' is out of range: " + v->dump());
  if (v->is_number_float())
    bad(key, std::string("'") + key + "' must be an integer between " + std::to_string(lo) +
                 " and " + std::to_string(hi) + ", got " + v->dump());
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi)
    bad(key, std::string("'") + key + "' must be between " + std::to_string(lo) + " and " +
                 std::to_string(hi) + ", got " + v->dump());
  return x;
}

bool boolean(const json& body, const char* key, bool dflt) {
  const json* v = field(body, key);
  if (!v) return dflt;
  if (!v->is_boolean())
    bad(key, std::string("'") + key + "' must be true or false, not " + type_name(*v));
  return v->get<bool>();
}

// A message's content as text: a string, or an array of {type: "text", text} parts.
std::string content_text(const json& msg, size_t i, bool may_be_null) {
  const std::string where = "messages[" + std::to_string(i) + "].content";
  auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) {
    if (may_be_null) return "";
    bad(where, "'" + where + "' is missing");
  }
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array())
    bad(where, "'" + where + "' must be a string or an array of text parts, not " + type_name(*it));
  std::string text;
  for (size_t k = 0; k < it->size(); ++k) {
    const json& part = (*it)[k];
    const std::string pw = where + "[" + std::to_string(k) + "]";
    if (!part.is_object()) bad(pw, "'" + pw + "' must be an object");
    auto t = part.find("type");
    if (t == part.end() || !t->is_string()) bad(pw, "'" + pw + ".type' must be a string");
    if (*t != "text") bad(pw, "'" + pw + "': only text content is supported, not " + t->dump());
    auto tx = part.find("text");
    if (tx == part.end() || !tx->is_string()) bad(pw, "'" + pw + ".text' must be a string");
    text += tx->get<std::string>();
  }
  return text;
}

std::vector<int32_t> chat_prompt(const json& body, const ApiContext& ctx) {
  const json* m = field(body, "messages");
  if (!m) bad("messages", "'messages' is required");
  if (!m->is_array())
    bad("messages", "'messages' must be an array, not " + std::string(type_name(*m)));
  if (m->empty()) bad("messages", "'messages' must not be empty");
  json messages = json::array();
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) bad(where, "'" + where + "' must be an object, not " + type_name(msg));
    auto role = msg.find("role");
    if (role == msg.end() || !role->is_string())
      bad(where + ".role", "'" + where + ".role' must be a string");
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "developer" && r != "user" && r != "assistant" && r != "tool")
      bad(where + ".role", "'" + where + ".role' is " + role->dump() +
                               "; expected system, developer, user, assistant or tool");
    json out = msg;  // other keys (name, tool_calls, ...) go to the template as they are
    out["content"] = content_text(msg, i, r == "assistant");
    messages.push_back(std::move(out));
  }
  json tctx = {{"messages", std::move(messages)},
               {"add_generation_prompt", true},
               {"bos_token", ctx.tok->bos_token()},
               {"eos_token", ctx.tok->eos_token()}};
  if (const json* tools = field(body, "tools")) {
    if (!tools->is_array()) bad("tools", "'tools' must be an array");
    tctx["tools"] = *tools;
  }
  std::string text;
  try {
    std::lock_guard<std::mutex> lk(*ctx.tmpl_mu);
    text = ctx.tmpl->render(tctx);
  } catch (const Error& e) {
    bad("messages", std::string("the chat template refused the messages: ") + e.what());
  }
  std::vector<int32_t> ids = ctx.tok->encode(text, /*add_special=*/false);
  // The template may leave BOS to the tokenizer's own rule.
  if (auto bos = ctx.tok->bos_id();
      bos && ctx.tok->adds_bos() && (ids.empty() || ids.front() != *bos))
    ids.insert(ids.begin(), *bos);
  return ids;
}

std::vector<int32_t> completion_prompt(const json& body, const ApiContext& ctx) {
  const json* p = field(body, "prompt");
  if (!p) bad("prompt", "'prompt' is required");
  const json* v = p;
  // A list of one prompt is that prompt; several would need n > 1.
  if (v->is_array() && !v->empty() && !(*v)[0].is_number()) {
    if (v->size() != 1) bad("prompt", "only one prompt per request is supported");
    v = &(*v)[0];
  }
  if (v->is_string()) return ctx.tok->encode(v->get<std::string>(), /*add_special=*/true);
  if (!v->is_array())
    bad("prompt",
        "'prompt' must be a string or an array of token ids, not " + std::string(type_name(*v)));
  std::vector<int32_t> ids;
  for (const json& x : *v) {
    if (!x.is_number_integer() && !x.is_number_unsigned())
      bad("prompt", "'prompt' token ids must be integers, got " + x.dump());
    const int64_t id =
        x.is_number_unsigned() && x.get<uint64_t>() > uint64_t(INT64_MAX) ? -1 : x.get<int64_t>();
    if (id < 0 || id >= ctx.vocab)
      bad("prompt",
          "token id " + x.dump() + " is out of range [0, " + std::to_string(ctx.vocab) + ")");
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

std::vector<std::string> stops(const json& body) {
  const json* s = field(body, "stop");
  std::vector<std::string> out;
  if (!s) return out;
  auto add = [&](const json& v) {
    if (!v.is_string()) bad("stop", "'stop' must be a string or an array of strings");
    std::string t = v.get<std::string>();
    if (t.size() > kMaxStopBytes)
      bad("stop", "a stop string may be at most " + std::to_string(kMaxStopBytes) + " bytes");
    if (!t.empty()) out.push_back(std::move(t));
  };
  if (s->is_array()) {
    if (s->size() > kMaxStops)
      bad("stop", "at most " + std::to_string(kMaxStops) + " stop strings, got " +
                      std::to_string(s->size()));
    for (const json& v : *s) add(v);
  } else {
    add(*s);
  }
  return out;
}

}  // namespace

json error_body(const ApiError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

json parse_object(const std::string& body) {
  json j;
  try {
    // The callback bounds nesting, so nothing later (copies, templates) recurses deeply.
    j = json::parse(body, [](int depth, json::parse_event_t, json&) {
      if (depth > kMaxDepth)
        bad("", "the request nests JSON deeper than " + std::to_string(kMaxDepth) + " levels");
      return true;
    });
  } catch (const json::exception& e) {
    std::string what = e.what();
    if (what.rfind("[json.exception.", 0) == 0 && what.find("] ") != std::string::npos)
      what = what.substr(what.find("] ") + 2);
    bad("", "the body is not valid JSON: " + what);
  }
  if (!j.is_object()) bad("", std::string("the body must be a JSON object, not ") + type_name(j));
  return j;
}

ParsedRequest parse_request(Endpoint ep, const std::string& body_text, const ApiContext& ctx) {
  const json body = parse_object(body_text);
  ParsedRequest r;
  r.endpoint = ep;
  if (const json* m = field(body, "model"); m && !m->is_string())
    bad("model", "'model' must be a string");
  if (integer(body, "n", 1, INT64_MIN, INT64_MAX) != 1) bad("n", "only n = 1 is supported");
  if (integer(body, "best_of", 1, INT64_MIN, INT64_MAX) != 1)
    bad("best_of", "only best_of = 1 is supported");
  if (const json* lp = field(body, "logprobs");
      lp && !(lp->is_boolean() && !lp->get<bool>()) && !(lp->is_number() && lp->get<double>() == 0))
    bad("logprobs", "logprobs are not supported");
  if (boolean(body, "echo", false)) bad("echo", "echo is not supported");
  if (const json* s = field(body, "suffix");
      s && !(s->is_string() && s->get<std::string>().empty()))
    bad("suffix", "suffix is not supported");
  if (const json* rf = field(body, "response_format")) {
    if (!rf->is_object() || rf->value("type", "") != "text")
      bad("response_format", "only response_format {\"type\": \"text\"} is supported");
  }

  JobSpec& job = r.job;
  SamplingParams& sp = job.sampling;
  sp = ctx.sampling;
  sp.temperature = static_cast<float>(number(body, "temperature", sp.temperature, 0.0, 2.0));
  sp.top_p = static_cast<float>(number(body, "top_p", sp.top_p, 0.0, 1.0));
  sp.top_k = static_cast<int>(integer(body, "top_k", sp.top_k, 0, ctx.vocab));
  sp.min_p = static_cast<float>(number(body, "min_p", sp.min_p, 0.0, 1.0));
  sp.repeat_penalty =
      static_cast<float>(number(body, "repeat_penalty", sp.repeat_penalty, 0.01, 100.0));
  sp.repeat_last_n =
      static_cast<int>(integer(body, "repeat_last_n", sp.repeat_last_n, -1, ctx.ctx));
  sp.presence_penalty =
      static_cast<float>(number(body, "presence_penalty", sp.presence_penalty, -2.0, 2.0));
  sp.frequency_penalty =
      static_cast<float>(number(body, "frequency_penalty", sp.frequency_penalty, -2.0, 2.0));
  const int64_t seed = integer(body, "seed", -2, -1, INT64_MAX);
  if (seed == -1)
    sp.seed = 0xFFFFFFFFu;  // llama.cpp's "random"
  else if (seed >= 0)
    sp.seed = static_cast<uint64_t>(seed);

  // max_tokens (completions, older chat clients), max_completion_tokens (chat), n_predict
  // (llama.cpp); -1 = no limit but the context.
  int64_t max_tokens = ctx.max_tokens;
  for (const char* key : {"n_predict", "max_tokens", "max_completion_tokens"})
    max_tokens = integer(body, key, max_tokens, -1, int64_t(1) << 31);
  job.max_tokens = max_tokens;
  job.stop = stops(body);
  for (const std::string& s : ctx.stop) job.stop.push_back(s);
  job.ignore_eos = boolean(body, "ignore_eos", ctx.ignore_eos);
  job.loops = static_cast<int>(integer(body, "loops", 0, 1, 16));
  // "lora": [{"id": 0, "scale": 0.5}, ...], as llama-server: the adapters loaded with
  // dory serve --lora, by position; an adapter left out runs at scale 0 for this request.
  if (const json* lo = field(body, "lora")) {
    if (!lo->is_array()) bad("lora", "'lora' must be an array of {\"id\": N, \"scale\": X}");
    if (ctx.adapters == 0 && !lo->empty())
      bad("lora", "this server has no LoRA adapters (start dory serve with --lora FILE)");
    job.lora.assign(static_cast<size_t>(ctx.adapters), 0.0f);
    for (const json& e : *lo) {
      if (!e.is_object() || !e.contains("id") || !e["id"].is_number_integer())
        bad("lora", "each 'lora' entry must be {\"id\": N, \"scale\": X} with an integer id");
      const int64_t id = e["id"].get<int64_t>();
      if (id < 0 || id >= ctx.adapters)
        bad("lora", "adapter id " + std::to_string(id) + " is not loaded (ids 0.." +
                        std::to_string(ctx.adapters - 1) + ")");
      double sc = 1.0;
      if (e.contains("scale")) {
        if (!e["scale"].is_number() || !std::isfinite(e["scale"].get<double>()))
          bad("lora", "'scale' must be a finite number");
        sc = e["scale"].get<double>();
      }
      job.lora[static_cast<size_t>(id)] = static_cast<float>(sc);
    }
  }
  // "skill": a CMF skill by id, or "none" for the base weights (the server runs a request
  // with another skill than its own on an engine of that skill's, made on first use).
  // "dynamic": the skill follows the text as it is generated (HttpServer::SkillDynamic).
  r.skill = ctx.skill_default.empty() ? ctx.skill : ctx.skill_default;
  if (const json* sk = field(body, "skill")) {
    if (!sk->is_string()) bad("skill", "'skill' must be a string");
    std::string want = sk->get<std::string>();
    if (want == "none") want.clear();
    if (want == "auto") {  // routed on the prompt by the server (HttpServer::SkillRouter)
      if (!ctx.skill_auto)
        bad("skill", "'auto': this model has no skill with a router (name the skill, or \"none\")");
    } else if (want == "dynamic") {
      if (!ctx.skill_dynamic_why.empty()) bad("skill", "'dynamic': " + ctx.skill_dynamic_why);
    } else {
      if (!want.empty() &&
          std::find(ctx.skills.begin(), ctx.skills.end(), want) == ctx.skills.end()) {
        std::string have;
        for (const std::string& id : ctx.skills) have += (have.empty() ? "" : ", ") + id;
        bad("skill", "this model has no skill '" + want + "' (" +
                         (have.empty() ? std::string("it has none") : "it has: " + have) +
                         "; or \"none\")");
      }
      if (want != ctx.skill && !ctx.skill_per_request)
        bad("skill", "this server runs skill '" +
                         (ctx.skill.empty() ? std::string("none") : ctx.skill) + "' only");
    }
    r.skill = want;
  }

  r.stream = boolean(body, "stream", false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "'stream_options' must be an object");
    r.include_usage = boolean(*so, "include_usage", false);
  }

  job.prompt = ep == Endpoint::Chat ? chat_prompt(body, ctx) : completion_prompt(body, ctx);
  if (job.prompt.empty()) bad(ep == Endpoint::Chat ? "messages" : "prompt", "the prompt is empty");
  if (static_cast<int64_t>(job.prompt.size()) >= ctx.ctx)
    bad(ep == Endpoint::Chat ? "messages" : "prompt",
        "the prompt has " + std::to_string(job.prompt.size()) + " tokens; the context is " +
            std::to_string(ctx.ctx) + " (the prompt must leave room for at least one token)",
        "context_length_exceeded");
  return r;
}

std::string new_id(Endpoint ep) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string id = ep == Endpoint::Chat ? "chatcmpl-" : "cmpl-";
  for (int i = 0; i < 24; ++i) id += hex[rng() & 15];
  return id;
}

json usage_json(const JobResult& r) {
  return {{"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", r.completion_tokens},
          {"total_tokens", r.prompt_tokens + r.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", r.cached_tokens}}}};
}

json timings_json(const JobResult& r) {
  const int64_t fed = r.prompt_tokens - r.cached_tokens;
  auto per = [](double ms, int64_t n) { return n > 0 ? ms / double(n) : 0.0; };
  auto rate = [](double ms, int64_t n) { return ms > 0 ? 1000.0 * double(n) / ms : 0.0; };
  return {{"cache_n", r.cached_tokens},
          {"prompt_n", fed},
          {"prompt_ms", r.prompt_ms},
          {"prompt_per_token_ms", per(r.prompt_ms, fed)},
          {"prompt_per_second", rate(r.prompt_ms, fed)},
          {"predicted_n", r.completion_tokens},
          {"predicted_ms", r.gen_ms},
          {"predicted_per_token_ms", per(r.gen_ms, r.completion_tokens)},
          {"predicted_per_second", rate(r.gen_ms, r.completion_tokens)},
          {"queue_ms", r.queue_ms},
          {"slot", r.slot}};
}

namespace {
json envelope(Endpoint ep, const std::string& id, const std::string& model, int64_t created,
              const char* object) {
  (void)ep;
  return {{"id", id},
          {"object", object},
          {"created", created},
          {"model", model},
          {"system_fingerprint", "dory-0.1.0"}};
}
}  // namespace

json final_response(Endpoint ep, const std::string& id, const std::string& model, int64_t created,
                    const std::string& text, const JobResult& r) {
  json j = envelope(ep, id, model, created,
                    ep == Endpoint::Chat ? "chat.completion" : "text_completion");
  json choice = {{"index", 0}};
  if (ep == Endpoint::Chat)
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  else
    choice["text"] = text;
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = r.finish_reason;
  j["choices"] = json::array({choice});
  j["usage"] = usage_json(r);
  j["timings"] = timings_json(r);
  return j;
}

json stream_chunk(Endpoint ep, const std::string& id, const std::string& model, int64_t created,
                  const std::string& text, const std::string& finish, bool role_only) {
  json j = envelope(ep, id, model, created,
                    ep == Endpoint::Chat ? "chat.completion.chunk" : "text_completion");
  json choice = {{"index", 0}};
  if (ep == Endpoint::Chat) {
    if (role_only)
      choice["delta"] = {{"role", "assistant"}, {"content", ""}};
    else if (!finish.empty())
      choice["delta"] = json::object();
    else
      choice["delta"] = {{"content", text}};
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish.empty() ? json(nullptr) : json(finish);
  j["choices"] = json::array({choice});
  return j;
}

json usage_chunk(Endpoint ep, const std::string& id, const std::string& model, int64_t created,
                 const JobResult& r) {
  json j = envelope(ep, id, model, created,
                    ep == Endpoint::Chat ? "chat.completion.chunk" : "text_completion");
  j["choices"] = json::array();
  j["usage"] = usage_json(r);
  return j;
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace dory::server
