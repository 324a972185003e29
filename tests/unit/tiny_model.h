// The small random checkpoint the test fixture makes (scripts/make_checkpoint.py,
// tiny preset: W = 4, 12 layers, 2 loops), loaded once per test binary, and
// random ids for it.
#pragma once
#include <cstdlib>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

#include "dory/backend.h"
#include "dory/session.h"

namespace dory::fixture {

inline std::shared_ptr<const Model> tiny() {
  static std::shared_ptr<const Model> m = [] {
    const char* p = std::getenv("DORY_TINY_MODEL");
    if (!p) throw std::runtime_error("DORY_TINY_MODEL is not set (run through ctest)");
    return Model::load(p);
  }();
  return m;
}

// The CPU backend with `threads` threads over a model (the tiny one by default).
inline std::shared_ptr<Backend> cpu(int threads, std::shared_ptr<const Model> m = nullptr) {
  BackendOptions o;
  o.device = Device::Cpu;
  o.threads = threads;
  return open_backend(m ? m : tiny(), o);
}

inline std::vector<int32_t> ids(int n, int seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = static_cast<int32_t>(rng() % tiny()->config().vocab);
  return v;
}

}  // namespace dory::fixture
