// dory logits: every position's logits for given ids, as float32 .npy. What
// the parity tests use, and what anyone comparing with another engine needs.
#include <algorithm>
#include <cstdio>

#include "commands.h"
#include "common.h"
#include "runtime/npy.h"
#include "runtime/pool.h"

namespace dory::cli {

namespace {
struct LogitsOpts {
  RunOpts run;
  std::string ids;
  std::string out;
};

int run_logits(const LogitsOpts& o) {
  const std::vector<int32_t> ids = parse_ids(o.ids);
  auto model = Model::load(o.run.model_path());
  ThreadPool pool(o.run.n_threads());
  Session session(model, pool, o.run.session());
  std::vector<float> logits = session.forward(ids, Logits::All);
  const int64_t V = model->config().vocab;
  write_npy_f32(o.out, logits.data(), {static_cast<int64_t>(ids.size()), V});
  std::fprintf(stderr, "wrote %s: [%zu, %lld] float32 (loops %d, kv %s, chunk %d)\n",
               o.out.c_str(), ids.size(), (long long)V, session.loops(),
               kv_mode_name(session.kv_mode()), o.run.chunk);
  // The last row's top 5, so a run shows something without numpy.
  const float* last = logits.data() + (ids.size() - 1) * V;
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
  return [o] { return run_logits(*o); };
}

static const bool registered = register_command(50, add_logits);

}  // namespace dory::cli
