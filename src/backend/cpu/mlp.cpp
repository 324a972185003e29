// SwiGLU MLP sub-layer with nGPT suv scaling and the fnGPT norm before down.
#include <vector>

#include "backend/cpu/forward.h"
#include "backend/cpu/ops.h"
#include "tensor/kernels.h"

namespace dory {

void mlp_layer(const Weights& w, const LayerWeights& L, ThreadPool& pool, Scratch& s,
               const ChunkArgs& a) {
  const int64_t T = a.T, H = w.cfg.hidden, F = w.cfg.ffn;
  linear_multi(pool, s.x.data(), T, {{&L.w_gate, s.ff_g.data()}, {&L.w_up, s.ff_u.data()}});
  // silu(g * suv_gate) * (u * suv_up); the sigmoid through the kernels (a
  // vector exp: 2.7 -> 0.5 ns an element; 7168 of them per layer and loop).
  const kern::KernelSet& kk = kern::kernels();
  thread_local std::vector<float> sig;
  sig.resize(F);
  for (int64_t t = 0; t < T; ++t) {
    float* g = s.ff_g.data() + t * F;
    const float* u = s.ff_u.data() + t * F;
    kk.sigmoid(g, L.suv_gate.data(), sig.data(), F);
    for (int64_t i = 0; i < F; ++i) g[i] = (g[i] * L.suv_gate[i]) * sig[i] * (u[i] * L.suv_up[i]);
    normalize(g, F);
  }
  linear(pool, L.w_down, s.ff_g.data(), T, s.out.data());
  for (int64_t t = 0; t < T; ++t)
    ngpt_residual(s.x.data() + t * H, s.out.data() + t * H, L.alpha.data(), H);
}

}  // namespace dory
