// dory bench: prompt (pp) and generation (tg) tokens/s, mean +- sd over
// repetitions, like llama-bench, plus the weight bytes decode streams.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "commands.h"
#include "common.h"
#include "model_text.h"
#include "backend/backend.h"
#include "tensor/kernels.h"

namespace dory::cli {

namespace {
struct BenchOpts {
  RunOpts run;
  int n_prompt = 512;
  int n_gen = 128;
  int reps = 5;
  int64_t depth = 0;  // tg after this many tokens of context (llama-bench's -d)
};

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::pair<double, double> mean_sd(const std::vector<double>& v) {
  double m = 0, s = 0;
  for (double x : v) m += x;
  m /= v.size();
  for (double x : v) s += (x - m) * (x - m);
  return {m, v.size() > 1 ? std::sqrt(s / (v.size() - 1)) : 0.0};
}

int run_bench(const BenchOpts& o) {
  check_device(o.run.backend_options());
  const auto t_load = Clock::now();
  refuse_dynamic_skill(o.run, "dory bench");
  if (o.run.skill == "auto") throw Error("--skill auto: routing a prompt to a skill is not there yet (give --skill ID or none)");
  auto model = Model::load(o.run.model_path(), o.run.placement(), o.run.skill, o.run.lora);
  const double load_s = seconds_since(t_load);
  const DoryConfig& c = model->config();
  const int threads = o.run.n_threads();
  auto pool = o.run.open(model);
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab - 1));

  std::fprintf(stderr, "loaded %s in %.2f s (weights %s); kernels: %s; %d threads; backend %s\n",
               model->path().c_str(), load_s, weights_placement_text(*model).c_str(), kern::kernels().name, threads,
               pool->name());
  uint64_t kv_max = 0;  // the largest KV cache of any run, for the memory line
  KvBytes kv_split{};   // of that run
  GateStats gates{};    // summed over the tg runs
  std::string gate_name;
  auto pp_once = [&] {
    Session s(pool, o.run.session());
    std::vector<int32_t> ids(o.n_prompt);
    for (auto& id : ids) id = tok(rng);
    const auto t0 = Clock::now();
    s.forward(ids, Logits::Last);
    const double tps = o.n_prompt / seconds_since(t0);
    if (s.kv_bytes() > kv_max) kv_max = s.kv_bytes(), kv_split = s.kv_bytes_split();
    return tps;
  };
  // With a depth, one session holds the context and every repetition goes on
  // decoding from where the last stopped (a prefill of the whole depth per
  // repetition would cost far more than the test).
  std::unique_ptr<Session> deep;
  auto tg_once = [&] {
    std::unique_ptr<Session> fresh;
    if (o.depth > 0 && !deep) {
      deep = std::make_unique<Session>(pool, o.run.session());
      std::vector<int32_t> ctx(o.depth);
      for (auto& id : ctx) id = tok(rng);
      deep->prompt_end(o.depth);
      ProgressLine progress("context");
      for (int64_t b = 0; b < o.depth; b += 4096) {
        const int64_t n = std::min<int64_t>(4096, o.depth - b);
        deep->forward(std::span(ctx).subspan(b, n), Logits::None);
        progress.update(b + n, o.depth);
      }
      progress.done();
    }
    if (!deep) fresh = std::make_unique<Session>(pool, o.run.session());
    Session& s = deep ? *deep : *fresh;
    const GateStats g0 = s.gate_stats();
    const auto t0 = Clock::now();
    for (int i = 0; i < o.n_gen; ++i) {
      int32_t id = tok(rng);
      s.forward({&id, 1}, Logits::Last);
    }
    const double tps = o.n_gen / seconds_since(t0);
    if (s.kv_bytes() > kv_max) kv_max = s.kv_bytes(), kv_split = s.kv_bytes_split();
    const GateStats g = s.gate_stats();
    gates.gated += g.gated - g0.gated, gates.one_pass += g.one_pass - g0.one_pass;
    gates.readouts += g.readouts - g0.readouts, gates.probes += g.probes - g0.probes;
    gate_name = s.gate().str();
    return tps;
  };

  // The model's weight type: the dtype holding the most elements.
  std::string wtype;
  int64_t most = -1;
  for (const auto& [dt, e] : model->dtype_mix())
    if (e.second > most) most = e.second, wtype = dt;
  Session probe(pool, o.run.session());
  const int loops = probe.loops();
  const uint64_t bytes_tok = model->bytes_per_token(loops);
  std::printf("| model | size | params | loops | kv | threads | test | t/s | GB/s |\n");
  std::printf("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |\n");
  double tg_gbs = 0;  // the last tg row's effective GB/s
  auto row = [&](const char* kind, int n, const std::vector<double>& tps, bool gbs) {
    auto [m, sd] = mean_sd(tps);
    char gb[32] = "-";
    // Tokens the gate let out after one pass read the recurrent block once.
    const double one = gates.one_pass_share();
    const double btok = loops > 1 ? bytes_tok - one * double(bytes_tok - model->bytes_per_token(1)) : bytes_tok;
    if (gbs) std::snprintf(gb, sizeof gb, "%.2f", m * btok / 1e9), tg_gbs = m * btok / 1e9;
    char test[64];
    if (o.depth > 0 && kind[0] == 't') std::snprintf(test, sizeof test, "%s%d @ d%lld", kind, n, (long long)o.depth);
    else std::snprintf(test, sizeof test, "%s%d", kind, n);
    std::printf("| dory %.2fB %s | %s | %.3f B | %d | %s | %d | %s | %.2f ± %.2f | %s |\n",
                model->n_params() / 1e9, wtype.c_str(),
                human_bytes(model->file_bytes()).c_str(), model->n_params() / 1e9, loops,
                kv_mode_name(probe.kv_mode()), threads, test, m, sd, gb);
    std::fflush(stdout);
  };
  if (o.n_prompt > 0) {
    std::fprintf(stderr, "pp%d: warm-up + %d repetitions\n", o.n_prompt, o.reps);
    pp_once();
    std::vector<double> v;
    for (int r = 0; r < o.reps; ++r) v.push_back(pp_once());
    row("pp", o.n_prompt, v, false);
  }
  if (o.n_gen > 0) {
    std::fprintf(stderr, "tg%d: warm-up + %d repetitions\n", o.n_gen, o.reps);
    tg_once();
    std::vector<double> v;
    for (int r = 0; r < o.reps; ++r) v.push_back(tg_once());
    row("tg", o.n_gen, v, true);
  }
  if (const double bw = tg_gbs > 0 ? pool->measured_read_bandwidth() : 0; bw > 0)
    std::fprintf(stderr, "%s: read bandwidth %.0f GB/s (a read-only kernel over 1 GiB); tg moved %.1f%% of it\n",
                 pool->name(), bw / 1e9, 100.0 * tg_gbs * 1e9 / bw);
  if (gates.gated > 0)
    std::fprintf(stderr, "gate %s: %lld tokens gated, %.1f%% left after one pass (read-outs %lld, probes %lld)\n",
                 gate_name.c_str(), (long long)gates.gated, 100.0 * gates.one_pass_share(),
                 (long long)gates.readouts, (long long)gates.probes);
  if (kv_split.far > 0)
    std::fprintf(stderr, "kv cache: %s exact + %s far field (o1 %s)\n", human_bytes(kv_split.exact).c_str(),
                 human_bytes(kv_split.far).c_str(), probe.o1().str().c_str());
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  // Mapped weights count in RSS as file pages once touched (page cache, not
  // copies); weights read into memory (--no-mmap) count as anonymous pages,
  // with what the engine allocated.
  const auto anon = proc_bytes("/proc/self/status", "RssAnon"), file = proc_bytes("/proc/self/status", "RssFile");
  const uint64_t peak = static_cast<uint64_t>(ru.ru_maxrss) * 1024;
  std::fprintf(stderr,
               "peak RSS %s = %.3f x (file %s + KV cache %s, the largest of the runs); now %s "
               "anonymous (RssAnon: allocations%s) + %s file-backed (RssFile%s)\n",
               human_bytes(peak).c_str(), double(peak) / double(model->file_bytes() + kv_max),
               human_bytes(model->file_bytes()).c_str(), human_bytes(kv_max).c_str(),
               anon ? human_bytes(*anon).c_str() : "?", model->weights_in_memory() ? " and the weights" : "",
               file ? human_bytes(*file).c_str() : "?", model->weights_in_memory() ? "" : ": the mapped weights");
  return 0;
}
}  // namespace

Runner add_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "measure prompt and generation speed (like llama-bench)");
  auto o = std::make_shared<BenchOpts>();
  add_run_opts(cmd, o->run);
  cmd->add_option("-p,--n-prompt", o->n_prompt, "prompt tokens per pp test (0 = skip)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("-n,--n-gen", o->n_gen, "generated tokens per tg test (0 = skip)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("-d,--depth", o->depth, "run the tg test after this many tokens of context (not timed)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 22))
      ->capture_default_str();
  cmd->add_option("-r,--repetitions", o->reps, "repetitions of each test")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  return [o] { return run_bench(*o); };
}

static const bool registered = register_command(60, add_bench);

}  // namespace dory::cli
