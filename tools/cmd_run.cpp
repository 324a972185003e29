// dory run: one prompt in, its continuation streamed to stdout; speed on stderr.
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "commands.h"
#include "common.h"
#include "dory/generate.h"
#include "format/mapped_file.h"
#include "model_text.h"
#include "runtime/sampler.h"


namespace dory::cli {

namespace {
struct RunCmdOpts {
  RunOpts run;
  GenOpts gen;
  std::string prompt, prompt_file;
  bool verbose = false;
};

int run_run(const RunCmdOpts& o) {
  std::string prompt = o.prompt;
  if (!o.prompt_file.empty()) prompt = read_text_file(o.prompt_file);
  if (prompt.empty()) throw Error("the prompt is empty (give -p TEXT or -f FILE)");
  Loaded m = load_model_and_tokenizer(o.run, o.gen.tokenizer);
  const std::vector<int32_t> ids = m.tok->encode(prompt, /*add_special=*/true);
  if (ids.empty()) throw Error("the prompt encodes to no tokens");
  std::unique_ptr<DynamicSkills> dyn;
  if (o.run.skill_dynamic) dyn = std::make_unique<DynamicSkills>(o.run, m, ids);
  else route_skill(o.run, m, ids);
  TextSession ts(m.backend, o.run.session(), *m.tok);
  if (dyn) dyn->attach(ts.session());
  GenerateParams gp = o.gen.params();
  if (dyn) gp.after_token = [&](Session& s) { dyn->after_token(s); };
  Sampler sampler(o.gen.sampling());
  const Session& ss = ts.session();
  if (o.verbose)
    std::fprintf(stderr,
                 "model %s | %s | loops %d | kv %s | prompt loops %d | gate %s | o1 %s | exact %s | "
                 "seed %llu | prompt %zu tokens\n",
                 m.model->path().c_str(), backend_text(ss).c_str(), ss.loops(), kv_mode_name(ss.kv_mode()), ss.prompt_loops(),
                 ss.gate().str().c_str(), ss.o1().str().c_str(), ss.exact().str().c_str(),
                 (unsigned long long)sampler.seed(), ids.size());

  ProgressLine progress("prompt");
  const PrefillStats pf = ts.prefill(ids, [&](int64_t d, int64_t t) { progress.update(d, t); });
  progress.done();
  const GenerateStats gs = ts.generate(sampler, gp, [](std::string_view s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::fputc('\n', stdout);
  std::fflush(stdout);
  std::fprintf(stderr, "prompt: %lld tokens in %.2f s (%.2f t/s) | generation: %lld tokens in %.2f s (%.2f t/s) | stop: %s\n",
               (long long)pf.fed, pf.seconds, pf.seconds > 0 ? pf.fed / pf.seconds : 0.0,
               (long long)gs.tokens, gs.seconds, gs.seconds > 0 ? gs.tokens / gs.seconds : 0.0,
               gs.stop_reason.c_str());
  if (o.verbose) {
    if (const std::string g = gate_summary(ss); !g.empty()) std::fprintf(stderr, "%s\n", g.c_str());
    const KvBytes kb = ss.kv_bytes_split();
    std::fprintf(stderr, "kv cache: %s exact + %s far field\n", human_bytes(kb.exact).c_str(),
                 human_bytes(kb.far).c_str());
  }
  return 0;
}
}  // namespace

Runner add_run(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "continue a prompt, streaming the text to stdout");
  auto o = std::make_shared<RunCmdOpts>();
  add_run_opts(cmd, o->run);
  add_gen_opts(cmd, o->gen);
  auto* p = cmd->add_option("-p,--prompt", o->prompt, "prompt text");
  auto* f = cmd->add_option("-f,--file", o->prompt_file, "read the prompt from a file");
  p->excludes(f);
  cmd->add_flag("-v,--verbose", o->verbose, "print settings (and the seed) to stderr");
  return [o] { return run_run(*o); };
}

static const bool registered = register_command(30, add_run);

}  // namespace dory::cli
