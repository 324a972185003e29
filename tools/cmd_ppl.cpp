// dory ppl: perplexity of a model over a text, in windows as llama-perplexity does:
// the text's tokens are cut into windows of --ctx tokens, each run from an empty cache
// (its first token replaced by BOS when the tokenizer adds one), and only the second half
// of each window is scored, so every scored token sees at least ctx/2 tokens of context.
#include <chrono>
#include <cmath>
#include <cstdio>

#include "commands.h"
#include "common.h"
#include "backend/backend.h"
#include "format/mapped_file.h"
#include "model_text.h"
#include "text/utf8.h"

namespace dory::cli {

namespace {
struct PplOpts {
  RunOpts run;
  std::string file;
  int ctx = 512;
  int max_windows = 0;  // 0 = all
};

int run_ppl(const PplOpts& o) {
  const std::string text = read_text_file(o.file);
  if (const size_t bad = utf8::first_invalid(text); bad != std::string::npos)
    throw Error(o.file + ": not valid UTF-8 at byte " + std::to_string(bad));
  refuse_auto_skill(o.run, "dory ppl");
  refuse_dynamic_skill(o.run, "dory ppl");
  Loaded m = load_model_and_tokenizer(o.run, "");
  std::vector<int32_t> tokens = m.tok->encode(text, /*add_special=*/true);
  const int64_t ctx = o.ctx;
  const int64_t n_windows_all = static_cast<int64_t>(tokens.size()) / ctx;
  if (n_windows_all < 1)
    throw Error(o.file + ": " + std::to_string(tokens.size()) + " tokens, fewer than one window of --ctx " +
                std::to_string(ctx) + " (give a longer text or a smaller --ctx)");
  const int64_t n_windows = o.max_windows > 0 ? std::min<int64_t>(o.max_windows, n_windows_all) : n_windows_all;
  const int64_t V = m.model->config().vocab;
  const std::optional<int32_t> bos = m.tok->adds_bos() ? m.tok->bos_id() : std::nullopt;
  const int64_t first = ctx / 2;

  auto backend = o.run.open(m.model);
  std::fprintf(stderr, "ppl: %zu tokens, %lld windows of %lld (scoring the last %lld of each) | %d threads\n",
               tokens.size(), (long long)n_windows, (long long)ctx, (long long)(ctx - 1 - first),
               backend->host_threads());
  double nll = 0, nll2 = 0;
  int64_t count = 0;
  int loops = 0;
  const char* kv = "";
  GateStats gates;
  std::string gate_name;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t w = 0; w < n_windows; ++w) {
    std::vector<int32_t> win(tokens.begin() + w * ctx, tokens.begin() + (w + 1) * ctx);
    if (bos) win[0] = *bos;
    Session s(backend, o.run.session());
    loops = s.loops();
    kv = kv_mode_name(s.kv_mode());
    // The window's first half is the prompt: with exact rows on, they are chosen at its end.
    s.prompt_end(first);
    s.forward(std::span<const int32_t>(win.data(), first), Logits::None);
    const std::vector<float> lg = s.forward(std::span<const int32_t>(win.data() + first, ctx - 1 - first), Logits::All);
    for (int64_t j = 0; j < ctx - 1 - first; ++j) {
      const float* row = lg.data() + j * V;
      float mx = row[0];
      for (int64_t v = 1; v < V; ++v) mx = std::max(mx, row[v]);
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
      const double l = std::log(sum) + mx - row[win[first + j + 1]];
      nll += l;
      nll2 += l * l;
      ++count;
    }
    const GateStats g = s.gate_stats();
    gates.gated += g.gated, gates.one_pass += g.one_pass;
    gate_name = s.gate().kind == GateParams::Kind::Off ? "" : s.gate().str();
    std::printf("[%lld]%.4f,", (long long)(w + 1), std::exp(nll / count));
    std::fflush(stdout);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double mean = nll / count;
  // Standard error of the mean negative log-likelihood, carried to the perplexity (as
  // llama-perplexity reports it).
  const double var = count > 1 ? std::max(0.0, (nll2 / count - mean * mean) * count / (count - 1)) : 0.0;
  const double ppl = std::exp(mean);
  std::printf("\nFinal estimate: PPL = %.4f +/- %.4f\n", ppl, ppl * std::sqrt(var / count));
  std::fprintf(stderr, "ppl: %lld tokens scored | loops %d | kv %s | %.2f s (%.1f t/s)\n", (long long)count, loops,
               kv, secs, n_windows * ctx / secs);
  // The gate decides only for rows fed one at a time (--chunk 1 scores as decode does).
  if (!gate_name.empty())
    std::fprintf(stderr, "gate %s: %lld tokens gated, %.1f%% left after one pass\n", gate_name.c_str(),
                 (long long)gates.gated, 100.0 * gates.one_pass_share());
  return 0;
}
}  // namespace

Runner add_ppl(CLI::App& app) {
  auto* cmd = app.add_subcommand("ppl", "perplexity over a text file, in windows like llama-perplexity");
  auto o = std::make_shared<PplOpts>();
  add_run_opts(cmd, o->run);
  cmd->add_option("-f,--file", o->file, "UTF-8 text file")->required();
  cmd->add_option("-c,--ctx", o->ctx, "tokens per window; the second half of each is scored")
      ->check(CLI::Range(8, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--chunks", o->max_windows, "score at most this many windows (default: all)")
      ->check(CLI::Range(1, 1 << 30));
  return [o] { return run_ppl(*o); };
}

static const bool registered = register_command(55, add_ppl);

}  // namespace dory::cli
