// Fuzzes the safetensors reader (header length, JSON header, dtypes, shapes, data offsets)
// and, for inputs whose header parses, the checkpoint loader's checks of those tensors
// against a config (presence, shapes, then folding the scale vectors, which reads data).
//
// The header is parsed in memory (SafeTensorsFile's buffer constructor: the same parse as
// the mapped file). The loader itself takes a directory (config.json, an optional shard
// index, the shards), so rather than add a second entry point to it the harness writes the
// input as model.safetensors into a private temp directory beside a fixed config.json and
// loads that: the exact code path `dory` runs, at the cost of one file write per input that
// got past the header (most mutants do not).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "format/safetensors.h"
#include "fuzz_common.h"
#include "model/weights.h"

namespace {

// fuzz/corpus/safetensors/micro.safetensors is this model's weights (make_seeds.py).
constexpr const char* kConfig = R"({
  "architectures": ["DoryForCausalLM"], "model_type": "dory",
  "hidden_size": 8, "intermediate_size": 8, "num_attention_heads": 2,
  "num_key_value_heads": 1, "attention_head_dim": 4, "vocab_size": 16,
  "num_hidden_layers": 3, "hybrid_layer_pattern": "S*-", "n_input_layers": 1,
  "n_recurrent_layers": 1, "n_output_layers": 1, "n_recurrent_loops": 2,
  "recurrent_kv_cache_mode": "per_loop", "swa_window_size": 2, "rope_theta": 10000.0,
  "rope_theta_2": 500000.0, "init_method_std": 0.02, "ngpt_alpha_init": 0.05,
  "attention_output_gate_logit_scale_init": null, "max_position_embeddings": 16,
  "rope_profile_layers": [1, 2, 1]
})";

std::string g_dir;

void cleanup() {
  if (g_dir.empty()) return;
  std::remove((g_dir + "/model.safetensors").c_str());
  std::remove((g_dir + "/config.json").c_str());
  ::rmdir(g_dir.c_str());
}

bool write_file(const std::string& path, const void* data, size_t n) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = std::fwrite(data, 1, n, f) == n;
  return std::fclose(f) == 0 && ok;
}

const std::string& model_dir() {
  if (g_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string tpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/dory_fuzz_st_XXXXXX";
    if (!::mkdtemp(tpl.data())) std::abort();
    g_dir = tpl;
    std::atexit(cleanup);
    const std::string cfg = kConfig;
    if (!write_file(g_dir + "/config.json", cfg.data(), cfg.size())) std::abort();
  }
  return g_dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  bool parsed = false;
  dory::fuzz::expect_ok_or_error([&] {
    dory::SafeTensorsFile f(data, size, "fuzz.safetensors");
    // Every view must lie inside the buffer: reading each one lets ASan check it.
    for (const auto& [name, t] : f.tensors())
      if (t.numel() <= (1 << 16)) (void)t.to_f32();
    parsed = true;
  });
  if (!parsed) return 0;
  const std::string& dir = model_dir();
  if (!write_file(dir + "/model.safetensors", data, size)) std::abort();
  dory::fuzz::expect_ok_or_error([&] {
    std::string resolved;
    auto w = dory::load_hf_weights(dir, &resolved);
    (void)w;
  });
  return 0;
}
