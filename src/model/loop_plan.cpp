#include "model/loop_plan.h"

namespace dory {

std::vector<Step> build_plan(const DoryConfig& c, KvMode kv, int loops, int first_loop, bool input,
                             bool output) {
  std::vector<Step> plan;
  if (input)
    for (int i = 0; i < c.n_input; ++i) plan.push_back({Step::Op::Layer, i, 0, 0});
  for (int l = first_loop; l < loops; ++l) {
    plan.push_back({Step::Op::LoopBegin, -1, l, 0});
    for (int i = c.n_input; i < c.n_input + c.n_recurrent; ++i)
      plan.push_back({Step::Op::Layer, i, l, kv == KvMode::PerLoop ? l : 0});
    plan.push_back({Step::Op::LoopEnd, -1, l, 0});
  }
  if (!output) return plan;
  plan.push_back({Step::Op::OutputBegin, -1, 0, 0});
  for (int i = c.n_input + c.n_recurrent; i < c.n_layer; ++i)
    plan.push_back({Step::Op::Layer, i, 0, 0});
  return plan;
}

}  // namespace dory
