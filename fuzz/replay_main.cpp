// Replays fuzzing inputs without libFuzzer: feeds every file named on the command line, or
// found in a directory named there, to the harness's LLVMFuzzerTestOneInput. ctest runs one
// of these per harness over its corpus, built with g++ -fsanitize=address,undefined, so a
// crash, a sanitizer report or an exception other than dory::Error fails the test, and so
// does an input that runs longer than DORY_REPLAY_TIMEOUT seconds (default 60; libFuzzer's
// -timeout, so that a hang found by fuzzing stays a failure here). Memory blow-ups are
// caught by ASan's hard_rss_limit_mb / max_allocation_size_mb, set by the ctest.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {
const char* g_current = "";

void on_alarm(int) {
  const char msg[] = "replay: timeout on ";
  (void)!write(2, msg, sizeof msg - 1);
  (void)!write(2, g_current, std::strlen(g_current));
  (void)!write(2, "\n", 1);
  std::abort();
}
}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const fs::path p = argv[i];
    if (fs::is_directory(p)) {
      for (const auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file()) files.push_back(e.path());
    } else if (fs::is_regular_file(p)) {
      files.push_back(p);
    } else {
      std::fprintf(stderr, "%s: no such file or directory\n", argv[i]);
      return 2;
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "usage: %s FILE_OR_DIR...  (no inputs found)\n", argv[0]);
    return 2;
  }
  const char* t = std::getenv("DORY_REPLAY_TIMEOUT");
  const unsigned timeout = t && std::atoi(t) > 0 ? static_cast<unsigned>(std::atoi(t)) : 60;
  signal(SIGALRM, on_alarm);
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (!in.eof() && in.fail()) {
      std::fprintf(stderr, "%s: read error\n", f.c_str());
      return 2;
    }
    // An exact-size heap copy, as libFuzzer passes it, so ASan sees any read past the end.
    std::vector<uint8_t> buf(bytes.begin(), bytes.end());
    std::fprintf(stderr, "replay %s (%zu bytes)\n", f.c_str(), buf.size());
    static const uint8_t empty = 0;
    g_current = f.c_str();
    alarm(timeout);
    LLVMFuzzerTestOneInput(buf.empty() ? &empty : buf.data(), buf.size());
    alarm(0);
  }
  std::printf("replayed %zu inputs\n", files.size());
  return 0;
}
