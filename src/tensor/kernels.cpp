#include "tensor/kernels.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace dory::kern {

std::vector<const KernelSet*> supported() {
  std::vector<const KernelSet*> v{&kScalar};
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) v.push_back(&kAvx2);
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    v.push_back(&kAvx512);
  return v;
}

static const KernelSet& choose() {
  auto v = supported();
  if (const char* want = std::getenv("DORY_ISA")) {
    for (const KernelSet* k : v)
      if (std::strcmp(k->name, want) == 0) return *k;
    std::fprintf(stderr, "warning: DORY_ISA=%s is not supported on this CPU; using %s\n", want,
                 v.back()->name);
  }
  return *v.back();
}

const KernelSet& active() {
  static const KernelSet& k = choose();
  return k;
}

}  // namespace dory::kern
