// dory logits: every position's logits for given ids, as float32 .npy. What
// the parity tests use, and what anyone comparing with another engine needs.
#include <algorithm>
#include <cstdio>

#include "commands.h"
#include "common.h"
#include "format/mapped_file.h"
#include "model_text.h"
#include "runtime/npy.h"

namespace dory::cli {

namespace {
struct LogitsOpts {
  RunOpts run;
  std::string ids;
  std::string out;
  std::string passes_out;
  int64_t prompt_rows = 0;
};

int run_logits(const LogitsOpts& o) {
  const std::vector<int32_t> ids = parse_ids(o.ids);
  check_device(o.run.backend_options());
  std::shared_ptr<const Model> model;
  std::shared_ptr<Backend> backend;
  refuse_dynamic_skill(o.run, "dory logits");
  if (o.run.skill == "auto") {  // routed on the ids (all of them, prompt and scored rows)
    Loaded l;
    l.model = Model::load(o.run.model_path(), o.run.placement(), "", o.run.lora);
    l.backend = o.run.open(l.model);
    route_skill(o.run, l, ids);
    model = l.model, backend = l.backend;
  } else {
    model = Model::load(o.run.model_path(), o.run.placement(), o.run.skill, o.run.lora);
    backend = o.run.open(model);
  }
  Session session(backend, o.run.session());
  if (o.prompt_rows < 0 || o.prompt_rows >= static_cast<int64_t>(ids.size()))
    throw Error("--prompt-rows " + std::to_string(o.prompt_rows) + " must leave at least one of the " +
                std::to_string(ids.size()) + " ids to score");
  // The first prompt_rows ids go in as a prompt nobody reads (prompt_loops applies); the
  // rest are scored, in chunks of --chunk (one row at a time: decode, where the gate acts).
  // The prompt ends after --prompt-rows (else with the last id): with exact rows on, they
  // are chosen there, as dory run and the server choose them at a prompt's end.
  session.prompt_end(o.prompt_rows > 0 ? o.prompt_rows : static_cast<int64_t>(ids.size()));
  std::vector<int> passes;
  if (o.prompt_rows > 0) {
    session.forward(std::span(ids).first(o.prompt_rows), Logits::None);
    passes = session.last_passes();
  }
  std::span<const int32_t> scored = std::span(ids).subspan(o.prompt_rows);
  std::vector<float> logits = session.forward(scored, Logits::All);
  passes.insert(passes.end(), session.last_passes().begin(), session.last_passes().end());
  const int64_t V = model->config().vocab;
  if (!o.passes_out.empty()) {
    std::string line;
    for (int p : passes) line += (line.empty() ? "" : ",") + std::to_string(p);
    write_text_file(o.passes_out, line + "\n");
  }
  if (const std::string g = gate_summary(session); !g.empty()) std::fprintf(stderr, "%s\n", g.c_str());
  write_npy_f32(o.out, logits.data(), {static_cast<int64_t>(scored.size()), V});
  std::fprintf(stderr, "wrote %s: [%zu, %lld] float32 (loops %d, kv %s, chunk %d)\n",
               o.out.c_str(), scored.size(), (long long)V, session.loops(),
               kv_mode_name(session.kv_mode()), session.options().chunk);
  // The last row's top 5, so a run shows something without numpy.
  const float* last = logits.data() + (scored.size() - 1) * V;
  std::vector<int64_t> top(V);
  for (int64_t i = 0; i < V; ++i) top[i] = i;
  const int64_t k = std::min<int64_t>(5, V);
  std::partial_sort(top.begin(), top.begin() + k, top.end(),
                    [&](int64_t a, int64_t b) { return last[a] > last[b]; });
  std::fprintf(stderr, "last position, top %lld ids:", (long long)k);
  for (int64_t i = 0; i < k; ++i) std::fprintf(stderr, " %lld (%.3f)", (long long)top[i], last[top[i]]);
  std::fprintf(stderr, "\n");
  return 0;
}
}  // namespace

Runner add_logits(CLI::App& app) {
  auto* cmd = app.add_subcommand("logits", "write every position's logits for token ids to .npy");
  auto o = std::make_shared<LogitsOpts>();
  add_run_opts(cmd, o->run);
  cmd->add_option("--ids", o->ids, "comma-separated token ids, e.g. 1,2,3")->required();
  cmd->add_option("-o,--output", o->out, "output .npy path ([n_ids, vocab] float32)")->required();
  cmd->add_option("--prompt-rows", o->prompt_rows,
                  "feed the first N ids as a prompt whose logits nobody reads (--prompt-loops applies), "
                  "then score the rest; the .npy holds the scored rows");
  cmd->add_option("--passes-out", o->passes_out,
                  "write the recurrent passes each position ran (comma-separated) to this file");
  return [o] { return run_logits(*o); };
}

static const bool registered = register_command(50, add_logits);

}  // namespace dory::cli
