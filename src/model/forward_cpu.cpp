#include "model/forward_cpu.h"

#include <algorithm>

#include "model/ops.h"

namespace dory {

void Scratch::reserve(const DoryConfig& c, int64_t T) {
  const int64_t H = c.hidden, QW = c.n_head * c.head_dim, KW = c.n_kv_head * c.head_dim;
  for (auto* v : {&x, &inp, &state, &out}) v->resize(T * H);
  for (auto* v : {&q, &g, &att}) v->resize(T * QW);
  for (auto* v : {&k, &v}) v->resize(T * KW);
  for (auto* v : {&ff_g, &ff_u}) v->resize(T * c.ffn);
}

void forward_chunk(const Weights& w, ThreadPool& pool, Scratch& s, const ChunkArgs& a,
                   const std::vector<Step>& plan, const CacheFor& cache_for, int64_t logit_row0,
                   float* logits) {
  const DoryConfig& c = w.cfg;
  const int64_t T = a.T, H = c.hidden;
  s.reserve(c, T);
  s.rope[0].build(c.rope_theta, c.rotary_dims(1), a.start, T);
  s.rope[1].build(c.rope_theta_2, c.rotary_dims(2), a.start, T);

  // Layer 0 sees the raw, un-normalized embedding row.
  for (int64_t t = 0; t < T; ++t) w.embd.to_f32(int64_t(a.ids[t]) * H, H, s.x.data() + t * H);

  for (const Step& st : plan) {
    switch (st.op) {
      case Step::Op::Layer: {
        const LayerWeights& L = w.layers[st.layer];
        if (L.kind == '-') mlp_layer(w, L, pool, s, a);
        else attention_layer(w, L, pool, s, a, cache_for(st.layer, st.loop));
        break;
      }
      case Step::Op::LoopBegin:  // h = n(state + inp); state starts as inp
        if (st.loop == 0) {
          std::copy_n(s.x.data(), T * H, s.inp.data());
          std::copy_n(s.x.data(), T * H, s.state.data());
        }
        for (int64_t i = 0; i < T * H; ++i) s.x[i] = s.state[i] + s.inp[i];
        for (int64_t t = 0; t < T; ++t) normalize(s.x.data() + t * H, H);
        break;
      case Step::Op::LoopEnd:  // state = n(h)
        std::copy_n(s.x.data(), T * H, s.state.data());
        for (int64_t t = 0; t < T; ++t) normalize(s.state.data() + t * H, H);
        break;
      case Step::Op::OutputBegin:
        std::copy_n(s.state.data(), T * H, s.x.data());
        break;
    }
  }

  // No final norm. logits = (lm_head . h) * logit_scale / sigma
  const int64_t rows = T - logit_row0;
  if (rows <= 0) return;
  linear(pool, w.lm_head, s.x.data() + logit_row0 * H, rows, logits);
  const int64_t V = c.vocab;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < V; ++i) logits[r * V + i] *= w.logit_scale[i];
}

}  // namespace dory
