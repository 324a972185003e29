#include "model_text.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>

#include "dory/session.h"
#include "format/cmf.h"

#include "model/skill_switch.h"
#include "model/weights.h"

namespace dory::cli {

Loaded load_model_and_tokenizer(const RunOpts& run, const std::string& tokenizer_path) {
  Loaded l;
  check_device(run.backend_options());
  l.model = Model::load(run.model_path(), run.placement(), run.skill == "auto" ? "" : run.skill, run.lora);
  if (run.skill == "auto" && !l.model->weights().cmf)
    throw Error(l.model->path() + ": --skill auto: skills live in CMF files; this model is not one");
  l.backend = run.open(l.model);
  // Without --tokenizer: the model's directory (tokenizer.json), or for a GGUF model the
  // tokenizer.ggml.* metadata inside it (Tokenizer::from_path tells them apart).
  try {
    if (const cmf::File* f = l.model->weights().cmf.get(); f && tokenizer_path.empty()) {
      // A CMF file carries tokenizer.json's bytes and the chat template in its header.
      if (f->vocab().empty()) throw Error(f->path() + ": the CMF file has no tokenizer section");
      nlohmann::json tc = nlohmann::json::object();
      if (!f->chat_template().empty()) tc["chat_template"] = f->chat_template();
      l.tok = Tokenizer::from_json(f->vocab(), tc.dump(), f->path() + " (tokenizer section)",
                                   f->path() + " (header tokenizer_config)");
    } else {
      l.tok = Tokenizer::from_path(tokenizer_path.empty() ? l.model->path() : tokenizer_path);
    }
  } catch (const Error& e) {
    if (!tokenizer_path.empty()) throw;
    throw Error(std::string(e.what()) + " (give --tokenizer DIR|tokenizer.json)");
  }
  const int64_t V = l.model->config().vocab, tv = l.tok->vocab_size();
  if (tv > V)
    throw Error("the tokenizer has " + std::to_string(tv) + " tokens but the model's vocabulary is " +
                std::to_string(V) + ": they do not belong together");
  return l;
}

std::vector<float> prompt_phi(const RunOpts& run, const std::shared_ptr<Backend>& backend,
                              std::span<const int32_t> ids, int layer) {
  SessionOptions so = run.session();
  so.gate = GateParams{};
  so.o1 = O1Params{};
  so.exact = ExactParams{};
  Session s(backend, so);
  return s.mean_hidden(ids, layer);
}

std::vector<std::pair<std::string, double>> skill_errors(const RunOpts& run, const Loaded& l,
                                                         std::span<const int32_t> ids) {
  const cmf::File* f = l.model->weights().cmf.get();
  if (!f) throw Error(l.model->path() + ": skills live in CMF files; this model is not one");
  std::vector<std::pair<std::string, double>> out;
  std::map<int64_t, std::vector<float>> phi;  // one forward per phi_layer
  for (const cmf::Skill& k : f->skills()) {
    if (!k.routable) continue;
    if (!k.selection_error.empty()) throw Error(f->path() + ": " + k.selection_error);
    auto it = phi.find(k.selection.phi_layer);
    if (it == phi.end()) {
      it = phi.emplace(k.selection.phi_layer,
                       prompt_phi(run, l.backend, ids, static_cast<int>(k.selection.phi_layer)))
               .first;
    }
    out.emplace_back(k.id, cmf::skill_error(k.selection, it->second));
  }
  if (out.empty()) throw Error(f->path() + ": no skill with a router (selection) to route to");
  return out;
}

void refuse_auto_skill(const RunOpts& run, const char* command) {
  if (run.skill == "auto")
    throw Error(std::string("--skill auto routes one prompt (dory run, chat, logits); ") + command +
                " needs --skill ID or none");
}

std::string route_skill(const RunOpts& run, Loaded& l, std::span<const int32_t> ids) {
  if (run.skill != "auto") return run.skill;
  const auto errs = skill_errors(run, l, ids);
  size_t best = 0;
  for (size_t i = 1; i < errs.size(); ++i)
    if (errs[i].second < errs[best].second) best = i;
  std::string line = "skill auto: '" + errs[best].first + "' (E";
  for (const auto& [id, e] : errs) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " %s %.4f", id.c_str(), e);
    line += buf;
  }
  std::fprintf(stderr, "%s)\n", line.c_str());
  l.model = Model::load(run.model_path(), run.placement(), errs[best].first, run.lora);
  l.backend = run.open(l.model);
  return errs[best].first;
}

void refuse_dynamic_skill(const RunOpts& run, const char* command) {
  if (run.skill_dynamic)
    throw Error(std::string("--skill-dynamic follows generated text (dory run, chat); ") + command +
                " takes --skill ID, none or auto");
}

void SkillEngines::put(const std::string& id, std::shared_ptr<Backend> backend) {
  std::lock_guard<std::mutex> lk(mu_);
  engines_[id] = std::move(backend);
}

std::shared_ptr<Backend> SkillEngines::get(const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = engines_.find(id);
  if (it == engines_.end())
    it = engines_.emplace(id, run_.open(Model::load(run_.model_path(), run_.placement(), id, run_.lora))).first;
  return it->second;
}

DynamicSkills::DynamicSkills(const RunOpts& run, Loaded& l, std::span<const int32_t> prompt)
    : engines_(run) {
  if (!run.skill.empty() && run.skill != "auto")
    throw Error("--skill-dynamic picks the skill itself: leave out --skill " + run.skill);
  const cmf::File* f = l.model->weights().cmf.get();
  if (!f) throw Error(l.model->path() + ": --skill-dynamic: skills live in CMF files; this model is not one");
  sw_ = std::make_unique<SkillSwitch>(*f, l.model->config());
  engines_.put("", l.backend);
  check_skill_probe(run, l.backend, *sw_);
  std::fprintf(stderr, "skill dynamic: %s\n", sw_->start(prompt_phi(run, l.backend, prompt, sw_->layer())).c_str());
  l.backend = engines_.get(sw_->active());
}

void DynamicSkills::attach(Session& s) const {
  s.set_probe(sw_->layer());
}

void DynamicSkills::after_token(Session& s) {
  const std::string line = follow_skill(*sw_, s, [this](const std::string& id) { return engines_.get(id); });
  if (!line.empty()) std::fprintf(stderr, "skill dynamic: %s\n", line.c_str());
}

void check_skill_probe(const RunOpts& run, const std::shared_ptr<Backend>& backend, const SkillSwitch& sw) {
  Session probe(backend, run.session());
  probe.set_probe(sw.layer());
}

std::string follow_skill(SkillSwitch& sw, Session& s,
                         const std::function<std::shared_ptr<Backend>(const std::string&)>& engine) {
  const std::vector<float>& h = s.probed();
  const size_t H = static_cast<size_t>(s.model().config().hidden);
  if (h.size() < H) return "";  // the pass took no whole-token plan (nothing to read)
  std::string line = sw.after_token(h.data() + h.size() - H);
  if (!line.empty()) s.switch_backend(engine(sw.active()));
  return line;
}

std::string chat_template_source(const Tokenizer& tok) {
  if (!tok.chat_template().empty()) return tok.chat_template();
  std::fprintf(stderr, "note: the model has no chat template; using ChatML\n");
  return "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
         "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
         "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
}

}  // namespace dory::cli
