// A model's chat template: the Jinja program in tokenizer_config.json that turns
// a list of messages into the prompt text. Rendered by our own interpreter
// (text/jinja.h) with the semantics of transformers' apply_chat_template.
#pragma once
#include <ctime>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "text/jinja.h"

namespace dory {

class ChatTemplate {
 public:
  // Parses the template; a syntax error throws dory::Error("chat template line N: ...").
  explicit ChatTemplate(const std::string& source);

  // context: messages (array of {role, content, ...}), add_generation_prompt,
  // bos_token, eos_token, tools (optional), plus any extra variables. Throws
  // dory::Error naming the template line on a runtime error, including the
  // template's own raise_exception("...") with its message.
  std::string render(const nlohmann::json& context) const;
  // The same, keeping the key order of JSON objects (what tojson prints, as
  // Python's dicts do). Prefer this one for contexts parsed from text.
  std::string render(const nlohmann::ordered_json& context) const;

  // strftime_now() reads this clock instead of the local one (for tests and
  // reproducible prompts).
  void set_clock(std::time_t fixed_utc_seconds);
  jinja::Limits& limits() { return opts_.limits; }

  // The chat_template of a tokenizer_config.json: a string, or a list of
  // {name, template} where "default" is the one used. Throws dory::Error.
  static std::string from_tokenizer_config(const nlohmann::ordered_json& config,
                                           const std::string& name = "default");

 private:
  std::shared_ptr<const jinja::Template> tpl_;
  jinja::Options opts_;
};

}  // namespace dory
