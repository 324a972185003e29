#include "backend/cpu/forward.h"

#include <algorithm>

#include "backend/cpu/ops.h"

namespace dory {

void Scratch::reserve(const DoryConfig& c, int64_t T) {
  const int64_t H = c.hidden, QW = c.n_head * c.head_dim, KW = c.n_kv_head * c.head_dim;
  for (auto* v : {&x, &inp, &state, &out, &probe}) v->resize(T * H);
  for (auto* v : {&q, &g, &att}) v->resize(T * QW);
  for (auto* v : {&k, &v}) v->resize(T * KW);
  for (auto* v : {&ff_g, &ff_u}) v->resize(T * c.ffn);
}

namespace {

// The plan over the rows already in s.x (embeddings in, last hidden state out).
// attn(L, step) runs one attention layer: the only part that depends on how
// rows map to sequences and caches.
template <class Attn>
void run_plan(const Weights& w, ThreadPool& pool, Scratch& s, const ChunkArgs& a,
              std::span<const Step> plan, const Attn& attn) {
  const int64_t T = a.T, H = w.cfg.hidden;
  for (const Step& st : plan) {
    switch (st.op) {
      case Step::Op::Layer: {
        const LayerWeights& L = w.layers[st.layer];
        if (L.kind == '-') mlp_layer(w, L, pool, s, a);
        else attn(L, st);
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
      case Step::Op::Probe:  // the layers' outputs are on the unit sphere already (nGPT)
        std::copy_n(s.x.data(), T * H, s.probe.data());
        break;
    }
  }
}

// Layer 0 sees the raw, un-normalized embedding row.
void embed(const Weights& w, Scratch& s, const ChunkArgs& a) {
  const int64_t H = w.cfg.hidden;
  for (int64_t t = 0; t < a.T; ++t) w.embd.to_f32(int64_t(a.ids[t]) * H, H, s.x.data() + t * H);
}

// No final norm. logits = (lm_head . h) * logit_scale / sigma, for `rows` rows at h.
void head(const Weights& w, ThreadPool& pool, const float* h, int64_t rows, float* logits) {
  if (rows <= 0) return;
  linear(pool, w.lm_head, h, rows, logits);
  const int64_t V = w.cfg.vocab;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < V; ++i) logits[r * V + i] *= w.logit_scale[i];
}

// What every chunk starts with: scratch, the RoPE tables of its positions, the embeddings.
void begin_chunk(const Weights& w, Scratch& s, const ChunkArgs& a) {
  const DoryConfig& c = w.cfg;
  s.reserve(c, a.T);
  s.rope[0].build(c.rope_theta, c.rotary_dims(1), a);
  s.rope[1].build(c.rope_theta_2, c.rotary_dims(2), a);
  embed(w, s, a);
}

}  // namespace

void forward_begin(const Weights& w, Scratch& s, const ChunkArgs& a) { begin_chunk(w, s, a); }

void forward_steps(const Weights& w, ThreadPool& pool, Scratch& s, const ChunkArgs& a,
                   std::span<const Step> plan, const StepCaches& caches) {
  run_plan(w, pool, s, a, plan, [&](const LayerWeights& L, const Step& st) {
    attention_layer(w, L, pool, s, a, caches(st));
  });
}

void forward_head(const Weights& w, ThreadPool& pool, const float* h, int64_t rows, float* logits) {
  head(w, pool, h, rows, logits);
}

}  // namespace dory
