#pragma once
#include <CLI/CLI.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "dory/backend.h"
#include "dory/generate.h"
#include "dory/model.h"
#include "dory/session.h"
#include "runtime/sampler.h"

namespace dory::cli {

// Options every model-running subcommand shares.
struct RunOpts {
  std::string model;  // "" = the built-in model (default_model_path())
  std::string hf;     // -hf ORG/NAME[:QUANT]: fetched through tools/hub.h
  int threads = 0;    // 0 = all cores
  int loops = 0;      // 0 = the model's
  std::string kv;     // "" = the model's
  int chunk = 0;  // 0 = the backend's (Backend::default_chunk)
  int prompt_loops = -1;               // -1 = the model file's
  std::string gate;                    // "" = the model file's
  std::string o1;                      // "" = the model file's
  std::string rectify;                 // "" = aggregate
  std::string exact;                   // "" = the model file's
  std::string spill;                   // "" = RAM
  bool mmap = false, no_mmap = false;  // --mmap (the default) / --no-mmap
  std::string device = "auto";         // --device cpu|cuda|auto
  std::string skill;                   // --skill ID|none (CMF files)
  bool skill_dynamic = false;          // --skill-dynamic (run, chat)
  std::vector<std::string> lora;       // --lora FILE[:SCALE], repeatable
  WeightPlacement placement() const;
  BackendOptions backend_options() const;
  // The backend --device names, with the model on it.
  std::shared_ptr<Backend> open(std::shared_ptr<const Model> model) const;
  SessionOptions session() const;
  int n_threads() const;
  std::string model_path() const;  // model, the -hf download, or the built-in one
  mutable std::string hf_path_;    // -hf's local path once fetched
};

// The built-in model, models/dory-mini: $DORY_MODEL if set, else beside the binary
// (../models/dory-mini from build/, ../share/dory/models/dory-mini when installed), else
// in the source tree the binary was built from. Throws Error if none is there.
std::string default_model_path();
// What -m says in --help.
extern const char* const kModelHelp;
void add_run_opts(CLI::App* app, RunOpts& o);
// -hf ORG/NAME[:QUANT] (add_run_opts has it; for commands that add -m themselves).
void add_hf_opt(CLI::App* app, RunOpts& o);
// --device alone (for commands that take few of the run options).
void add_device_opt(CLI::App* app, RunOpts& o);

// Sampling and generation flags (dory run, chat, and later the server's defaults).
struct GenOpts {
  SamplingParams sp;
  int n_predict = 256;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  std::string tokenizer;  // "" = the model directory's tokenizer.json
  SamplingParams sampling() const { return sp; }
  GenerateParams params() const;
};
void add_gen_opts(CLI::App* app, GenOpts& o);

// A prompt-progress line on stderr, shown only once the work has taken more
// than a second.
class ProgressLine {
 public:
  explicit ProgressLine(const char* what, const char* unit = "tokens");
  void update(int64_t done, int64_t total);
  void done();

 private:
  const char* what_;
  const char* unit_;
  std::chrono::steady_clock::time_point t0_;
  bool shown_ = false;
  double last_ = 0;
};

std::vector<int32_t> parse_ids(const std::string& s);  // "1,2,3"
std::string human_bytes(uint64_t b);
// A "Key:   N kB" line of a /proc file (status, smaps_rollup, meminfo) in bytes.
std::optional<uint64_t> proc_bytes(const char* file, const std::string& key);
// "in memory (2.05 GiB on huge pages)" or "mapped from the file": where the
// model's weights are (the huge-page figure is this process's, from
// /proc/self/smaps_rollup).
std::string weights_placement_text(const Model& m);
// "gate conf:0.7: 40 tokens gated, 35.0% left after one pass (readouts 40, probes 0)", or ""
// when the session has no gate.
std::string gate_summary(const Session& s);
// "cpu: 2 threads, kernels avx512bf16" (for --verbose).
std::string backend_text(const Session& s);
// fn(a0, a1) over about host_threads * 4 ranges of [0, n), each at least `grain` long, on
// the backend's host threads (host work: dory calibrate's covariance).
void parallel_ranges(Backend& be, int64_t n, int64_t grain,
                     const std::function<void(int64_t, int64_t)>& fn);

}  // namespace dory::cli
