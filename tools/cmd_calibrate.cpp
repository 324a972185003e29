// dory calibrate -m MODEL -f TEXT -o OUT.gguf: fits a "turbo" model file (docs/model.md
// section 7) from the model's own activations on TEXT:
//  - the recon router: the states after pass 1 of tokens whose next-token distribution
//    after one pass is closest to the all-pass one (KL below the median) are "easy", the
//    rest "hard"; each gets its mean and top-r principal basis; the exit bias is the one
//    that lets the most tokens out after one pass while the text's perplexity rises by at
//    most --max-cost (measured on the calibration text itself: its next tokens' NLL after
//    one pass against all passes), or the one for a given --exit-share;
//  - the exact-row weights: long prompts cut from TEXT with a planted fact (a pass
//    key, as in the built-in model's training) go through the far field; per full
//    layer, a logistic fit of "this row holds the fact" on the rows' features says
//    which features mark rows that must stay exact;
// and writes the model (tensor types as they are) with the turbo keys and tensors.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "backend/backend.h"
#include "backend/cpu/exact_rows.h"
#include "commands.h"
#include "common.h"
#include "convert.h"
#include "format/mapped_file.h"
#include "model/turbo.h"
#include "model/weights.h"
#include "model_text.h"
#include "subspace.h"

namespace dory::cli {

namespace {

struct CalibrateOpts {
  RunOpts run;
  std::string tokenizer, text, out;
  std::string raw;  // --raw PREFIX: also the raw f32 side files
  int64_t tokens = 16384;
  int rank = 16;
  double easy_share = 0.5;  // the share of tokens (lowest KL first) the router calls easy
  double exit_share = -1;  // < 0: set by max_cost
  double max_cost = 1.0;   // percent of perplexity on the calibration text
  std::string o1 = "32,128,4,512";
  int64_t budget = 256;
  int prompts = 16;
  int64_t prompt_length = 1536;
  uint32_t seed = 7;
};

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Logistic regression of y on the columns of X [n x d] (class-balanced), plain
// gradient descent; returns the d weights (the intercept only shifts the score).
std::vector<float> logistic(const std::vector<double>& X, const std::vector<uint8_t>& y,
                            int64_t d) {
  const int64_t n = static_cast<int64_t>(y.size());
  const double pos = std::max<double>(1, std::count(y.begin(), y.end(), 1));
  const double neg = std::max<double>(1, double(n) - pos);
  std::vector<double> w(d + 1, 0.0), g(d + 1);
  for (int it = 0; it < 600; ++it) {
    std::fill(g.begin(), g.end(), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      double z = w[d];
      for (int64_t k = 0; k < d; ++k) z += w[k] * X[i * d + k];
      const double p = 1.0 / (1.0 + std::exp(-z));
      const double e = (p - y[i]) * (y[i] ? 0.5 / pos : 0.5 / neg);
      for (int64_t k = 0; k < d; ++k) g[k] += e * X[i * d + k];
      g[d] += e;
    }
    for (int64_t k = 0; k <= d; ++k) w[k] -= 4.0 * g[k];
  }
  return std::vector<float>(w.begin(), w.begin() + d);
}

std::vector<int32_t> enc(const Tokenizer& tok, const std::string& s) {
  return tok.encode(s, false, false);
}

int run_calibrate(const CalibrateOpts& o) {
  const auto t0 = Clock::now();
  refuse_auto_skill(o.run, "dory calibrate");
  refuse_dynamic_skill(o.run, "dory calibrate");
  Loaded m = load_model_and_tokenizer(o.run, o.tokenizer);
  const DoryConfig& c = m.model->config();
  auto pool = o.run.open(m.model);
  const std::string text = read_text_file(o.text);
  std::vector<int32_t> ids = enc(*m.tok, text);
  if (static_cast<int64_t>(ids.size()) < std::max<int64_t>(1024, o.prompt_length + 16))
    throw Error(o.text + ": " + std::to_string(ids.size()) +
                " tokens; calibration needs at least " +
                std::to_string(std::max<int64_t>(1024, o.prompt_length + 16)));
  const O1Params o1 = parse_o1(o.o1);
  if (!o1.on) throw Error("--o1: calibration needs a far field (m,w,sink,seal)");
  if (o.prompt_length <= o1.seal + o1.w + 64)
    throw Error("--prompt-length " + std::to_string(o.prompt_length) +
                " must exceed the seal plus the window (" + std::to_string(o1.seal + o1.w + 64) +
                ")");
  const int64_t ctx = c.max_positions > 0 ? c.max_positions : 4096;
  if (o.prompt_length >= ctx)
    throw Error("--prompt-length " + std::to_string(o.prompt_length) +
                " must be below the model's context " + std::to_string(ctx));
  SessionOptions base = o.run.session();
  base.kv = KvMode::LastLoop;
  base.gate = GateParams{};
  base.o1 = O1Params{};
  base.exact = ExactParams{};
  base.prompt_loops = 0;
  Session probe_loops(pool, base);
  if (probe_loops.loops() < 2) throw Error("calibration needs at least 2 loops (--loops)");

  // 1. The router, from the states after pass 1.
  const int64_t n_tok = std::min<int64_t>(o.tokens, static_cast<int64_t>(ids.size()));
  const int64_t H = c.hidden;
  std::vector<float> states, p1, kl, dnll;
  std::vector<bool> easy;
  std::fprintf(stderr, "router: %lld tokens of %s, %d loops, last_loop\n", (long long)n_tok,
               o.text.c_str(), probe_loops.loops());
  for (int64_t b = 0; b < n_tok;) {
    Session s(pool, base);
    const int64_t n = std::min<int64_t>(ctx - 1, n_tok - b);
    const ProbeRows pr = s.probe(std::span(ids).subspan(b, n));
    states.insert(states.end(), pr.state1.begin(), pr.state1.end());
    p1.insert(p1.end(), pr.p1.begin(), pr.p1.end());
    kl.insert(kl.end(), pr.kl.begin(), pr.kl.end());
    dnll.insert(dnll.end(), pr.dnll.begin(), pr.dnll.end());
    b += n;
    std::fprintf(stderr, "\r  %lld/%lld tokens, %.1f s", (long long)b, (long long)n_tok, since(t0));
  }
  std::fputc('\n', stderr);
  {
    // Easy: the share of the tokens (half by default) whose one-pass distribution is closest
    // to all passes'.
    std::vector<float> sorted_kl = kl;
    const int64_t cut = std::clamp<int64_t>(std::llround(o.easy_share * double(n_tok)), 1, n_tok - 1);
    std::nth_element(sorted_kl.begin(), sorted_kl.begin() + cut, sorted_kl.end());
    const float med = sorted_kl[cut];
    for (int64_t i = 0; i < n_tok; ++i) easy.push_back(kl[i] < med);
  }
  int64_t n_easy = std::count(easy.begin(), easy.end(), true);
  if (n_easy < o.rank + 2 || n_tok - n_easy < o.rank + 2) {
    // A model whose passes (nearly) always or never agree (random weights): split by the
    // first read-out's confidence instead, so the router still tells surer tokens apart.
    std::vector<float> sorted_p1 = p1;
    std::nth_element(sorted_p1.begin(), sorted_p1.begin() + n_tok / 2, sorted_p1.end());
    const float med = sorted_p1[n_tok / 2];
    std::fprintf(stderr,
                 "router: %lld of %lld tokens change less than the median after one pass, too "
                 "few on one side for rank %d; easy = the "
                 "%s half by the first read-out's top probability instead\n",
                 (long long)n_easy, (long long)n_tok, o.rank, "surer");
    for (int64_t i = 0; i < n_tok; ++i) easy[i] = p1[i] > med;
    n_easy = std::count(easy.begin(), easy.end(), true);
    if (n_easy < o.rank + 2 || n_tok - n_easy < o.rank + 2)
      throw Error("router: " + std::to_string(n_easy) + " easy and " +
                  std::to_string(n_tok - n_easy) + " hard tokens; each needs more than the rank (" +
                  std::to_string(o.rank) + "); give more text");
  }
  Turbo turbo;
  Router& r = turbo.router;
  r.dim = H;
  std::vector<bool> hard(easy.size());
  for (size_t i = 0; i < easy.size(); ++i) hard[i] = !easy[i];
  topology(states, H, easy, o.rank, *pool, &r.easy_mean, &r.easy_basis);
  topology(states, H, hard, o.rank, *pool, &r.hard_mean, &r.hard_basis);
  r.rank_easy = static_cast<int64_t>(r.easy_basis.size()) / H;
  r.rank_hard = static_cast<int64_t>(r.hard_basis.size()) / H;
  std::vector<double> score(n_tok);
  for (int64_t i = 0; i < n_tok; ++i) score[i] = r.score(states.data() + i * H);
  // Tokens by a falling key: the first k leave after one pass at a bias of the k-th key.
  auto falling = [&](const std::vector<double>& key) {
    std::vector<int64_t> ord(n_tok);
    std::iota(ord.begin(), ord.end(), int64_t{0});
    std::sort(ord.begin(), ord.end(), [&](int64_t a, int64_t b) { return key[a] > key[b]; });
    return ord;
  };
  // The most tokens out, in that order, whose summed NLL rise keeps the text's perplexity
  // within max_cost percent: exp(sum dnll / n) - 1 <= max_cost / 100.
  const double budget = std::log1p(o.max_cost / 100.0) * double(n_tok);
  auto within_budget = [&](const std::vector<int64_t>& ord) {
    double cum = 0;
    int64_t kk = 0;
    for (int64_t j = 0; j < n_tok; ++j) {
      cum += dnll[ord[j]];
      if (cum <= budget) kk = j + 1;
    }
    return kk;
  };
  const std::vector<int64_t> order = falling(score);
  const int64_t k = o.exit_share >= 0
                        ? std::clamp<int64_t>(static_cast<int64_t>(std::llround(o.exit_share * n_tok)), 0, n_tok)
                        : within_budget(order);
  {
    // What other orderings would let out within the same budget: the conf gate's signal
    // (the first read-out's top probability); the true KL to all passes (known only after
    // them), the bound for a gate that does not know the next token: the NLL rise's
    // expectation over the next token is that KL when the all-pass model is calibrated; and
    // the NLL rise itself in rising order, an oracle that knows the next token (with a budget
    // on the sum, the smallest rises first let out the most; it counts the tokens the second
    // pass happened to make worse).
    auto share_by = [&](const std::vector<double>& key) {
      return 100.0 * double(within_budget(falling(key))) / double(n_tok);
    };
    std::vector<double> by_p1(n_tok), by_kl(n_tok), by_dn(n_tok);
    double all = 0;
    for (int64_t i = 0; i < n_tok; ++i) by_p1[i] = p1[i], by_kl[i] = -kl[i], by_dn[i] = -dnll[i], all += dnll[i];
    std::fprintf(stderr,
                 "router: every token out after one pass would cost %+.2f%% perplexity; within "
                 "%.2f%%: %.1f%% out by the router, %.1f%% by the first read-out's confidence "
                 "(conf gate), %.1f%% by the true KL (a bound), %.1f%% by the NLL rise itself "
                 "(an oracle that knows the next token)\n",
                 100.0 * std::expm1(all / double(n_tok)), o.max_cost, share_by(score),
                 share_by(by_p1), share_by(by_kl), share_by(by_dn));
  }
  // A bias just above the next token's score keeps ties with it from leaving too.
  r.bias = k == 0 ? score[order[0]] + 1e-6 : score[order[k - 1]];
  int64_t out_easy = 0, out = 0;
  double cost = 0;
  for (int64_t i = 0; i < n_tok; ++i)
    if (score[i] >= r.bias) ++out, out_easy += easy[i], cost += dnll[i];
  std::fprintf(stderr,
               "router: %lld easy / %lld hard tokens, rank %lld; bias %.4f lets %.1f%% out after "
               "one pass (%.1f%% of them easy) at a perplexity cost of %+.2f%% on this text\n",
               (long long)n_easy, (long long)(n_tok - n_easy), (long long)r.rank_easy, r.bias,
               100.0 * out / n_tok, 100.0 * out_easy / std::max<int64_t>(out, 1),
               100.0 * std::expm1(cost / double(n_tok)));

  // 2. The exact-row weights, from prompts with a planted fact.
  const std::string intro =
      "There is an important piece of information hidden inside a lot of irrelevant text. Find it "
      "and memorize it.\n";
  const std::vector<int32_t> intro_ids = m.tok->encode(intro, true);
  const std::vector<int32_t> q_ids = enc(*m.tok, "What is the pass key? The pass key is");
  const int64_t nf = full_layer_count(c), nk = c.n_kv_head, dfe = 2 * nk;
  std::vector<std::vector<double>> X(nf);
  std::vector<std::vector<uint8_t>> Y(nf);
  std::mt19937 rng(o.seed);
  SessionOptions eo = base;
  eo.o1 = o1;
  eo.exact = ExactParams{};
  eo.exact->on = true;
  eo.exact->budget = 1;
  eo.exact->weights.assign(nf * dfe, 1.0f);  // only so that the rows wait; nothing is chosen here
  std::vector<int> full_index(c.n_layer, -1);
  for (int64_t l = 0, i = 0; l < c.n_layer; ++l)
    if (c.pattern[l] == '*') full_index[l] = static_cast<int>(i++);
  std::fprintf(stderr, "exact rows: %d prompts of %lld tokens with a planted pass key, o1 %s\n",
               o.prompts, (long long)o.prompt_length, o1.str().c_str());
  for (int p = 0; p < o.prompts; ++p) {
    std::string key;
    for (int i = 0; i < 5; ++i) key += static_cast<char>('0' + rng() % 10);
    const auto pre = enc(*m.tok, "The pass key is "), kk = enc(*m.tok, key),
               mid = enc(*m.tok, ". Remember it. "), post = enc(*m.tok, " is the pass key.\n");
    std::vector<int32_t> needle;
    std::vector<int64_t> fact;  // offsets of the key's tokens within the needle
    auto add = [&](const std::vector<int32_t>& v, bool is_fact) {
      for (int32_t id : v) {
        if (is_fact) fact.push_back(static_cast<int64_t>(needle.size()));
        needle.push_back(id);
      }
    };
    add(pre, false), add(kk, true), add(mid, false), add(kk, true), add(post, false);
    const int64_t fill =
        o.prompt_length - static_cast<int64_t>(intro_ids.size() + needle.size() + q_ids.size());
    const int64_t start = static_cast<int64_t>(rng() % (ids.size() - fill));
    // The key somewhere past the seal's first window and before the last window.
    const int64_t lo = o1.sink + 32,
                  hi = o.prompt_length - o1.w - static_cast<int64_t>(needle.size()) - 64;
    const int64_t at = lo + static_cast<int64_t>(rng() % std::max<int64_t>(1, hi - lo)) -
                       static_cast<int64_t>(intro_ids.size());
    std::vector<int32_t> prompt(intro_ids);
    prompt.insert(prompt.end(), ids.begin() + start, ids.begin() + start + at);
    const int64_t needle_at = static_cast<int64_t>(prompt.size());
    prompt.insert(prompt.end(), needle.begin(), needle.end());
    prompt.insert(prompt.end(), ids.begin() + start + at, ids.begin() + start + fill);
    prompt.insert(prompt.end(), q_ids.begin(), q_ids.end());
    Session s(pool, eo);
    s.forward(prompt, Logits::None);
    for (const SlotFeatures& f : s.exact_features()) {
      const int li = full_index[f.layer];
      if (li < 0) continue;
      for (int64_t j = f.lo; j < f.hi; ++j) {
        bool y = false;
        for (int64_t x : fact) y |= j == needle_at + x;
        X[li].insert(X[li].end(), f.f.begin() + (j - f.lo) * dfe,
                     f.f.begin() + (j - f.lo + 1) * dfe);
        Y[li].push_back(y);
      }
    }
    std::fprintf(stderr, "\r  %d/%d prompts, %.1f s", p + 1, o.prompts, since(t0));
  }
  std::fputc('\n', stderr);
  turbo.exact_weights.assign(nf * dfe, 0.0f);
  for (int64_t li = 0; li < nf; ++li) {
    if (Y[li].empty())
      throw Error("exact rows: no far rows were seen (is the prompt longer than the seal?)");
    const std::vector<float> w = logistic(X[li], Y[li], dfe);
    std::copy(w.begin(), w.end(), turbo.exact_weights.begin() + li * dfe);
    // How the fact's rows rank under the fitted score, against the mean rank.
    double rank_sum = 0;
    int64_t np = 0;
    std::vector<double> sc(Y[li].size());
    for (size_t i = 0; i < Y[li].size(); ++i)
      for (int64_t k2 = 0; k2 < dfe; ++k2) sc[i] += w[k2] * X[li][i * dfe + k2];
    const std::vector<double> rs = rank_shares(sc);
    for (size_t i = 0; i < Y[li].size(); ++i)
      if (Y[li][i]) rank_sum += rs[i], ++np;
    std::fprintf(stderr,
                 "  full layer %lld: the fact's rows rank at %.2f on average (0.50 = chance) over "
                 "%zu rows\n",
                 (long long)li, np ? rank_sum / np : 0.0, Y[li].size());
  }
  turbo.o1 = o1;
  turbo.exact_budget = o.budget;
  turbo.present = true;

  // 3. The model with its turbo keys and tensors.
  ConvertOpts co;
  co.in = o.run.model_path();
  co.out = o.out;
  co.keep_types = true;
  co.turbo = &turbo;
  co.threads = o.run.threads;
  co.quiet = true;
  convert_to_gguf(co, false);
  std::fprintf(
      stderr,
      "wrote %s: exit bias %.4f, o1 %s, exact budget %lld, router rank %lld/%lld (%.1f s)\n",
      o.out.c_str(), r.bias, o1.str().c_str(), (long long)o.budget, (long long)r.rank_easy,
      (long long)r.rank_hard, since(t0));
  if (!o.raw.empty()) {
    const std::string rf = o.raw + ".router.f32", ef = o.raw + ".exact.f32";
    write_raw_router(rf, r);
    write_raw_exact(ef, turbo.exact_weights, c);
    std::fprintf(stderr, "wrote %s and %s: on the plain model, --gate recon:%s:%.9g --exact %s:%lld\n",
                 rf.c_str(), ef.c_str(), rf.c_str(), r.bias, ef.c_str(), (long long)o.budget);
  }
  return 0;
}

}  // namespace

Runner add_calibrate(CLI::App& app) {
  auto* cmd = app.add_subcommand("calibrate",
                                 "fit a turbo model file (recon router, exit bias, far field and "
                                 "exact-row defaults) from the model's own "
                                 "activations on a text");
  auto o = std::make_shared<CalibrateOpts>();
  cmd->add_option("-m,--model", o->run.model, kModelHelp);
  add_hf_opt(cmd, o->run);
  cmd->add_option("-t,--threads", o->run.threads, "threads (default: all cores)")
      ->check(CLI::Range(1, 1024));
  add_device_opt(cmd, o->run);
  cmd->add_option("--loops", o->run.loops, "recurrent passes (default: the model's; at least 2)")
      ->check(CLI::Range(2, 16));
  cmd->add_option("-f,--file", o->text, "calibration text (plain UTF-8)")->required();
  cmd->add_option("-o,--output", o->out, "output .gguf: the model with its turbo keys and tensors")
      ->required();
  cmd->add_option("--tokenizer", o->tokenizer,
                  "tokenizer.json or its directory (default: the model's)");
  cmd->add_option("--raw", o->raw,
                  "also write PREFIX.router.f32 and PREFIX.exact.f32, the router and exact-row "
                  "weights as raw f32 side files (cortiq's layout; for --gate recon:FILE:BIAS and "
                  "--exact FILE:ROWS on the plain model)");
  cmd->add_option("--tokens", o->tokens, "tokens of the text for the router")
      ->check(CLI::Range(int64_t(256), int64_t(1) << 24))
      ->capture_default_str();
  cmd->add_option("--rank", o->rank, "rank of each router topology's basis")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--easy-share", o->easy_share,
                  "share of the calibration tokens, closest to all passes after one (lowest KL) "
                  "first, that the router's easy topology is fitted on; the rest are hard")
      ->check(CLI::Range(0.01, 0.99))
      ->capture_default_str();
  cmd->add_option("--max-cost", o->max_cost,
                  "perplexity cost in percent the exit bias may spend on the calibration text: "
                  "the bias lets out the most tokens within it")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  cmd->add_option("--exit-share", o->exit_share,
                  "one-pass share the exit bias aims at instead of --max-cost")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--o1", o->o1, "far field defaults m,w,sink,seal for the file (and the fit)")
      ->capture_default_str();
  cmd->add_option("--exact-budget", o->budget, "exact rows per full-attention slot for the file")
      ->check(CLI::Range(int64_t(1), int64_t(8192)))
      ->capture_default_str();
  cmd->add_option("--prompts", o->prompts, "planted-fact prompts for the exact-row weights")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  cmd->add_option("--prompt-length", o->prompt_length, "tokens per planted-fact prompt")
      ->check(CLI::Range(int64_t(256), int64_t(1) << 20))
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the prompts' keys and places")->capture_default_str();
  return [o] { return run_calibrate(*o); };
}

static const bool registered = register_command(78, add_calibrate);

}  // namespace dory::cli
