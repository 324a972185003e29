// dory verify -m FILE.cmf: checks every hash a CMF file records (header, directory, the
// header's section hashes, each tensor's payload), with a progress line for large files.
#include <chrono>
#include <cstdio>

#include "commands.h"
#include "common.h"
#include "format/cmf.h"

namespace dory::cli {

namespace {
int run_verify(const std::string& path) {
  if (!cmf::is_cmf_name(path))
    throw Error(path +
                ": dory verify checks CMF files (.cmf), whose hashes it reads; GGUF and "
                "safetensors record none");
  // Every shard of a sharded model.
  cmf::File::VerifyResult r;
  size_t tensors = 0;
  uint64_t bytes = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const std::string& sp : cmf::shard_paths(path)) {
    auto f = cmf::File::open(sp);
    ProgressLine progress("verify", "MiB");
    const cmf::File::VerifyResult one = f->verify([&](uint64_t done, uint64_t total) {
      // In MiB, so the line reads as bytes rather than tokens.
      progress.update(static_cast<int64_t>(done >> 20), static_cast<int64_t>(total >> 20));
    });
    progress.done();
    for (const std::string& p : one.problems) r.problems.push_back(sp + ": " + p);
    r.checked += one.checked, r.unrecorded += one.unrecorded;
    tensors += f->tensors().size(), bytes += f->size();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const std::string& p : r.problems) std::printf("MISMATCH %s\n", p.c_str());
  std::printf(
      "%s: %d hashes checked, %zu mismatched, %d not recorded (%zu tensors, %s in %.2f s)\n",
      path.c_str(), r.checked, r.problems.size(), r.unrecorded, tensors, human_bytes(bytes).c_str(),
      s);
  if (!r.problems.empty())
    throw Error(path + ": " + std::to_string(r.problems.size()) +
                " hash mismatches (listed above)");
  return 0;
}
}  // namespace

Runner add_verify(CLI::App& app) {
  auto* cmd = app.add_subcommand("verify", "check every hash a CMF model file records");
  auto path = std::make_shared<std::string>();
  cmd->add_option("-m,--model,file", *path, "the .cmf file")->required();
  return [path] { return run_verify(*path); };
}

static const bool registered = register_command(15, add_verify);

}  // namespace dory::cli
