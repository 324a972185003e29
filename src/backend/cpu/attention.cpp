// Attention sub-layer (S: sliding window, *: full): projections, RoPE, nGPT
// q/k normalization, causal GQA softmax attention over the KV cache, the
// sigmoid output gate, the row norm and the output projection.
#include <algorithm>
#include <cmath>

#include "backend/cpu/far_field.h"
#include "backend/cpu/forward.h"
#include "backend/cpu/ops.h"

namespace dory {

void RopeTable::build(double theta, int64_t rotary_dims, const ChunkArgs& a) {
  half = rotary_dims / 2;
  cos.resize(a.T * half);
  sin.resize(a.T * half);
  for (int64_t j = 0; j < half; ++j) {
    const double inv_freq = std::pow(theta, -2.0 * double(j) / double(rotary_dims));
    for (int64_t t = 0; t < a.T; ++t) {
      const double ang = double(a.position(t)) * inv_freq;  // double: positions reach 1e5+
      cos[t * half + j] = static_cast<float>(std::cos(ang));
      sin[t * half + j] = static_cast<float>(std::sin(ang));
    }
  }
}

namespace {

// NeoX halves: pairs (j, j + r/2) over the first r dims of each head.
void apply_rope(float* head, const float* c, const float* s, int64_t half) {
  for (int64_t j = 0; j < half; ++j) {
    const float a = head[j], b = head[j + half];
    head[j] = a * c[j] - b * s[j];
    head[j + half] = b * c[j] + a * s[j];
  }
}

}  // namespace

void attention_layer(const Weights& w, const LayerWeights& L, ThreadPool& pool, Scratch& s,
                     const ChunkArgs& a, KvCache& cache) {
  KvCache* one = &cache;
  attention_layer(w, L, pool, s, a, std::span<KvCache* const>(&one, 1));
}

void attention_layer(const Weights& w, const LayerWeights& L, ThreadPool& pool, Scratch& s,
                     const ChunkArgs& a, std::span<KvCache* const> caches) {
  const DoryConfig& c = w.cfg;
  const int64_t T = a.T, H = c.hidden, hd = c.head_dim, nh = c.n_head, nk = c.n_kv_head;
  const int64_t QW = nh * hd, KW = nk * hd, group = nh / nk;

  linear_multi(pool, s.x.data(), T,
               {{&L.wq, s.q.data()}, {&L.wk, s.k.data()}, {&L.wv, s.v.data()}, {&L.wg, s.g.data()}});

  // RoPE, then q <- q_scale * n(q) and k <- n(k) per head; k, v go to the cache.
  const RopeTable& rope = s.rope[L.rope_profile - 1];
  // Each sequence's run of rows becomes writable in its own cache.
  for (int64_t t0 = 0, t1; t0 < T; t0 = t1) {
    for (t1 = t0 + 1; t1 < T && a.sequence(t1) == a.sequence(t0);) ++t1;
    caches[a.sequence(t0)]->begin_write(a.position(t0), a.position(t1 - 1) + 1);
  }
  for (int64_t t = 0; t < T; ++t) {
    KvCache& cache = *caches[a.sequence(t)];
    const int64_t p = a.position(t);
    const float* cs = rope.cos.data() + t * rope.half;
    const float* sn = rope.sin.data() + t * rope.half;
    for (int64_t h = 0; h < nh; ++h) {
      float* qh = s.q.data() + t * QW + h * hd;
      apply_rope(qh, cs, sn, rope.half);
      normalize(qh, hd);
      const float* qs = L.q_scale.data() + h * hd;
      for (int64_t d = 0; d < hd; ++d) qh[d] *= qs[d];
    }
    // A full slot with the far field keeps queries for its landmarks.
    if (cache.wants_q(p)) cache.put_q(p, s.q.data() + t * QW);
    float* kc = cache.k(p);
    float* vc = cache.v(p);
    for (int64_t h = 0; h < nk; ++h) {
      float* kh = s.k.data() + t * KW + h * hd;
      apply_rope(kh, cs, sn, rope.half);
      normalize(kh, hd);
    }
    std::copy_n(s.k.data() + t * KW, KW, kc);
    std::copy_n(s.v.data() + t * KW, KW, vc);
  }

  // Softmax attention per (row, KV head): the query heads that share a KV head go
  // together, so each key and value row is read from memory once for all of them
  // (at long context the caches are far larger than the caches of the CPU).
  const kern::KernelSet& kk = kern::kernels();
  const float inv_sqrt_hd = static_cast<float>(1.0 / std::sqrt(double(hd)));
  const bool sliding = L.kind == 'S';
  pool.run(T * nk, [&](int64_t task) {
    const int64_t t = task / nk, kvh = task % nk;
    const int64_t p = a.position(t);
    const KvCache& cache = *caches[a.sequence(t)];
    const float* q0 = s.q.data() + t * QW + kvh * group * hd;  // the group's first query head
    float* out0 = s.att.data() + t * QW + kvh * group * hd;
    if (!sliding && cache.far()) {
      // Sealed full slot: exact over the pinned rows and the window, Nystrom over the rest.
      for (int64_t i = 0; i < group; ++i)
        cache.far()->attend(kvh * group + i, q0 + i * hd, p, [&](int64_t j) { return cache.k(j); },
                            [&](int64_t j) { return cache.v(j); }, out0 + i * hd);
      return;
    }
    const int64_t lo = sliding ? std::max<int64_t>(0, p - c.swa_window + 1) : 0, n = p - lo + 1;
    const int64_t stride = cache.row_width();
    const int nq = static_cast<int>(group);
    thread_local std::vector<float> sc;
    sc.resize(group * n);
    // Scores and weighted values over the rows' contiguous runs (a ring wraps once at most).
    for (int64_t j0 = lo, j1; j0 <= p; j0 = j1) {
      j1 = cache.run_end(j0, p + 1);
      kk.attn_scores(q0, nq, cache.k(j0) + kvh * hd, stride, j1 - j0, hd, sc.data() + (j0 - lo), n);
    }
    for (int64_t i = 0; i < group; ++i) {
      float* si = sc.data() + i * n;
      float mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) mx = std::max(mx, si[j] *= inv_sqrt_hd);
      double sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        si[j] = std::exp(si[j] - mx);
        sum += si[j];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j < n; ++j) si[j] *= inv;
    }
    for (int64_t j0 = lo, j1; j0 <= p; j0 = j1) {
      j1 = cache.run_end(j0, p + 1);
      kk.attn_values(sc.data() + (j0 - lo), n, nq, cache.v(j0) + kvh * hd, stride, j1 - j0, hd, out0, j0 > lo);
    }
  });

  // Output gate, then n() over the whole nh*hd row, then o_proj.
  for (int64_t t = 0; t < T; ++t) {
    float* y = s.att.data() + t * QW;
    const float* g = s.g.data() + t * QW;
    thread_local std::vector<float> sig;
    sig.resize(QW);
    kk.sigmoid(g, L.gate_scale.data(), sig.data(), QW);
    for (int64_t i = 0; i < QW; ++i) y[i] *= sig[i];
    normalize(y, QW);
  }
  linear(pool, L.wo, s.att.data(), T, s.out.data());
  for (int64_t t = 0; t < T; ++t)
    ngpt_residual(s.x.data() + t * H, s.out.data() + t * H, L.alpha.data(), H);
}

}  // namespace dory
