// dory pull REPO[:QUANT]: a model from the Hugging Face Hub into its cache (tools/hub.h), the
// same files -hf REPO[:QUANT] fetches on any model command. Prints the local path.
#include <cstdio>

#include "commands.h"
#include "common.h"
#include "hub.h"

namespace dory::cli {

namespace {
struct PullOpts {
  std::string spec;
  bool quiet = false;
};

Runner add_pull(CLI::App& app) {
  auto o = std::make_shared<PullOpts>();
  auto* cmd = app.add_subcommand(
      "pull",
      "fetch a model from the Hugging Face Hub into its cache: ORG/NAME:QUANT picks a GGUF file by "
      "its quant tag (default Q4_K_M where there are several), ORG/NAME alone a safetensors model "
      "(config.json, tokenizer, shards). HF_TOKEN, HF_ENDPOINT, HF_HOME / HF_HUB_CACHE and "
      "HF_HUB_OFFLINE=1 are honoured; partial downloads resume");
  cmd->add_option("repo", o->spec,
                  "ORG/NAME[:QUANT], e.g. nvidia/NVIDIA-Nemotron-Labs-Dory1.0-4B-GGUF:Q5_K_M")
      ->required();
  cmd->add_flag("-q,--quiet", o->quiet, "no progress lines");
  return [o] {
    HubOptions h = HubOptions::from_env();
    h.quiet = o->quiet;
    const PullResult r = hub_pull(o->spec, h);
    std::fprintf(stderr, "%s: %zu file%s, %d downloaded, %zu from the cache\n", o->spec.c_str(),
                 r.files.size(), r.files.size() == 1 ? "" : "s", r.downloaded,
                 r.files.size() - r.downloaded);
    std::printf("%s\n", r.path.c_str());
    return 0;
  };
}

const bool registered = register_command(15, add_pull);
}  // namespace

}  // namespace dory::cli
