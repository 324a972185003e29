// Models from the Hugging Face Hub: `dory pull REPO[:QUANT]` and `-hf REPO[:QUANT]`.
// Lists the repository through the Hub's HTTP API, picks the files (GGUF by quant tag, or
// config.json + tokenizer files + the safetensors shards), downloads what the cache lacks
// with a progress line, resuming partial files with HTTP Range, checks each file's size and
// hash (the SHA-256 the Hub reports for LFS files, the git blob SHA-1 for the others), and
// keeps them in the Hugging Face cache layout, shared with huggingface_hub and transformers:
//   $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub
//   models--ORG--NAME/{blobs/HASH, snapshots/COMMIT/FILE -> ../../blobs/HASH, refs/main}
// HF_TOKEN (gated or private repositories), HF_ENDPOINT (mirrors), HF_HUB_OFFLINE=1 (the
// cache only). HTTP(S) through Debian's cpp-httplib (the server's library, built with
// OpenSSL), hashes through OpenSSL's libcrypto.
#pragma once
#include <string>
#include <vector>

namespace dory::cli {

struct HubOptions {
  std::string endpoint;  // https://huggingface.co, or $HF_ENDPOINT
  std::string token;     // $HF_TOKEN ("" = none)
  std::string cache;     // the hub cache directory
  bool offline = false;  // $HF_HUB_OFFLINE
  bool quiet = false;    // no progress lines
  static HubOptions from_env();
};

struct PullResult {
  std::string path;                // the GGUF file (its first shard) or the snapshot directory
  std::vector<std::string> files;  // what the snapshot holds for it
  int downloaded = 0;              // files fetched now (0: all from the cache)
};

// REPO[:QUANT] ("org/name", "org/name:Q5_K_M"): the local path of the model, fetched into
// the cache as needed. Throws Error (one line) on anything that goes wrong.
PullResult hub_pull(const std::string& spec, const HubOptions& o);

}  // namespace dory::cli
