// A per-process scratch directory for unit tests' files, removed when the process exits.
// ctest runs every gtest case as its own process, so a fixed or pid-named folder under
// /tmp would pile up one leftover per case and per run.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace test_scratch {

inline const std::filesystem::path& dir() {
  struct Dir {
    std::filesystem::path path;
    Dir() {
      std::string tmpl = (std::filesystem::temp_directory_path() / "dory_unit_XXXXXX").string();
      if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
      path = tmpl;
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir d;
  return d.path;
}

inline std::filesystem::path file(const std::string& name) { return dir() / name; }

}  // namespace test_scratch
