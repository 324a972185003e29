// The OpenAI protocol: request bodies checked and turned into engine jobs,
// and the response objects and stream chunks built from what the engine says.
// No HTTP here (server/http.cpp does that), so every rule is in one place.
#pragma once
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "server/engine.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace dory::server {

using json = nlohmann::ordered_json;

// A request the server refuses: HTTP status plus an OpenAI-style error object.
struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // "" = null
  std::string type = "invalid_request_error";
  std::string code;  // "" = null
};
json error_body(const ApiError& e);

// Everything a request is checked against and rendered with.
struct ApiContext {
  const Tokenizer* tok = nullptr;
  const ChatTemplate* tmpl = nullptr;
  std::mutex* tmpl_mu = nullptr;  // renders one at a time
  int64_t ctx = 0;                // positions per slot
  int64_t vocab = 0;              // the model's
  std::string skill;              // the CMF skill the server runs ("" = none)
  std::vector<std::string> skills;  // the model's skills a request may name ("skill": ID)
  bool skill_per_request = false;   // the server can run another skill than its own
  bool skill_auto = false;          // and route a prompt to one ("skill": "auto")
  // "skill": "dynamic" (the skill follows the text, SkillSwitch): why it cannot run on this
  // server ("" = it can).
  std::string skill_dynamic_why = "this model has no skills";
  // What a request that names no skill runs: "auto" or "dynamic" (dory serve --skill auto,
  // --skill-dynamic), or "" for the server's own skill.
  std::string skill_default;
  int adapters = 0;               // LoRA adapters loaded (dory serve --lora), ids 0..adapters-1
  SamplingParams sampling;        // the server's defaults (dory serve flags)
  int64_t max_tokens = -1;        // default when a request gives none
  std::vector<std::string> stop;  // added to every request's
  bool ignore_eos = false;
};

enum class Endpoint { Chat, Completion };

struct ParsedRequest {
  Endpoint endpoint = Endpoint::Chat;
  JobSpec job;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string skill;           // the CMF skill to run it with ("" = the base weights; "auto",
                               // "dynamic": the server decides)
};

// Parses a body (raw bytes) for /v1/chat/completions or /v1/completions.
// Throws ApiError.
ParsedRequest parse_request(Endpoint ep, const std::string& body, const ApiContext& ctx);
// Parses a body as a JSON object. Throws ApiError.
json parse_object(const std::string& body);

// Response pieces. `id` is shared by every chunk of one response.
std::string new_id(Endpoint ep);
json usage_json(const JobResult& r);
json timings_json(const JobResult& r);
json final_response(Endpoint ep, const std::string& id, const std::string& model, int64_t created,
                    const std::string& text, const JobResult& r);
// A streamed chunk: text (chat: a content delta), or the last one with the
// finish reason (text empty, finish non-empty), or chat's first (role only).
json stream_chunk(Endpoint ep, const std::string& id, const std::string& model, int64_t created,
                  const std::string& text, const std::string& finish, bool role_only = false);
// OpenAI's usage chunk (stream_options.include_usage): no choices.
json usage_chunk(Endpoint ep, const std::string& id, const std::string& model, int64_t created,
                 const JobResult& r);

// JSON text with invalid UTF-8 (there should be none) replaced, never thrown.
std::string dump(const json& j);

}  // namespace dory::server
