#include "model_text.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>

#include "dory/session.h"
#include "format/cmf.h"

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

namespace {
double env_or(const char* name, double def) {
  const char* e = std::getenv(name);
  if (!e || !*e) return def;
  char* end = nullptr;
  const double v = std::strtod(e, &end);
  if (*end || !std::isfinite(v)) throw Error(std::string(name) + "='" + e + "' is not a number");
  return v;
}

// Whether every tensor of skill `id` replaces an MLP layer's (backbone.layers.N.* with layer N
// an MLP in the pattern).
bool mlp_only(const cmf::File& f, const std::string& id, const DoryConfig& c) {
  const std::string pre = "skill." + id + ".backbone.layers.";
  bool any = false;
  for (const cmf::Tensor& t : f.tensors()) {
    if (t.name.rfind("skill." + id + ".", 0) != 0) continue;
    if (t.name.rfind(pre, 0) != 0) return false;
    const int64_t n = std::atoll(t.name.c_str() + pre.size());
    if (n < 0 || n >= c.n_layer || c.is_attention(n)) return false;
    any = true;
  }
  return any;
}
}  // namespace

DynamicSkills::DynamicSkills(const RunOpts& run, Loaded& l, std::span<const int32_t> prompt)
    : run_(run) {
  if (!run.skill.empty() && run.skill != "auto")
    throw Error("--skill-dynamic picks the skill itself: leave out --skill " + run.skill);
  const cmf::File* f = l.model->weights().cmf.get();
  if (!f) throw Error(l.model->path() + ": --skill-dynamic: skills live in CMF files; this model is not one");
  const DoryConfig& c = l.model->config();
  for (const cmf::Skill& k : f->skills()) {
    if (!k.routable || !mlp_only(*f, k.id, c)) continue;
    if (!k.selection_error.empty()) throw Error(f->path() + ": " + k.selection_error);
    if (layer_ >= 0 && k.selection.phi_layer != layer_)
      throw Error(f->path() + ": --skill-dynamic: the skills route on different layers (" +
                  std::to_string(layer_) + ", " + std::to_string(k.selection.phi_layer) + ")");
    layer_ = static_cast<int>(k.selection.phi_layer);
    ids_.push_back(k.id);
    sel_.push_back(&k.selection);
  }
  if (ids_.empty())
    throw Error(f->path() + ": --skill-dynamic: no skill with a router whose tensors are MLP weights only");
  on_ = env_or("DORY_SKILL_ON", on_), off_ = env_or("DORY_SKILL_OFF", off_);
  margin_ = env_or("DORY_SKILL_MARGIN", margin_), alpha_ = env_or("DORY_SKILL_ALPHA", alpha_);
  const double every = env_or("DORY_SKILL_EVERY", every_);
  if (every < 1 || every > 1e6 || alpha_ < 0 || alpha_ > 1)
    throw Error("DORY_SKILL_EVERY must be 1 or more and DORY_SKILL_ALPHA in [0, 1]");
  every_ = static_cast<int>(every);
  engines_.emplace_back("", l.backend);
  {
    Session probe(l.backend, run.session());  // the gate and backend checks, before any output
    probe.set_probe(layer_);
  }
  phi_ = prompt_phi(run, l.backend, prompt, layer_);
  decide(nullptr, "prompt");
  l.backend = engine(active_);
}

std::shared_ptr<Backend> DynamicSkills::engine(const std::string& id) {
  for (const auto& [k, b] : engines_)
    if (k == id) return b;
  auto model = Model::load(run_.model_path(), run_.placement(), id, run_.lora);
  engines_.emplace_back(id, run_.open(model));
  return engines_.back().second;
}

void DynamicSkills::attach(Session& s) const {
  s.set_probe(layer_);
}

void DynamicSkills::decide(Session* s, const char* when) {
  std::vector<double> e(ids_.size());
  size_t best = 0, cur = ids_.size();
  for (size_t i = 0; i < ids_.size(); ++i) {
    e[i] = cmf::skill_error(*sel_[i], phi_);
    if (e[i] < e[best]) best = i;
    if (ids_[i] == active_) cur = i;
  }
  std::string next = active_;
  if (cur == ids_.size()) {
    if (e[best] < on_) next = ids_[best];
  } else if (e[cur] > off_) {
    next = best != cur && e[best] < on_ ? ids_[best] : "";
  } else if (best != cur && e[best] < e[cur] - margin_) {
    next = ids_[best];
  }
  if (next == active_ && s) return;
  std::string line = std::string("skill dynamic: ") + when + ": " +
                     (active_.empty() ? "none" : "'" + active_ + "'") + " -> " +
                     (next.empty() ? "none" : "'" + next + "'") + " (E";
  for (size_t i = 0; i < ids_.size(); ++i) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " %s %.4f", ids_[i].c_str(), e[i]);
    line += buf;
  }
  std::fprintf(stderr, "%s)\n", line.c_str());
  active_ = next;
  if (s) s->switch_backend(engine(active_));
}

void DynamicSkills::after_token(Session& s) {
  const std::vector<float>& h = s.probed();
  const size_t H = phi_.size();
  if (h.size() < H) return;  // the pass took no whole-token plan (nothing to read)
  const float* row = h.data() + h.size() - H;
  for (size_t i = 0; i < H; ++i)
    phi_[i] = static_cast<float>((1 - alpha_) * phi_[i] + alpha_ * row[i]);
  if (++tokens_ % every_ == 0) decide(&s, ("token " + std::to_string(tokens_)).c_str());
}

std::string chat_template_source(const Tokenizer& tok) {
  if (!tok.chat_template().empty()) return tok.chat_template();
  std::fprintf(stderr, "note: the model has no chat template; using ChatML\n");
  return "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
         "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
         "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
}

}  // namespace dory::cli
