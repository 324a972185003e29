// Shared by the libFuzzer harnesses (fuzz_*.cpp). Each harness defines
// LLVMFuzzerTestOneInput; the same file links either with libFuzzer (clang,
// -fsanitize=fuzzer) or with replay_main.cpp (g++, ASan + UBSan) for ctest.
//
// The contract under test: any input either parses or throws dory::Error. Only
// dory::Error is caught, so any other exception (std::out_of_range, a JSON
// library exception, std::bad_alloc from an absurd size) escapes, terminates
// the process and counts as a finding, like a crash or a sanitizer report.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "dory/error.h"

namespace dory::fuzz {

// Runs f(); swallows dory::Error (the documented failure), nothing else. Also checks the
// error is a single line, as every user-facing error must be (DESIGN.md).
template <class F>
void expect_ok_or_error(F&& f) {
  try {
    f();
  } catch (const dory::Error& e) {
    const std::string_view msg = e.what();
    // DORY_FUZZ_VERBOSE=1 prints each error (to see how far a seed gets).
    static const bool verbose = std::getenv("DORY_FUZZ_VERBOSE") != nullptr;
    if (verbose) std::fprintf(stderr, "dory::Error: %s\n", e.what());
    if (msg.empty() || msg.find('\n') != std::string_view::npos) {
      std::fprintf(stderr, "dory::Error is not one line: [%s]\n", e.what());
      std::abort();
    }
  }
}

// Splits [data, data+size) at the first byte `sep`: before, after (after is empty and
// *found false when there is no such byte).
inline std::string_view split_at(std::string_view& rest, char sep, bool* found = nullptr) {
  const size_t k = rest.find(sep);
  std::string_view head = rest.substr(0, k);
  if (found) *found = k != std::string_view::npos;
  rest = k == std::string_view::npos ? std::string_view() : rest.substr(k + 1);
  return head;
}

}  // namespace dory::fuzz
