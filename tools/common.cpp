#include "common.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "backend/backend.h"
#include "dory/error.h"
#include "hub.h"

namespace dory::cli {

const char* const kModelHelp =
    "model: a Hugging Face directory (config.json + safetensors) or a .gguf file "
    "(default: the built-in models/dory-mini)";

std::string default_model_path() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("DORY_MODEL"); env && *env) return env;
  std::vector<fs::path> tried;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    tried.push_back(exe.parent_path() / ".." / "models" / "dory-mini");
    tried.push_back(exe.parent_path() / ".." / "share" / "dory" / "models" / "dory-mini");
  }
#ifdef DORY_SOURCE_DIR
  tried.push_back(fs::path(DORY_SOURCE_DIR) / "models" / "dory-mini");
#endif
  for (const fs::path& p : tried)
    if (fs::exists(p / "config.json", ec)) return fs::weakly_canonical(p, ec).string();
  std::string where;
  for (const fs::path& p : tried)
    where += (where.empty() ? "" : ", ") + p.lexically_normal().string();
  throw Error("no -m given and the built-in model is not at " + where +
              " (give -m MODEL or set DORY_MODEL)");
}

std::string RunOpts::model_path() const {
  if (!hf.empty()) {
    if (!model.empty()) throw Error("give -m or -hf, not both");
    if (hf_path_.empty()) hf_path_ = hub_pull(hf, HubOptions::from_env()).path;
    return hf_path_;
  }
  return model.empty() ? default_model_path() : model;
}

void add_hf_opt(CLI::App* app, RunOpts& o) {
  app->add_option(
      "--hf", o.hf,
      "(also -hf) a model from the Hugging Face Hub, ORG/NAME[:QUANT], fetched into its cache as "
      "dory pull does (instead of -m)");
}

void add_run_opts(CLI::App* app, RunOpts& o) {
  app->add_option("-m,--model", o.model, kModelHelp);
  add_hf_opt(app, o);
  app->add_option("-t,--threads", o.threads, "threads (default: all cores)")
      ->check(CLI::Range(1, 1024));
  app->add_option("--loops", o.loops, "recurrent passes per token, 1..16 (default: the model's)")
      ->check(CLI::Range(1, 16));
  app->add_option("--kv", o.kv,
                  "recurrent KV cache mode (default: the model's; last_loop on a turbo model file)")
      ->check(CLI::IsMember({"per_loop", "last_loop"}));
  app->add_option("--chunk", o.chunk,
                  "prompt rows per batched forward, 1..4096 (default: 64 on the CPU, 512 on the "
                  "GPU)")
      ->check(CLI::Range(1, 4096));
  app->add_option(
         "--prompt-loops", o.prompt_loops,
         "last_loop: passes for prompt chunks whose logits nobody reads, 0 = all of --loops "
         "(default: 1 on a turbo model file, else 0)")
      ->check(CLI::Range(0, 16));
  app->add_option("--gate", o.gate,
                  "early exit after one pass (last_loop): conf:THETA | recon[:BIAS] | recon:FILE[:BIAS] "
                  "(the router of a dory calibrate file, or a raw f32 router file) | auto | off "
                  "(default: recon on a turbo model file, else off)");
  app->add_option(
      "--o1", o.o1,
      "O(1) far field for the full-attention layers: m,w,sink,seal (e.g. 32,128,4,1024) | off "
      "(default: the model file's, else off)");
  app->add_option("--o1-rectify", o.rectify,
                  "far field rectifier: aggregate (drop a negative far part) or clamp (clamp its "
                  "weights at 0)")
      ->check(CLI::IsMember({"aggregate", "clamp"}));
  app->add_option(
      "--exact", o.exact,
      "rows kept exact past the far field's seal, chosen at a prompt's end: ROWS (the model file's "
      "weights) | FILE:ROWS (weights from a dory calibrate file, or cortiq's raw f32 weight file) | off (default: the model "
      "file's)");
  app->add_option("--spill", o.spill,
                  "with --exact: keep the rows that wait for the choice in files under this "
                  "directory, not in RAM");
  add_device_opt(app, o);
  app->add_option(
      "--lora", o.lora,
      "a LoRA adapter: PEFT's (its directory, or adapter_model.safetensors with "
      "adapter_config.json beside it) or llama.cpp's GGUF adapter file, optionally :SCALE; "
      "applied at run time, the base weights untouched (repeatable)");
  app->add_option(
      "--skill", o.skill,
      "CMF files: run with this skill's tensors in place of the backbone's: ID, none, or auto (run, "
      "chat, logits: the file's routers pick one from the prompt's hidden states; serve: for each "
      "request that names none); dory info lists the file's skills");
  app->add_flag("--skill-dynamic", o.skill_dynamic,
                "CMF files (dory run, chat, serve; gate off): the skill follows the generated "
                "text, re-routed every 8 tokens from the hidden states (cortiq's --route-dynamic; "
                "skills of MLP tensors only; serve: the default of a request, which may say "
                "\"skill\": \"dynamic\"; docs/cmf.md)");
  auto* mm =
      app->add_flag("--mmap", o.mmap,
                    "use the weights in place from the memory-mapped model file (the default): "
                    "nothing is read at load");
  app->add_flag("--no-mmap", o.no_mmap,
                "read the weights into memory on huge pages at load: decode streams them ~5% "
                "faster, loading "
                "takes a while (0.3-2 s per GiB)")
      ->excludes(mm);
}

BackendOptions RunOpts::backend_options() const {
  BackendOptions b;
  b.device = parse_device(device);
  b.threads = n_threads();
  return b;
}

std::shared_ptr<Backend> RunOpts::open(std::shared_ptr<const Model> model) const {
  return open_backend(std::move(model), backend_options());
}

std::string backend_text(const Session& s) {
  return s.backend().describe();
}

void parallel_ranges(Backend& be, int64_t n, int64_t grain,
                     const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int64_t step = std::max<int64_t>(std::max<int64_t>(1, grain),
                                         (n + be.host_threads() * 4 - 1) / (be.host_threads() * 4));
  be.host_parallel((n + step - 1) / step,
                   [&](int64_t k) { fn(k * step, std::min(n, (k + 1) * step)); });
}

void add_device_opt(CLI::App* app, RunOpts& o) {
  app->add_option(
         "--device", o.device,
         "where the model runs: cpu, cuda (an NVIDIA GPU, in a build with CUDA) or auto (the GPU "
         "when this build has one and a device is present, else the CPU)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
}

WeightPlacement RunOpts::placement() const {
  return no_mmap ? WeightPlacement::Memory : WeightPlacement::Mapped;
}

SessionOptions RunOpts::session() const {
  SessionOptions s;
  s.loops = loops;
  if (!kv.empty()) s.kv = parse_kv_mode(kv);
  s.chunk = chunk;
  if (prompt_loops >= 0) s.prompt_loops = prompt_loops;
  if (!gate.empty()) s.gate = parse_gate(gate);
  if (!o1.empty()) s.o1 = parse_o1(o1);
  if (!exact.empty()) s.exact = parse_exact(exact);
  s.spill_dir = spill;
  if (!rectify.empty()) {
    if (!s.o1) throw Error("--o1-rectify needs --o1 m,w,sink,seal");
    s.o1->clamp = rectify == "clamp";
  }
  return s;
}

std::string gate_summary(const Session& s) {
  if (s.gate().kind == GateParams::Kind::Off) return "";
  const GateStats g = s.gate_stats();
  char buf[256];
  std::snprintf(buf, sizeof buf, "gate %s: %lld tokens gated, %.1f%% left after one pass",
                s.gate().str().c_str(), (long long)g.gated, 100.0 * g.one_pass_share());
  std::string out = buf;
  if (s.gate().kind == GateParams::Kind::Conf) {
    std::snprintf(buf, sizeof buf, " (read-outs %lld, probes %lld)", (long long)g.readouts,
                  (long long)g.probes);
    out += buf;
  }
  return out;
}

int RunOpts::n_threads() const {
  return threads > 0 ? threads : default_host_threads();
}

void add_gen_opts(CLI::App* app, GenOpts& o) {
  SamplingParams& p = o.sp;
  app->add_option("-n,--n-predict", o.n_predict,
                  "tokens to generate (-1 = until end of text or context)")
      ->check(CLI::Range(-1, 1 << 24))
      ->capture_default_str();
  app->add_option("--temp", p.temperature, "temperature (0 = greedy)")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  app->add_option("--top-k", p.top_k, "top-k sampling (0 = off)")
      ->check(CLI::Range(0, 1 << 24))
      ->capture_default_str();
  app->add_option("--top-p", p.top_p, "top-p sampling (1.0 = off)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app->add_option("--min-p", p.min_p, "min-p sampling (0.0 = off)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app->add_option("--repeat-penalty", p.repeat_penalty, "penalize repeated tokens (1.0 = off)")
      ->check(CLI::Range(0.01, 100.0))
      ->capture_default_str();
  app->add_option("--repeat-last-n", p.repeat_last_n, "tokens the penalties look back (-1 = all)")
      ->check(CLI::Range(-1, 1 << 24))
      ->capture_default_str();
  app->add_option("--presence-penalty", p.presence_penalty, "presence penalty (0.0 = off)")
      ->check(CLI::Range(-100.0, 100.0))
      ->capture_default_str();
  app->add_option("--frequency-penalty", p.frequency_penalty, "frequency penalty (0.0 = off)")
      ->check(CLI::Range(-100.0, 100.0))
      ->capture_default_str();
  app->add_option("-s,--seed", p.seed, "random seed (default: a random one)");
  app->add_option("--stop", o.stop, "stop when this string is generated (repeatable)");
  app->add_flag("--ignore-eos", o.ignore_eos, "keep generating past the end-of-text token");
  app->add_option("--tokenizer", o.tokenizer,
                  "tokenizer.json or its directory (default: the model directory's)");
}

GenerateParams GenOpts::params() const {
  GenerateParams g;
  g.max_tokens = n_predict;
  g.stop = stop;
  g.ignore_eos = ignore_eos;
  return g;
}

ProgressLine::ProgressLine(const char* what, const char* unit)
    : what_(what), unit_(unit), t0_(std::chrono::steady_clock::now()) {}

void ProgressLine::update(int64_t done, int64_t total) {
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  if (t < 1.0 || (shown_ && t - last_ < 0.25 && done < total)) return;
  shown_ = true;
  last_ = t;
  std::fprintf(stderr, "\r%s: %lld/%lld %s (%.0f%%), %.1f s", what_, (long long)done,
               (long long)total, unit_, 100.0 * done / std::max<int64_t>(1, total), t);
  std::fflush(stderr);
}

void ProgressLine::done() {
  if (shown_) std::fputc('\n', stderr);
  shown_ = false;
}

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t p = 0;
  while (p <= s.size()) {
    size_t q = s.find(',', p);
    if (q == std::string::npos) q = s.size();
    std::string tok = s.substr(p, q - p);
    while (!tok.empty() && tok.front() == ' ') tok.erase(tok.begin());
    while (!tok.empty() && tok.back() == ' ') tok.pop_back();
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(tok, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (tok.empty() || used != tok.size() || v < INT32_MIN || v > INT32_MAX)
      throw Error("--ids: '" + tok + "' is not a token id (expected e.g. --ids 1,2,3)");
    ids.push_back(static_cast<int32_t>(v));
    p = q + 1;
  }
  return ids;
}

std::optional<uint64_t> proc_bytes(const char* file, const std::string& key) {
  std::ifstream f(file);
  const std::string head = key + ":";
  for (std::string line; std::getline(f, line);)
    if (line.rfind(head, 0) == 0)
      return std::strtoull(line.c_str() + head.size(), nullptr, 10) * 1024;
  return std::nullopt;
}

std::string weights_placement_text(const Model& m) {
  if (!m.weights_in_memory()) return "mapped from the file";
  const auto huge = proc_bytes("/proc/self/smaps_rollup", "AnonHugePages");
  return huge ? "in memory, " + human_bytes(*huge) + " on huge pages" : "in memory";
}

std::string human_bytes(uint64_t b) {
  char buf[64];
  if (b >= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1ull << 30));
  else if (b >= (1ull << 20))
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(1ull << 20));
  else if (b >= 1024)
    std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

}  // namespace dory::cli
