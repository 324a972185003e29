#pragma once
#include <vector>

#include "dory/model.h"

namespace dory {

// The loop structure as data: a list of virtual layers. Per-request loop
// counts (and later early exit) change the list, not the forward code.
struct Step {
  enum class Op { Layer, LoopBegin, LoopEnd, OutputBegin } op;
  int layer = -1;  // physical layer (shared weights) for Op::Layer
  int loop = 0;    // recurrent pass index; 0 outside the recurrent block
};

// The input block (if input), recurrent passes [first_loop, loops), the output
// block (if output). build_plan(c, loops) is a whole token.
std::vector<Step> build_plan(const DoryConfig& c, int loops, int first_loop = 0, bool input = true,
                             bool output = true);

}  // namespace dory
