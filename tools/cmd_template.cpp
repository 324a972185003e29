// dory template: render a chat template with a context, exactly as the model
// would see the prompt. What the template parity tests drive.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "commands.h"
#include "dory/error.h"
#include "text/chat_template.h"

namespace dory::cli {

namespace {

struct TemplateOpts {
  std::string tpl, context, messages, bos, eos, now;
  bool add_generation_prompt = false;
  std::vector<std::string> sets;
};

std::string read_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(std::string("cannot read ") + what + " " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw Error(std::string("cannot read ") + what + " " + path);
  return ss.str();
}

nlohmann::ordered_json read_json(const std::string& path, const char* what) {
  const std::string text = read_file(path, what);
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": invalid JSON: " + e.what());
  }
}

// "2024-07-26" or "2024-07-26T13:05:00": the clock strftime_now() reads.
std::time_t parse_now(const std::string& s) {
  std::tm tm{};
  int n = 0;
  if (std::sscanf(s.c_str(), "%4d-%2d-%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &n) != 3)
    throw Error("--now: expected YYYY-MM-DD[THH:MM[:SS]], got '" + s + "'");
  if (s.size() > static_cast<size_t>(n) &&
      std::sscanf(s.c_str() + n, "%*1[T ]%2d:%2d:%2d", &tm.tm_hour, &tm.tm_min, &tm.tm_sec) < 2)
    throw Error("--now: expected YYYY-MM-DD[THH:MM[:SS]], got '" + s + "'");
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return timegm(&tm);
}

int run_template(const TemplateOpts& o) {
  std::string source;
  if (o.tpl.size() > 5 && o.tpl.compare(o.tpl.size() - 5, 5, ".json") == 0)
    source = ChatTemplate::from_tokenizer_config(read_json(o.tpl, "tokenizer config"));
  else
    source = read_file(o.tpl, "template");
  ChatTemplate tpl(source);
  if (!o.now.empty()) tpl.set_clock(parse_now(o.now));

  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  if (!o.context.empty()) {
    ctx = read_json(o.context, "context");
    if (!ctx.is_object()) throw Error(o.context + ": the context must be a JSON object");
  }
  if (!o.messages.empty()) {
    auto m = read_json(o.messages, "messages");
    if (!m.is_array()) throw Error(o.messages + ": messages must be a JSON array");
    ctx["messages"] = std::move(m);
  }
  if (o.add_generation_prompt) ctx["add_generation_prompt"] = true;
  if (!o.bos.empty()) ctx["bos_token"] = o.bos;
  if (!o.eos.empty()) ctx["eos_token"] = o.eos;
  for (const auto& kv : o.sets) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw Error("--set: expected KEY=JSON, got '" + kv + "'");
    try {
      ctx[kv.substr(0, eq)] = nlohmann::ordered_json::parse(kv.substr(eq + 1));
    } catch (const nlohmann::json::exception& e) {
      throw Error("--set " + kv.substr(0, eq) + ": invalid JSON: " + e.what());
    }
  }
  const std::string out = tpl.render(ctx);
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace

Runner add_template(CLI::App& app) {
  auto* cmd = app.add_subcommand("template", "render a chat template (Jinja) with messages");
  auto o = std::make_shared<TemplateOpts>();
  cmd->add_option("-t,--template", o->tpl, "template file (.jinja, or a tokenizer_config.json)")
      ->required();
  cmd->add_option(
      "-c,--context", o->context,
      "JSON object of template variables (messages, tools, add_generation_prompt, ...)");
  cmd->add_option("--messages", o->messages, "JSON array of messages (sets 'messages')");
  cmd->add_flag("--add-generation-prompt", o->add_generation_prompt,
                "end with the assistant's turn header");
  cmd->add_option("--bos", o->bos, "bos_token");
  cmd->add_option("--eos", o->eos, "eos_token");
  cmd->add_option("--set", o->sets, "KEY=JSON: one more variable (repeatable)");
  cmd->add_option("--now", o->now, "the date strftime_now() sees, YYYY-MM-DD[THH:MM[:SS]] (UTC)");
  return [o] { return run_template(*o); };
}

static const bool registered = register_command(70, add_template);

}  // namespace dory::cli
