#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <tuple>

namespace dory {

void normalize(float* x, int64_t n) {
  // double: the norm is the one thing every layer depends on. Eight partial
  // sums, so the adds are not one serial chain (it was ~5% of prefill).
  double part[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) part[j] += double(x[i + j]) * x[i + j];
  for (int j = 0; i < n; ++i, ++j) part[j] += double(x[i]) * x[i];
  const double ss =
      ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
  const float inv = static_cast<float>(1.0 / std::sqrt(ss + 1e-6));
  for (i = 0; i < n; ++i) x[i] *= inv;
}

void ngpt_residual(float* x, float* y, const float* a, int64_t n) {
  normalize(x, n);
  normalize(y, n);
  for (int64_t i = 0; i < n; ++i) x[i] += a[i] * (y[i] - x[i]);
  normalize(x, n);
}

namespace {

// Q8_0 and Q4_0 share one input form, the K types another.
int act_form(DType t) {
  return t == DType::Q8_0 || t == DType::Q4_0 ? 0 : 1;
}

// Quantized weights: up to kRowwiseMax input rows run row by row through the
// matrix-vector kernel, over blocks of kRowwiseSub weight rows when more than one
// (see linear_multi).
constexpr int64_t kRowwiseMax = 3, kRowwiseSub = 64;

// One input row (decode): the rows of all outputs as one space, split by
// guided scheduling (GuidedRanges) into ranges within one matrix that start
// long and shrink toward the end. A range is one stream the kernel prefetches
// ahead of itself; each new one restarts that stream, so few long ranges
// stream faster than many short ones, and the short ones at the end keep the
// threads finishing together. 4B-shaped Q4_0, 2 threads, the two schedules
// alternating every 7 products within one decode run (so both see the same
// memory), GB/s of the products: 128-row tasks 28.6 / 30.6 / 30.4, guided
// 30.9 / 32.6 / 32.8. (Claiming the next range ahead and prefetching into it
// across the boundary measured 1-2% slower still.)
constexpr int64_t kMinRangeRows = 32;

void decode_rows(ThreadPool& pool, const float* x, const uint8_t* const xq[2],
                 const std::vector<LinearOut>& outs) {
  const kern::KernelSet& k = kern::kernels();
  std::vector<int64_t> cuts(outs.size());
  int64_t total = 0;
  for (size_t i = 0; i < outs.size(); ++i) cuts[i] = total += outs[i].w->rows;
  GuidedRanges ranges(cuts, kMinRangeRows, 2 * pool.size());  // 1, 2 or 4 x threads: within 1%
  pool.run(pool.size(), [&](int64_t) {
    for (auto [b, e] = ranges.claim(); b < e; std::tie(b, e) = ranges.claim()) {
      const size_t i = std::upper_bound(cuts.begin(), cuts.end(), b) - cuts.begin();
      const int64_t r0 = b - (i ? cuts[i - 1] : 0), r1 = r0 + (e - b);
      const kern::Mat& w = *outs[i].w;
      if (dtype_is_quantized(w.dtype))
        k.matvec_qa(w, xq[act_form(w.dtype)], outs[i].y + r0, r0, r1);
      else
        k.matvec(w, x, outs[i].y + r0, r0, r1);
    }
  });
}

}  // namespace

namespace {
thread_local const float* t_lora_rows = nullptr;
thread_local int t_lora_n = 0;
}  // namespace

LoraRowScales::LoraRowScales(const float* scales, int n) : prev_(t_lora_rows), prev_n_(t_lora_n) {
  t_lora_rows = scales;
  t_lora_n = n;
}

LoraRowScales::~LoraRowScales() {
  t_lora_rows = prev_;
  t_lora_n = prev_n_;
}

namespace {
// The adapters' low-rank terms, y += scale * B (A x), of every output of one linear_multi call
// at once: all the A x products as one pool run, then all of B's rows as another, or both on
// the calling thread when they are small. (Two runs per matrix and adapter with the sums in
// double, as before 2026-12-07: the built-in model with rank 16 on every matrix of the block
// decoded at 0.42x and read prompts at 0.38x the plain model's rate; docs/performance.md.)
void add_lora_terms(ThreadPool& pool, const float* x, int64_t T, const std::vector<LinearOut>& outs) {
  struct Job {
    const LinearOut* o;
    const kern::LoraDelta* d;
    int64_t ax0;  // where its T x rank values start in ax
  };
  constexpr int64_t kRowsA = 16;  // input rows a task of A x takes (through the float GEMM)
  std::vector<Job> jobs;
  std::vector<int64_t> cut;  // running ends of the jobs' A x tasks
  int64_t nax = 0, na = 0;
  std::vector<const LinearOut*> adapted;
  for (const LinearOut& o : outs) {
    if (!o.w->lora) continue;
    adapted.push_back(&o);
    for (const kern::LoraDelta& d : *o.w->lora) {
      jobs.push_back({&o, &d, nax});
      nax += T * d.rank;
      cut.push_back(na += (T + kRowsA - 1) / kRowsA);
    }
  }
  if (jobs.empty()) return;
  const kern::KernelSet& ks = kern::kernels();
  std::vector<float> ax(static_cast<size_t>(nax));
  const float* rows_scale = t_lora_rows;
  const int n_ad = t_lora_n;
  // Little work (decode: rank x (cols + rows) per matrix) runs on the calling thread: a pool
  // run's hand-out and join cost more than ~100k multiply-adds take in vector registers.
  int64_t macs = 0;
  for (const Job& jb : jobs) macs += T * jb.d->rank * (jb.o->w->cols + jb.o->w->rows);
  const bool inline_run = macs < (int64_t{1} << 17);
  auto run = [&](int64_t n, const std::function<void(int64_t)>& fn) {
    if (inline_run) {
      for (int64_t i = 0; i < n; ++i) fn(i);
    } else {
      pool.run(n, fn);
    }
  };
  // A x for up to kRowsA input rows of one adapter a task (A as an F32 matrix through the
  // set's float GEMM), then each row's scale.
  run(na, [&](int64_t task) {
    const size_t j = std::upper_bound(cut.begin(), cut.end(), task) - cut.begin();
    const kern::LoraDelta& d = *jobs[j].d;
    const int64_t n = jobs[j].o->w->cols;
    const int64_t t0 = (task - (j ? cut[j - 1] : 0)) * kRowsA, t1 = std::min(T, t0 + kRowsA);
    float* out = ax.data() + jobs[j].ax0 + t0 * d.rank;
    const kern::Mat a{DType::F32, d.a, d.rank, n};
    ks.matmat(a, x + t0 * n, t1 - t0, n, out, d.rank, 0, d.rank);
    for (int64_t t = t0; t < t1; ++t) {
      const float sc = rows_scale && d.adapter < n_ad ? d.base * rows_scale[t * n_ad + d.adapter] : d.scale;
      for (int64_t k = 0; k < d.rank; ++k) out[(t - t0) * d.rank + k] *= sc;
    }
  });
  // y += B (A x): a task per output and block of 256 rows, every input row and adapter of the
  // output in it (the block of B stays in cache across the rows).
  std::vector<int64_t> bcut;  // running ends of the outputs' row-block tasks
  int64_t nb = 0;
  for (const LinearOut* o : adapted) bcut.push_back(nb += (o->w->rows + 255) / 256);
  run(nb, [&](int64_t task) {
    const size_t i = std::upper_bound(bcut.begin(), bcut.end(), task) - bcut.begin();
    const LinearOut& o = *adapted[i];
    const int64_t m = o.w->rows, r0 = (task - (i ? bcut[i - 1] : 0)) * 256, r1 = std::min(m, r0 + 256);
    for (int64_t t = 0; t < T; ++t) {
      float* yt = o.y + t * m;
      for (const Job& jb : jobs) {
        if (jb.o != &o) continue;
        const kern::LoraDelta& d = *jb.d;
        const float* at = ax.data() + jb.ax0 + t * d.rank;
        for (int64_t k = 0; k < d.rank; ++k)
          if (at[k] != 0.0f) ks.axpy(at[k], d.bt + k * m + r0, yt + r0, r1 - r0);
      }
    }
  });
}
}  // namespace

void linear_multi(ThreadPool& pool, const float* x, int64_t T, const std::vector<LinearOut>& outs) {
  const kern::KernelSet& k = kern::kernels();
  if (outs.empty()) return;
  // Adapters: the products without them first, then each adapter's low-rank term added.
  bool adapted = false;
  for (const LinearOut& o : outs) adapted |= o.w->lora != nullptr;
  if (adapted) {
    std::vector<kern::Mat> bare(outs.size());
    std::vector<LinearOut> plain;
    for (size_t i = 0; i < outs.size(); ++i) {
      bare[i] = *outs[i].w;
      bare[i].lora = nullptr;
      plain.push_back({&bare[i], outs[i].y});
    }
    linear_multi(pool, x, T, plain);
    add_lora_terms(pool, x, T, outs);
    return;
  }
  // A matrix with column scales (CMF q8_2f as Q8_0 blocks) takes its own input, scaled per
  // column; the others go on together below, as they always did.
  bool scaled = false;
  for (const LinearOut& o : outs) scaled |= o.w->col_scale != nullptr;
  if (scaled) {
    std::vector<LinearOut> plain;
    for (const LinearOut& o : outs) {
      if (!o.w->col_scale) {
        plain.push_back(o);
        continue;
      }
      const int64_t n = o.w->cols;
      std::vector<float> xs(T * n);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < n; ++c) xs[t * n + c] = x[t * n + c] * o.w->col_scale[c];
      kern::Mat m = *o.w;
      m.col_scale = nullptr;
      linear_multi(pool, xs.data(), T, {{&m, o.y}});
    }
    if (!plain.empty()) linear_multi(pool, x, T, plain);
    return;
  }
  const int64_t cols = outs[0].w->cols;
  // Quantized weights: the input is quantized here once per form (rows spread
  // over the pool), not by each task; the kernels' per-thread memo would
  // compare the whole input on every call. Up to kRowwiseMax rows (one token,
  // or decode of 2-3 slots together) go row by row through the matrix-vector
  // kernel, the others through the GEMM (row layouts differ: act rows vs batch).
  const bool rowwise = T <= kRowwiseMax;
  // Float weights take the float input, except where the set has a batch form
  // for them (avx512bf16's BF16: the input rounded to bf16 once here).
  auto has_form = [&](DType t) {
    return dtype_is_quantized(t) || (T >= kern::kMatmatFewRows && k.batch_bytes(t, T, cols) > 0);
  };
  auto form_of = [](DType t) { return dtype_is_quantized(t) ? act_form(t) : 2; };
  thread_local kern::AlignedBuf qbuf[3];  // the calling thread's quantized inputs
  const uint8_t* xq[3] = {nullptr, nullptr, nullptr};
  uint64_t xq_stride[3] = {0, 0, 0};
  for (const LinearOut& o : outs) {
    if (!has_form(o.w->dtype)) continue;
    const int f = form_of(o.w->dtype);
    if (xq[f]) continue;
    const DType t = o.w->dtype;
    if (rowwise) {
      const uint64_t stride = (k.act_row_bytes(t, cols) + 63) / 64 * 64;
      uint8_t* buf = qbuf[f].get(stride * T);
      if (T == 1)
        k.quantize_act(t, x, cols, buf);
      else
        pool.run(T, [&](int64_t r) { k.quantize_act(t, x + r * cols, cols, buf + r * stride); });
      xq[f] = buf;
      xq_stride[f] = stride;
    } else {
      uint8_t* buf = qbuf[f].get(k.batch_bytes(t, T, cols));
      pool.run(T, [&](int64_t r) { k.quantize_batch(t, x, cols, cols, r, r + 1, buf); });
      xq[f] = buf;
    }
  }
  if (T == 1) {
    decode_rows(pool, x, xq, outs);
    return;
  }
  // Several input rows: fixed row blocks. 2-3 quantized rows (rowwise), 128
  // rows a task, each task one stream the kernel prefetches ahead of itself
  // (measured for one row when it ran this way: 4096x2560 Q4_0 at 2 threads,
  // 32 rows 32.1, 64 rows 34.2, 128 rows 36.4, 256 rows 38.1 GB/s).
  // Batches: each task streams its rows' weights once against all T input
  // rows (the quantized input, 64 rows x cols int8, stays in L2); on quantized
  // weights 4 GEMM panels of 16 rows, since a task's first panel waits on
  // memory (the GEMM prefetches the rest, within the task); on float weights
  // 2 (AVX-512) or 4 (AVX2) panels of the float GEMM's (kernels_simd.h).
  bool quantized = false;
  for (const LinearOut& o : outs) quantized |= dtype_is_quantized(o.w->dtype);
  // (float weights below kMatmatFewRows rows: matmat's few-rows path, one stream like matvec's)
  const int64_t block = (quantized ? rowwise : T < kern::kMatmatFewRows) ? 128 : 64;
  std::vector<int64_t> first_task(outs.size() + 1, 0);
  for (size_t i = 0; i < outs.size(); ++i)
    first_task[i + 1] = first_task[i] + (outs[i].w->rows + block - 1) / block;
  pool.run(first_task.back(), [&](int64_t task) {
    size_t i = 0;
    while (task >= first_task[i + 1]) ++i;
    const kern::Mat& w = *outs[i].w;
    const int64_t r0 = (task - first_task[i]) * block;
    const int64_t r1 = std::min(w.rows, r0 + block);
    if (dtype_is_quantized(w.dtype)) {
      const int f = act_form(w.dtype);
      if (rowwise) {
        // Several rows: 64-row blocks, whose bytes come from memory for the first
        // row and from L2 for the others, instead of the GEMM, whose panel
        // packing costs more than it saves at so few rows. 4B-shaped Q4_0, 2
        // threads, one decode step of T slots (ms), GEMM -> this: T=2 186 -> 114,
        // T=3 199 -> 161, T=4 204 -> 207 (T=1 83).
        for (int64_t s0 = r0; s0 < r1; s0 += kRowwiseSub) {
          const int64_t s1 = std::min(r1, s0 + kRowwiseSub);
          for (int64_t t = 0; t < T; ++t)
            k.matvec_qa(w, xq[f] + t * xq_stride[f], outs[i].y + t * w.rows + s0, s0, s1);
        }
      } else {
        k.matmat_qa(w, xq[f], T, outs[i].y, w.rows, r0, r1);
      }
    } else if (has_form(w.dtype)) {
      k.matmat_qa(w, xq[form_of(w.dtype)], T, outs[i].y, w.rows, r0, r1);
    } else {
      k.matmat(w, x, T, w.cols, outs[i].y, w.rows, r0, r1);
    }
  });
}

void linear(ThreadPool& pool, const kern::Mat& w, const float* x, int64_t T, float* y) {
  linear_multi(pool, x, T, {{&w, y}});
}

}  // namespace dory
