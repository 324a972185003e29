#pragma once
#include <CLI/CLI.hpp>
#include <functional>

namespace dory::cli {

// Each subcommand registers itself and returns the function that runs it.
using Runner = std::function<int()>;
Runner add_info(CLI::App& app);
Runner add_logits(CLI::App& app);
Runner add_bench(CLI::App& app);

}  // namespace dory::cli
