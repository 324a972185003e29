#pragma once
#include <vector>

#include "dory/model.h"

namespace dory {

// The loop structure as data: a list of virtual layers. Per-request loop counts and early
// exit change the list, not the forward code. Each layer step names the cache slot its
// attention reads and writes, so a backend needs no one to tell it which cache to use.
struct Step {
  // Probe: the rows' hidden state as it stands (after the layer before it) is kept for
  // Backend::probe (a skill router's phi, token by token: --skill-dynamic).
  enum class Op { Layer, LoopBegin, LoopEnd, OutputBegin, Probe } op;
  int layer = -1;  // physical layer (shared weights) for Op::Layer
  int loop = 0;    // recurrent pass index; 0 outside the recurrent block
  // Op::Layer on an attention layer: its cache slot. per_loop: the pass index in the
  // recurrent block (one cache per loop); last_loop and outside the block: 0 (one cache
  // per physical layer).
  int slot = 0;
};

// The input block (if input), recurrent passes [first_loop, loops), the output
// block (if output). build_plan(c, kv, loops) is a whole token.
std::vector<Step> build_plan(const DoryConfig& c, KvMode kv, int loops, int first_loop = 0,
                             bool input = true, bool output = true);

}  // namespace dory
