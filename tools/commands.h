#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace dory::cli {

// Each subcommand lives in its own tools/cmd_*.cpp and registers itself with
//   static const bool registered = register_command(RANK, add_xxx);
// add_xxx adds its CLI11 subcommand and returns the function that runs it.
// RANK orders `dory --help`.
using Runner = std::function<int()>;
using AddCommand = Runner (*)(CLI::App& app);

bool register_command(int rank, AddCommand add);
struct Registered {
  int rank;
  AddCommand add;
};
std::vector<Registered>& registered_commands();

}  // namespace dory::cli
