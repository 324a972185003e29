#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "dory/model.h"
#include "dory/session.h"

namespace dory::cli {

// Options every model-running subcommand shares.
struct RunOpts {
  std::string model;
  int threads = 0;  // 0 = all cores
  int loops = 0;    // 0 = the model's
  std::string kv;   // "" = the model's
  int chunk = 64;
  SessionOptions session() const;
  int n_threads() const;
};
void add_run_opts(CLI::App* app, RunOpts& o);

std::vector<int32_t> parse_ids(const std::string& s);  // "1,2,3"
std::string human_bytes(uint64_t b);

}  // namespace dory::cli
