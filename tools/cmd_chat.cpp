// dory chat: an interactive multi-turn chat through the model's chat template.
// The KV cache is kept between turns: each turn rolls back to the longest
// common prefix of the new rendering and feeds only the new tokens.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "model_text.h"

namespace dory::cli {

namespace {

std::atomic<bool> g_interrupt{false};
void on_sigint(int) { g_interrupt.store(true); }

struct ChatOpts {
  RunOpts run;
  GenOpts gen;
  std::string system;
  bool verbose = false;
};

int run_chat(const ChatOpts& o) {
  Loaded m = load_model_and_tokenizer(o.run, o.gen.tokenizer);
  const ChatTemplate tmpl(chat_template_source(*m.tok));
  // --skill auto: the first turn's prompt picks the skill (the session starts over on it).
  // --skill-dynamic: the same turn starts it (then the skill follows each answer's tokens).
  bool routed = o.run.skill != "auto" && !o.run.skill_dynamic;
  std::unique_ptr<DynamicSkills> dyn;
  const std::shared_ptr<Backend> base_backend = m.backend;
  auto ts_ptr = std::make_unique<TextSession>(m.backend, o.run.session(), *m.tok);
  Sampler sampler(o.gen.sampling());

  // Ctrl-C stops the answer being written; at the prompt it ends the chat.
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a read at the prompt returns on Ctrl-C
  sigaction(SIGINT, &sa, nullptr);

  const bool tty = isatty(STDIN_FILENO);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  auto start = [&] {
    messages = nlohmann::ordered_json::array();
    if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
  };
  start();
  if (tty)
    std::fprintf(stderr, "dory chat: type a message; /reset starts over, /exit (or Ctrl-D) ends. "
                         "Ctrl-C stops an answer.\n");
  int turn = 0;
  for (;;) {
    if (tty) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    std::string line;
    g_interrupt.store(false);
    if (!std::getline(std::cin, line)) {
      if (tty) std::fputc('\n', stdout);
      break;  // end of input, or Ctrl-C at the prompt
    }
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      start();
      ts_ptr->reset();
      if (o.run.skill_dynamic) routed = false, dyn.reset(), m.backend = base_backend;
      std::fprintf(stderr, "[chat reset]\n");
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    nlohmann::ordered_json ctx = {{"messages", messages},
                          {"add_generation_prompt", true},
                          {"bos_token", m.tok->bos_token()},
                          {"eos_token", m.tok->eos_token()}};
    std::string text;
    try {
      text = tmpl.render(ctx);
    } catch (const Error& e) {
      messages.erase(messages.size() - 1);  // keep the chat usable
      std::fprintf(stderr, "error: %s\n", e.what());
      continue;
    }
    std::vector<int32_t> ids = m.tok->encode(text, /*add_special=*/false);
    // The template may leave BOS to the tokenizer's own rule.
    if (auto bos = m.tok->bos_id();
        bos && m.tok->adds_bos() && (ids.empty() || ids.front() != *bos))
      ids.insert(ids.begin(), *bos);
    if (!routed) {
      try {
        if (o.run.skill_dynamic) dyn = std::make_unique<DynamicSkills>(o.run, m, ids);
        else route_skill(o.run, m, ids);
      } catch (const Error& e) {
        messages.erase(messages.size() - 1);
        std::fprintf(stderr, "error: %s\n", e.what());
        continue;
      }
      ts_ptr = std::make_unique<TextSession>(m.backend, o.run.session(), *m.tok);
      if (dyn) dyn->attach(ts_ptr->session());
      routed = true;
    }
    TextSession& ts = *ts_ptr;
    PrefillStats pf;
    try {
      ProgressLine progress("prompt");
      pf = ts.prefill(ids, [&](int64_t d, int64_t t) { progress.update(d, t); });
      progress.done();
    } catch (const Error& e) {
      messages.erase(messages.size() - 1);
      std::fprintf(stderr, "error: %s\n", e.what());
      continue;
    }
    ++turn;
    if (o.verbose)
      std::fprintf(stderr, "[turn %d: prompt %zu tokens, %lld reused from the cache, %lld new fed in %.2f s]\n",
                   turn, ids.size(), (long long)pf.reused, (long long)pf.fed, pf.seconds);
    std::string answer;
    GenerateParams gp = o.gen.params();
    if (dyn) gp.after_token = [&](Session& s) { dyn->after_token(s); };
    const GenerateStats gs = ts.generate(
        sampler, gp,
        [&](std::string_view s) {
          answer += s;
          std::fwrite(s.data(), 1, s.size(), stdout);
          std::fflush(stdout);
          return true;
        },
        &g_interrupt);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    if (gs.stop_reason == "cancelled") std::fprintf(stderr, "[stopped]\n");
    if (o.verbose)
      std::fprintf(stderr, "[turn %d: %lld tokens in %.2f s (%.2f t/s), stop: %s]\n", turn,
                   (long long)gs.tokens, gs.seconds, gs.seconds > 0 ? gs.tokens / gs.seconds : 0.0,
                   gs.stop_reason.c_str());
    messages.push_back({{"role", "assistant"}, {"content", answer}});
  }
  return 0;
}
}  // namespace

Runner add_chat(CLI::App& app) {
  auto* cmd = app.add_subcommand("chat", "interactive multi-turn chat through the chat template");
  auto o = std::make_shared<ChatOpts>();
  add_run_opts(cmd, o->run);
  add_gen_opts(cmd, o->gen);
  cmd->add_option("--system", o->system, "system prompt");
  cmd->add_flag("-v,--verbose", o->verbose, "print per-turn token counts and speed to stderr");
  return [o] { return run_chat(*o); };
}

static const bool registered = register_command(40, add_chat);

}  // namespace dory::cli
