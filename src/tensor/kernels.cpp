#include "tensor/kernels.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

namespace dory::kern {

uint64_t mat_bytes(const Mat& m) { return static_cast<uint64_t>(m.rows) * row_bytes(m.dtype, m.cols); }

std::vector<const KernelSet*> supported() {
  std::vector<const KernelSet*> v{&kScalar};
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2) v.push_back(&kAvx2);
  if (avx2 && __builtin_cpu_supports("avxvnni")) v.push_back(&kAvx2Vnni);
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (avx512) v.push_back(&kAvx512);
  if (avx512 && __builtin_cpu_supports("avx512vnni")) {
    v.push_back(&kAvx512Vnni);
    if (__builtin_cpu_supports("avx512bf16")) v.push_back(&kAvx512Bf16);
  }
  return v;
}

// The best supported set, or the one DORY_ISA names. DORY_BF16_INPUT=float
// passes over a set that rounds BF16 products' inputs to bf16 (the float
// result the reference computes, for parity checks), =bf16 (the default) keeps it.
static const KernelSet& choose() {
  auto v = supported();
  bool float_input = false;
  if (const char* in = std::getenv("DORY_BF16_INPUT")) {
    if (std::strcmp(in, "float") == 0) float_input = true;
    else if (std::strcmp(in, "bf16") != 0)
      std::fprintf(stderr, "warning: DORY_BF16_INPUT=%s is neither float nor bf16; using bf16\n", in);
  }
  const KernelSet* best = v.front();
  for (const KernelSet* k : v)
    if (!(float_input && k->bf16_input)) best = k;
  if (const char* want = std::getenv("DORY_ISA")) {
    for (const KernelSet* k : v)
      if (std::strcmp(k->name, want) == 0) return *k;
    std::fprintf(stderr, "warning: DORY_ISA=%s is not supported on this CPU; using %s\n", want, best->name);
  }
  return *best;
}

const KernelSet& active() {
  static const KernelSet& k = choose();
  return k;
}

namespace detail {

namespace {
struct Slots {
  ActScratch s[kActSlots];
  Slots() {
    for (ActScratch& a : s) a = ActScratch{-1, 0, 0, nullptr, 0, nullptr, 0};
  }
  ~Slots() {
    for (ActScratch& a : s) {
      std::free(a.src);
      std::free(a.buf);
    }
  }
};
thread_local Slots slots;

void* alloc64(uint64_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace

}  // namespace detail

AlignedBuf::~AlignedBuf() { std::free(p_); }

uint8_t* AlignedBuf::get(uint64_t bytes) {
  if (bytes > cap_) {
    std::free(p_);
    p_ = nullptr;
    cap_ = 0;
    p_ = static_cast<uint8_t*>(detail::alloc64(bytes));
    cap_ = bytes;
  }
  return p_;
}

namespace detail {

ActScratch& act_scratch(int slot) { return slots.s[slot]; }

void act_reserve(ActScratch& s, uint64_t src_floats, uint64_t buf_bytes) {
  s.tag = -1;
  if (src_floats > s.src_cap) {
    std::free(s.src);
    s.src = nullptr;
    s.src_cap = 0;
    s.src = static_cast<float*>(alloc64(src_floats * 4));
    s.src_cap = src_floats;
  }
  if (buf_bytes > s.buf_cap) {
    std::free(s.buf);
    s.buf = nullptr;
    s.buf_cap = 0;
    s.buf = static_cast<uint8_t*>(alloc64(buf_bytes));
    s.buf_cap = buf_bytes;
  }
}

}  // namespace detail

}  // namespace dory::kern
