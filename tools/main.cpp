// dory: the command line. One file per subcommand; this one dispatches and
// turns every user-facing error into one line on stderr and exit code 1.
#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "dory/error.h"

namespace dory::cli {
std::vector<Registered>& registered_commands() {
  static std::vector<Registered> v;
  return v;
}
bool register_command(int rank, AddCommand add) {
  registered_commands().push_back({rank, add});
  return true;
}
}  // namespace dory::cli

namespace {
// Errors quote names and strings from the user's files; control characters
// in them are escaped so an error is always exactly one line.
void print_error(const char* what) {
  std::string line = "error: ";
  for (const char* p = what; *p; ++p) {
    const unsigned char ch = static_cast<unsigned char>(*p);
    if (ch < 0x20 || ch == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", ch);
      line += buf;
    } else {
      line += *p;
    }
  }
  std::fprintf(stderr, "%s\n", line.c_str());
}
}  // namespace

int main(int argc, char** argv) {
  // glibc keeps freed memory for reuse instead of handing it back to the
  // kernel: blocks up to 256 MiB come from the heap, which is trimmed only past
  // 1 GiB free. The KV caches grow by reallocation and every session starts
  // anew, so with the defaults each growth took fresh pages from the kernel, and
  // a page fault costs microseconds on a VM (56 caches growing over 64 tokens:
  // 0.12 s of a stand-alone loop, 0.02 s with the heap reused). 4B-shaped
  // Q4_K_M, `bench -p 512 -n 128 -r 1`, seven alternating pairs of runs: pp512
  // -5% to +14% (+8% on average), tg128 -7% to +6% (+1%, within the machine's
  // noise); peak RSS 1.012 -> 1.020 x (file + KV cache). The price: memory
  // freed stays with the process (the next session reuses it).
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  CLI::App app{"dory.cpp: inference for NVIDIA Nemotron Labs Dory (looped nGPT)", "dory"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "dory 0.1.0");
  app.footer(
      "Environment:\n"
      "  DORY_ISA=scalar|avx2|avx2vnni|avx512|avx512vnni|avx512bf16\n"
      "                   kernel set (default: the best this CPU runs; `dory info` names it)\n"
      "  DORY_BF16_INPUT=float|bf16\n"
      "                   products on BF16 weights: input kept float, or rounded to bf16 (the\n"
      "                   default where the CPU has AVX512_BF16, as llama.cpp does)\n"
      "  HF_TOKEN, HF_ENDPOINT, HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE=1\n"
      "                   dory pull and -hf: Hub token, mirror, cache folder, cache only");
  auto cmds = dory::cli::registered_commands();
  std::sort(cmds.begin(), cmds.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  std::vector<dory::cli::Runner> runners;
  for (const auto& c : cmds) runners.push_back(c.add(app));
  // llama.cpp's spelling -hf (CLI11 would read it as -h -f) is --hf.
  std::vector<std::string> args;
  for (int i = argc - 1; i >= 1; --i)
    args.push_back(std::string(argv[i]) == "-hf" ? "--hf" : argv[i]);
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    // Subcommands were added in `cmds` order, so their positions match runners.
    const auto subs = app.get_subcommands({});
    for (size_t i = 0; i < subs.size(); ++i)
      if (subs[i]->parsed()) return runners.at(i)();
  } catch (const std::bad_alloc&) {
    print_error("out of memory");
    return 1;
  } catch (const std::exception& e) {  // dory::Error and anything unforeseen
    print_error(e.what());
    return 1;
  }
  return 0;
}
