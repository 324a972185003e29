#include "model/skill_switch.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "dory/error.h"

namespace dory {

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

SkillSwitch::SkillSwitch(const cmf::File& f, const DoryConfig& c, const std::string& what) {
  for (const cmf::Skill& k : f.skills()) {
    if (!k.routable || !mlp_only(f, k.id, c)) continue;
    if (!k.selection_error.empty()) throw Error(f.path() + ": " + k.selection_error);
    if (layer_ >= 0 && k.selection.phi_layer != layer_)
      throw Error(f.path() + ": " + what + ": the skills route on different layers (" +
                  std::to_string(layer_) + ", " + std::to_string(k.selection.phi_layer) + ")");
    layer_ = static_cast<int>(k.selection.phi_layer);
    ids_.push_back(k.id);
    sel_.push_back(&k.selection);
  }
  if (ids_.empty())
    throw Error(f.path() + ": " + what + ": no skill with a router whose tensors are MLP weights only");
  on_ = env_or("DORY_SKILL_ON", on_), off_ = env_or("DORY_SKILL_OFF", off_);
  margin_ = env_or("DORY_SKILL_MARGIN", margin_), alpha_ = env_or("DORY_SKILL_ALPHA", alpha_);
  const double every = env_or("DORY_SKILL_EVERY", every_);
  if (every < 1 || every > 1e6 || alpha_ < 0 || alpha_ > 1)
    throw Error("DORY_SKILL_EVERY must be 1 or more and DORY_SKILL_ALPHA in [0, 1]");
  every_ = static_cast<int>(every);
}

std::string SkillSwitch::start(std::vector<float> phi) {
  phi_ = std::move(phi);
  tokens_ = 0;
  active_.clear();
  return decide("prompt", true);
}

std::string SkillSwitch::after_token(const float* row) {
  const size_t H = phi_.size();
  for (size_t i = 0; i < H; ++i)
    phi_[i] = static_cast<float>((1 - alpha_) * phi_[i] + alpha_ * row[i]);
  if (++tokens_ % every_ != 0) return "";
  return decide("token " + std::to_string(tokens_), false);
}

std::string SkillSwitch::decide(const std::string& when, bool always) {
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
  if (next == active_ && !always) return "";
  std::string line = when + ": " + (active_.empty() ? "none" : "'" + active_ + "'") + " -> " +
                     (next.empty() ? "none" : "'" + next + "'") + " (E";
  for (size_t i = 0; i < ids_.size(); ++i) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " %s %.4f", ids_[i].c_str(), e[i]);
    line += buf;
  }
  active_ = next;
  return line + ")";
}

}  // namespace dory
