#pragma once
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "format/cmf.h"
#include "model/skill_switch.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace dory::cli {

// A model with its tokenizer (tokenizer.json beside the weights, a GGUF's own tokenizer.ggml.*
// metadata, or --tokenizer).
struct Loaded {
  std::shared_ptr<const Model> model;
  std::shared_ptr<Backend> backend;  // --device's, with the model on it
  std::unique_ptr<Tokenizer> tok;
};
// With --skill auto the base model is loaded (no skill yet): route_skill picks one.
Loaded load_model_and_tokenizer(const RunOpts& run, const std::string& tokenizer_path);

// --skill auto (CMF files, CMF.md section 3): phi of the prompt `ids` under each routable
// skill's router, the skill with the smallest E; the model is reloaded with that skill's
// tensors in place (a file with no routable skill: an error). One line to stderr names
// the choice and every E. Returns the chosen id; without --skill auto, does nothing and
// returns run.skill.
std::string route_skill(const RunOpts& run, Loaded& l, std::span<const int32_t> ids);

// Commands that have no one prompt to route on refuse --skill auto with this one line.
void refuse_auto_skill(const RunOpts& run, const char* command);

// A skill router's phi of `ids` (Session::mean_hidden after `layer`) in a fresh session of
// `run`'s settings with the gate, the far field and exact rows off.
std::vector<float> prompt_phi(const RunOpts& run, const std::shared_ptr<Backend>& backend,
                              std::span<const int32_t> ids, int layer);

// Every routable skill's E for `ids` (the base model's hidden states), in file order.
std::vector<std::pair<std::string, double>> skill_errors(const RunOpts& run, const Loaded& l,
                                                         std::span<const int32_t> ids);

// --skill-dynamic (cortiq's --route-dynamic, CMF.md section 3): the skill follows the text as
// it is generated, as SkillSwitch (model/skill_switch.h) decides: phi from the prompt on the
// base weights, then the generated tokens' hidden states, read from the running engine's pass
// (Session::set_probe). A switch moves the session to that skill's engine
// (Session::switch_backend; engines made on first use). Each decision that changes the skill
// is one line on stderr. Gate off (the session refuses otherwise).
// The checks --skill-dynamic makes before any output: a session of `run`'s settings on
// `backend` reads hidden states at sw.layer() (the gate off; Error otherwise).
void check_skill_probe(const RunOpts& run, const std::shared_ptr<Backend>& backend, const SkillSwitch& sw);
// After a generated token's pass on `s` (probing at sw.layer()): the switch takes the token's
// hidden row; when the skill changes, the session moves to engine(new skill) and the decision's
// line comes back (else "").
std::string follow_skill(SkillSwitch& sw, Session& s,
                         const std::function<std::shared_ptr<Backend>(const std::string&)>& engine);

// Engines of one model with each skill's tensors in place ("" = the base weights), made on
// first use and kept (mapped views, nothing copied on the CPU); safe from several threads.
class SkillEngines {
 public:
  explicit SkillEngines(RunOpts run) : run_(std::move(run)) {}
  void put(const std::string& id, std::shared_ptr<Backend> backend);  // one made elsewhere
  std::shared_ptr<Backend> get(const std::string& id);

 private:
  RunOpts run_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Backend>> engines_;
};

class DynamicSkills {
 public:
  // Checks the file and picks the prompt's skill; l.backend becomes that skill's engine.
  DynamicSkills(const RunOpts& run, Loaded& l, std::span<const int32_t> prompt);
  // A session made on l.backend after the constructor: reads phi from its passes.
  void attach(Session& s) const;
  // After each generated token's pass (GenerateParams::after_token).
  void after_token(Session& s);

 private:
  std::unique_ptr<SkillSwitch> sw_;
  SkillEngines engines_;
};
// Commands that generate no text refuse --skill-dynamic with this one line.
void refuse_dynamic_skill(const RunOpts& run, const char* command);

// The model's chat template, or ChatML (with a note on stderr) when it has none.
std::string chat_template_source(const Tokenizer& tok);

}  // namespace dory::cli
