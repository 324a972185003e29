#include "common.h"

#include <cstdio>

#include "runtime/pool.h"

namespace dory::cli {

void add_run_opts(CLI::App* app, RunOpts& o) {
  app->add_option("-m,--model", o.model,
                  "model: a Hugging Face directory (config.json + safetensors)")
      ->required();
  app->add_option("-t,--threads", o.threads, "threads (default: all cores)")
      ->check(CLI::Range(1, 1024));
  app->add_option("--loops", o.loops, "recurrent passes per token, 1..16 (default: the model's)")
      ->check(CLI::Range(1, 16));
  app->add_option("--kv", o.kv, "recurrent KV cache mode (default: the model's)")
      ->check(CLI::IsMember({"per_loop", "last_loop"}));
  app->add_option("--chunk", o.chunk, "prompt rows per batched forward")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
}

SessionOptions RunOpts::session() const {
  SessionOptions s;
  s.loops = loops;
  if (!kv.empty()) s.kv = parse_kv_mode(kv);
  s.chunk = chunk;
  return s;
}

int RunOpts::n_threads() const { return threads > 0 ? threads : ThreadPool::default_threads(); }

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

std::string human_bytes(uint64_t b) {
  char buf[64];
  if (b >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1ull << 30));
  else if (b >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(1ull << 20));
  else if (b >= 1024) std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

}  // namespace dory::cli
