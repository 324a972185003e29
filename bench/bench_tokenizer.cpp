// Tokenizer speed: encode MB/s on one core for English prose and code, and decode.
//   build/bench/bench_tokenizer [--benchmark_filter=Encode]
// Text: the licenses under /usr/share/common-licenses (on every Debian) and the prose and
// code strings of the golden files, so it runs without any download.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "text/tokenizer.h"

namespace {

namespace fs = std::filesystem;
const std::string kData = std::string(DORY_SOURCE_DIR) + "/tests/data/tokenizers/";

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// About 1 MB of English: the licenses, then golden-file prose until the size is reached.
const std::string& english() {
  static const std::string text = [] {
    std::string t;
    std::error_code ec;
    for (const char* name : {"GPL-3", "LGPL-3", "Apache-2.0", "MPL-2.0", "GFDL-1.3", "Artistic",
                             "GPL-2", "LGPL-2.1", "CC0-1.0", "BSD"}) {
      fs::path p = fs::path("/usr/share/common-licenses") / name;
      if (fs::exists(p, ec)) t += slurp(p);
    }
    const std::string g = slurp(kData + "gpt2/golden.jsonl");
    size_t pos = 0;
    while (t.size() < (1 << 20) && pos < g.size()) {
      // The first 950 golden lines are prose and code; take their "text" values raw.
      const size_t a = g.find("{\"text\": \"", pos);
      if (a == std::string::npos) break;
      const size_t b = g.find("\", \"ids\"", a);
      std::string s = g.substr(a + 10, b - a - 10);
      for (size_t k = 0; (k = s.find("\\n", k)) != std::string::npos;) s.replace(k, 2, "\n");
      t += s;
      t += '\n';
      pos = b;
    }
    return t;
  }();
  return text;
}

const dory::Tokenizer& load(const std::string& name) {
  static std::map<std::string, std::unique_ptr<dory::Tokenizer>> cache;
  auto& t = cache[name];
  if (!t) t = dory::Tokenizer::from_path(kData + name);
  return *t;
}

void Encode(benchmark::State& state, const char* name) {
  const auto& tok = load(name);
  const std::string& text = english();
  size_t n = 0;
  for (auto _ : state) {
    auto ids = tok.encode(text, false);
    n = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(text.size()));
  state.counters["tokens"] = static_cast<double>(n);
  state.counters["bytes"] = static_cast<double>(text.size());
}

void Decode(benchmark::State& state, const char* name) {
  const auto& tok = load(name);
  const auto ids = tok.encode(english(), false);
  for (auto _ : state) {
    auto s = tok.decode(ids);
    benchmark::DoNotOptimize(s.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(english().size()));
}

void Load(benchmark::State& state, const char* name) {
  for (auto _ : state) {
    auto t = dory::Tokenizer::from_path(kData + name);
    benchmark::DoNotOptimize(t.get());
  }
}

}  // namespace

BENCHMARK_CAPTURE(Encode, gpt2, "gpt2")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Encode, llama3_131k, "llama3-131k")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Encode, sp_bpe, "sp-bpe")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Encode, sp_metaspace, "sp-metaspace")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Decode, llama3_131k, "llama3-131k")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Load, llama3_131k, "llama3-131k")->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
