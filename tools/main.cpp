// dory: the command line. One file per subcommand; this one dispatches and
// turns every user-facing error into one line on stderr and exit code 1.
#include <cstdio>
#include <map>

#include "commands.h"
#include "dory/error.h"

int main(int argc, char** argv) {
  CLI::App app{"dory.cpp: inference for NVIDIA Nemotron Labs Dory (looped nGPT)", "dory"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "dory 0.1.0");
  std::map<std::string, dory::cli::Runner> runners;
  runners["info"] = dory::cli::add_info(app);
  runners["logits"] = dory::cli::add_logits(app);
  runners["bench"] = dory::cli::add_bench(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto* sub : app.get_subcommands()) return runners.at(sub->get_name())();
  } catch (const dory::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
