// --skill-dynamic's decisions (cortiq's --route-dynamic, CMF.md section 3), shared by dory
// run / chat and the server: which CMF skill runs as the text goes.
//
// phi starts as the prompt's (the base model's mean hidden state after the routers'
// phi_layer) and then moves as an EMA over the generated tokens' hidden states at that layer
// (factor alpha 0.2); every 8 tokens each candidate's E is taken and, with hysteresis:
//   no skill on:  the best one turns on when its E < 0.62;
//   skill a on:   when E_a > 0.74 it turns off (or over to the best, if that one's E < 0.62);
//                 else the best turns on instead of a when its E < E_a - 0.03 (the rival margin).
// Candidates: routable skills whose tensors are MLP tensors only (attention weights stay the
// base's, so the cache written so far stays the cache); they must route on one phi_layer.
// The thresholds, factor and interval come from DORY_SKILL_ON, DORY_SKILL_OFF,
// DORY_SKILL_MARGIN, DORY_SKILL_ALPHA and DORY_SKILL_EVERY where set, as cortiq's are
// env-tunable.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dory/model.h"
#include "format/cmf.h"

namespace dory {

class SkillSwitch {
 public:
  // The candidates of `f` for a model of config `c` (Error with one line when there are none,
  // they route on different layers, or a router is broken; `what` names the feature in it).
  SkillSwitch(const cmf::File& f, const DoryConfig& c, const std::string& what = "--skill-dynamic");
  // The layer whose hidden state phi reads (Session::set_probe, Session::mean_hidden).
  int layer() const { return layer_; }
  // The prompt's phi: the first decision. Returns its line ("prompt: none -> 'x' (E ...)").
  std::string start(std::vector<float> phi);
  // After a generated token's pass, its hidden row at layer() (H floats): the EMA, and every
  // `every` tokens a decision. Returns the decision's line when the skill changes, else "".
  std::string after_token(const float* row);
  // The skill on now ("" = none, the base weights).
  const std::string& active() const { return active_; }

 private:
  std::string decide(const std::string& when, bool always);
  std::vector<std::string> ids_;
  std::vector<const cmf::Selection*> sel_;  // the candidates' routers, in ids_ order
  int layer_ = -1;
  double on_ = 0.62, off_ = 0.74, margin_ = 0.03, alpha_ = 0.2;
  int every_ = 8;
  int64_t tokens_ = 0;
  std::vector<float> phi_;
  std::string active_;
};

}  // namespace dory
