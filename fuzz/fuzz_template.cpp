// Fuzzes the chat-template interpreter: parsing a Jinja source (lexer, statements,
// expressions, whitespace control) and rendering it (filters, tests, methods, macros,
// loops, namespaces, string formatting, tojson) against a context.
//
// Input layout: TEMPLATE [\0 CONTEXT_JSON]. Without a context part a fixed one is used: a
// chat with a system prompt, tool calls and a tool result, tools, and the usual variables,
// so the seeds (real models' templates) take their real paths. Limits are lowered from the
// defaults (64 MiB of output, so 1 GiB of strings built, and 5M steps) to 256 KiB and 100k
// steps, so that a runaway template ends well inside libFuzzer's -timeout=10 under ASan; the
// limits' own behaviour is what the unit tests check.
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "fuzz_common.h"
#include "text/chat_template.h"

namespace {
constexpr const char* kContext = R"({
  "messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris? Answer in \u00e9l\u00e9gant French."},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 21}"},
    {"role": "assistant", "content": "<think>ok</think>Il fait 21 degr\u00e9s."},
    {"role": "user", "content": [{"type": "text", "text": "Merci"}, {"type": "image"}]}
  ],
  "tools": [{"type": "function", "function": {"name": "get_weather",
    "description": "Current weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string",
    "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}],
  "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>",
  "enable_thinking": false, "date_string": "26 Jul 2024"
})";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  bool has_context = false;
  const std::string source(dory::fuzz::split_at(rest, '\0', &has_context));
  static const nlohmann::ordered_json fixed = nlohmann::ordered_json::parse(kContext);
  nlohmann::ordered_json context;
  if (has_context) {
    context = nlohmann::ordered_json::parse(rest.begin(), rest.end(), nullptr, false);
    if (context.is_discarded()) return 0;  // JSON syntax is nlohmann's, not ours to fuzz
  }
  dory::fuzz::expect_ok_or_error([&] {
    dory::ChatTemplate t(source);
    t.set_clock(1721990400);  // 2024-07-26: strftime_now must not depend on the day
    t.limits().max_output = 256 << 10;
    t.limits().max_steps = 100'000;
    (void)t.render(has_context ? context : fixed);
  });
  return 0;
}
