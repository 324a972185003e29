// Kernel micro-benchmarks (Google Benchmark): single-thread matrix-vector and
// batched products per weight type and kernel set, on the 4B model's
// projection shape (4096 x 2560).
//
//   bench_kernels [--benchmark_filter=...]    (DORY_ISA has no effect here:
//                                              every supported set is run)
//
// Counters: GB/s = weight bytes read per second (what decode is bound by).
// "hot": one matrix, resident in L3 after the first pass; "dram": a rotation
// of matrices totalling > 256 MiB, so every pass streams from memory.
// "tasks": the product split into 32-row calls as ops.cpp's linear_multi does
// for one token (the input quantization is shared through the per-thread memo).
// "newx": a different input every call (the quantization is paid every time).
// "mm/RxC/Tn": prefill on the MLP shapes through matmat (float input, 64-row
// calls; on avx512bf16 a BF16 matrix pays the input's rounding every call);
// "gemm/...": the same through quantize_act + matmat_qa, as linear_multi does.
// GOP/s = 2 * rows * cols * T per second.
#include <benchmark/benchmark.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "tensor/kernels.h"
#include "tensor/quant.h"

using namespace dory;

namespace {

constexpr int64_t kRows = 4096, kCols = 2560;
const DType kTypes[] = {DType::BF16, DType::F16, DType::F32, DType::Q8_0,
                        DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};

// Realistic bytes: a Gaussian matrix quantized (or converted) to the type.
std::vector<uint8_t> make_matrix(DType t, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> row(kCols);
  const uint64_t rb = row_bytes(t, kCols);
  std::vector<uint8_t> m(kRows * rb);
  for (int64_t r = 0; r < kRows; ++r) {
    for (float& v : row) v = nd(rng);
    quantize_row(t, row.data(), m.data() + r * rb, kCols);
  }
  return m;
}

struct Fixture {
  std::vector<std::vector<uint8_t>> mats;  // mats[0] is the hot one
  std::vector<float> x0, x1, y;
};

Fixture& fixture(DType t) {
  static Fixture f[8];
  Fixture& fx = f[static_cast<int>(t)];
  if (fx.mats.empty()) {
    const uint64_t bytes = kRows * row_bytes(t, kCols);
    const int n = static_cast<int>((256ull << 20) / bytes + 2);
    fx.mats.push_back(make_matrix(t, 1));
    for (int i = 1; i < n; ++i) fx.mats.push_back(fx.mats[0]);  // copies: distinct memory
    std::mt19937 rng(2);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    fx.x0.resize(kCols * 64);
    fx.x1.resize(kCols * 64);
    for (float& v : fx.x0) v = nd(rng);
    for (float& v : fx.x1) v = nd(rng);
    fx.y.resize(kRows * 64);
  }
  return fx;
}

enum Mode { kHot, kDram, kTasks, kNewX };

void BM_matvec(benchmark::State& st, const kern::KernelSet* ks, DType t, Mode mode) {
  Fixture& fx = fixture(t);
  const uint64_t bytes = kRows * row_bytes(t, kCols);
  size_t i = 0;
  for (auto _ : st) {
    const auto& m = mode == kDram ? fx.mats[i % fx.mats.size()] : fx.mats[0];
    const kern::Mat w{t, m.data(), kRows, kCols};
    const float* x = mode == kNewX && (i & 1) ? fx.x1.data() : fx.x0.data();
    if (mode == kTasks)
      for (int64_t r = 0; r < kRows; r += 32) ks->matvec(w, x, fx.y.data() + r, r, r + 32);
    else ks->matvec(w, x, fx.y.data(), 0, kRows);
    benchmark::ClobberMemory();
    ++i;
  }
  st.counters["GB/s"] = benchmark::Counter(double(bytes) * st.iterations() / 1e9, benchmark::Counter::kIsRate);
}

// Prompt processing: T rows at once (the chunk; default 64), in 64-row calls as
// linear_multi does.
void BM_matmat(benchmark::State& st, const kern::KernelSet* ks, DType t, int64_t T) {
  Fixture& fx = fixture(t);
  const kern::Mat w{t, fx.mats[0].data(), kRows, kCols};
  for (auto _ : st) {
    for (int64_t r = 0; r < kRows; r += 64) ks->matmat(w, fx.x0.data(), T, kCols, fx.y.data(), kRows, r, r + 64);
    benchmark::ClobberMemory();
  }
  st.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * kRows * kCols * T * st.iterations() / 1e9, benchmark::Counter::kIsRate);
  st.counters["tok/s"] = benchmark::Counter(double(T) * st.iterations(), benchmark::Counter::kIsRate);
}

// Prefill on the 4B model's MLP shapes (gate/up 7168 x 2560, down 2560 x 7168),
// through the float-input entry point in 64-row calls (for quantized weights what
// linear_multi did before the pre-quantized entry point). GOP/s counts 2 ops per multiply-add.
struct ShapeFx {
  std::vector<uint8_t> m;
  std::vector<float> x, y;
};

ShapeFx& shape_fixture(DType t, int64_t rows, int64_t cols, int64_t T) {
  static std::map<std::tuple<int, int64_t, int64_t>, ShapeFx> all;
  ShapeFx& f = all[{static_cast<int>(t), rows, cols}];
  if (f.m.empty()) {
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 0.02f);
    std::vector<float> row(cols);
    const uint64_t rb = row_bytes(t, cols);
    f.m.resize(rows * rb);
    for (int64_t r = 0; r < rows; ++r) {
      for (float& v : row) v = nd(rng);
      quantize_row(t, row.data(), f.m.data() + r * rb, cols);
    }
  }
  if (static_cast<int64_t>(f.x.size()) < T * cols) {
    std::mt19937 rng(6);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    f.x.resize(T * cols);
    for (float& v : f.x) v = nd(rng);
    f.y.resize(T * rows);
  }
  return f;
}

void BM_matmat_shape(benchmark::State& st, const kern::KernelSet* ks, DType t, int64_t rows, int64_t cols,
                     int64_t T) {
  ShapeFx& f = shape_fixture(t, rows, cols, T);
  const kern::Mat w{t, f.m.data(), rows, cols};
  for (auto _ : st) {
    for (int64_t r = 0; r < rows; r += 64)
      ks->matmat(w, f.x.data(), T, cols, f.y.data(), rows, r, std::min(rows, r + 64));
    benchmark::ClobberMemory();
  }
  st.counters["GOP/s"] =
      benchmark::Counter(2.0 * rows * cols * T * st.iterations() / 1e9, benchmark::Counter::kIsRate);
}

// The same through the pre-quantized entry points, as linear_multi calls them:
// the input quantized once per product (counted), then 64-row tasks (32 rows
// at T = 1).
void BM_gemm_shape(benchmark::State& st, const kern::KernelSet* ks, DType t, int64_t rows, int64_t cols,
                   int64_t T) {
  ShapeFx& f = shape_fixture(t, rows, cols, T);
  const kern::Mat w{t, f.m.data(), rows, cols};
  const uint64_t bytes = T == 1 ? ks->act_row_bytes(t, cols) : ks->batch_bytes(t, T, cols);
  auto* xq = static_cast<uint8_t*>(std::aligned_alloc(64, bytes));
  for (auto _ : st) {
    if (T == 1) ks->quantize_act(t, f.x.data(), cols, xq);
    else ks->quantize_batch(t, f.x.data(), cols, cols, 0, T, xq);
    const int64_t block = T == 1 ? 32 : 64;
    for (int64_t r = 0; r < rows; r += block) {
      const int64_t r1 = std::min(rows, r + block);
      if (T == 1) ks->matvec_qa(w, xq, f.y.data() + r, r, r1);
      else ks->matmat_qa(w, xq, T, f.y.data(), rows, r, r1);
    }
    benchmark::ClobberMemory();
  }
  std::free(xq);
  st.counters["GOP/s"] =
      benchmark::Counter(2.0 * rows * cols * T * st.iterations() / 1e9, benchmark::Counter::kIsRate);
}

// The limit: one thread reading 512 MiB with 256-bit loads (sum of int64).
__attribute__((target("avx2"))) int64_t read_all(const int64_t* p, int64_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < n; i += 16) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  alignas(32) int64_t v[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(v), _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  return v[0] + v[1] + v[2] + v[3];
}

void BM_memread(benchmark::State& st) {
  const int64_t n = (512ll << 20) / 8;
  static int64_t* buf = [] {
    auto* b = static_cast<int64_t*>(std::aligned_alloc(64, (512ll << 20)));
    for (int64_t i = 0; i < (512ll << 20) / 8; ++i) b[i] = i;
    return b;
  }();
  for (auto _ : st) benchmark::DoNotOptimize(read_all(buf, n));
  st.counters["GB/s"] = benchmark::Counter(double(n) * 8 * st.iterations() / 1e9, benchmark::Counter::kIsRate);
}

int reg = [] {
  benchmark::RegisterBenchmark("memread_1thread", BM_memread)->MinTime(1.0)->Unit(benchmark::kMillisecond);
  for (const kern::KernelSet* ks : kern::supported()) {
    if (std::strcmp(ks->name, "scalar") == 0) continue;
    for (DType t : kTypes) {
      const std::string n = std::string(ks->name) + "/" + dtype_name(t);
      benchmark::RegisterBenchmark(("matvec_hot/" + n).c_str(), BM_matvec, ks, t, kHot)->MinTime(0.3);
      benchmark::RegisterBenchmark(("matvec_dram/" + n).c_str(), BM_matvec, ks, t, kDram)->MinTime(0.3);
      if (dtype_is_quantized(t)) {
        benchmark::RegisterBenchmark(("matvec_tasks/" + n).c_str(), BM_matvec, ks, t, kTasks)->MinTime(0.3);
        benchmark::RegisterBenchmark(("matvec_newx/" + n).c_str(), BM_matvec, ks, t, kNewX)->MinTime(0.3);
      }
      for (int64_t T : {4, 16, 32, 64})
        benchmark::RegisterBenchmark(("matmat" + std::to_string(T) + "/" + n).c_str(), BM_matmat, ks, t, T)
            ->MinTime(0.3)
            ->Unit(benchmark::kMillisecond);
      if (!dtype_is_quantized(t) && t != DType::BF16) continue;
      for (auto [rows, cols] : {std::pair<int64_t, int64_t>{7168, 2560}, {2560, 7168}})
        for (int64_t T : {1, 8, 64}) {
          const std::string sh = std::to_string(rows) + "x" + std::to_string(cols) + "/T" + std::to_string(T);
          benchmark::RegisterBenchmark(("mm/" + sh + "/" + n).c_str(), BM_matmat_shape, ks, t, rows, cols, T)
              ->MinTime(0.3)
              ->Unit(benchmark::kMillisecond);
          if (dtype_is_quantized(t))
            benchmark::RegisterBenchmark(("gemm/" + sh + "/" + n).c_str(), BM_gemm_shape, ks, t, rows, cols, T)
                ->MinTime(0.3)
                ->Unit(benchmark::kMillisecond);
        }
    }
  }
  return 0;
}();

}  // namespace

BENCHMARK_MAIN();
