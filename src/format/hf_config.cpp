#include "format/hf_config.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "format/config_keys.h"
#include "format/mapped_file.h"

namespace dory {

using nlohmann::json;

namespace {

struct Reader {
  const json& j;
  const std::string& where;

  Error err(const std::string& key, const std::string& why) const {
    return Error(where + ": key '" + key + "' " + why);
  }
  bool has(const std::string& k) const { return j.contains(k) && !j[k].is_null(); }
  const json& need(const std::string& k) const {
    if (!j.contains(k)) throw err(k, "is missing");
    if (j[k].is_null()) throw err(k, "is null");
    return j[k];
  }
  int64_t integer(const std::string& k) const {
    const json& v = need(k);
    if (!v.is_number_integer()) throw err(k, "must be an integer, found " + v.dump());
    return v.get<int64_t>();
  }
  int64_t integer_or(const std::string& k, int64_t dflt) const { return has(k) ? integer(k) : dflt; }
  double number(const std::string& k) const {
    const json& v = need(k);
    if (!v.is_number()) throw err(k, "must be a number, found " + v.dump());
    double d = v.get<double>();
    if (!std::isfinite(d)) throw err(k, "must be finite");
    return d;
  }
  double number_or(const std::string& k, double dflt) const { return has(k) ? number(k) : dflt; }
  std::string string(const std::string& k) const {
    const json& v = need(k);
    if (!v.is_string()) throw err(k, "must be a string, found " + v.dump());
    return v.get<std::string>();
  }
  // A fixed-value key: absent means the required value; present must equal it.
  void fixed(const std::string& k, const json& required) const {
    if (!j.contains(k)) return;
    if (j[k] != required)
      throw err(k, "is " + j[k].dump() + ", but Dory requires " + required.dump());
  }
  std::vector<int64_t> ids(const std::string& k) const {
    std::vector<int64_t> out;
    if (!has(k)) return out;
    const json& v = j[k];
    if (v.is_number_integer()) out.push_back(v.get<int64_t>());
    else if (v.is_array()) {
      for (const auto& e : v) {
        if (!e.is_number_integer()) throw err(k, "must hold integers, found " + e.dump());
        out.push_back(e.get<int64_t>());
      }
    } else throw err(k, "must be an integer or a list of integers");
    return out;
  }
};

}  // namespace

DoryConfig parse_hf_config_text(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(where + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(where + ": not a JSON object");
  Reader r{j, where};

  if (r.has("architectures")) {
    const json& a = j["architectures"];
    bool ok = a.is_array() && !a.empty() && a[0].is_string();
    if (!ok || a[0].get<std::string>() != "DoryForCausalLM")
      throw r.err("architectures", "is " + a.dump() + ", expected [\"DoryForCausalLM\"]");
  }
  if (r.has("model_type") && j["model_type"] != "dory")
    throw r.err("model_type", "is " + j["model_type"].dump() + ", expected \"dory\"");

  DoryConfig c;
  // The plain keys, from the one table (format/config_keys.h); the special ones below.
  read_config_keys(r, false, c);
  if (r.has("attention_head_dim")) {
    c.head_dim = r.integer("attention_head_dim");
    if (r.has("head_dim") && r.integer("head_dim") != c.head_dim)
      throw r.err("head_dim", "is " + std::to_string(r.integer("head_dim")) +
                                  " but attention_head_dim is " + std::to_string(c.head_dim) +
                                  "; they must agree");
  } else {
    c.head_dim = r.integer("head_dim");  // error names head_dim if both are absent
  }
  if (r.has("recurrent_kv_cache_mode")) {
    try {
      c.kv_mode = parse_kv_mode(r.string("recurrent_kv_cache_mode"));
    } catch (const Error& e) {
      throw r.err("recurrent_kv_cache_mode", e.what());
    }
  }
  c.partial_rotary = r.number_or("partial_rotary_factor", 1.0);
  c.partial_rotary_2 = r.number_or("partial_rotary_factor_2", c.partial_rotary);
  if (r.has("rope_profile_layers")) {
    const json& p = j["rope_profile_layers"];
    if (!p.is_array()) throw r.err("rope_profile_layers", "must be a list");
    for (const auto& e : p) {
      if (!e.is_number_integer())
        throw r.err("rope_profile_layers", "must hold integers, found " + e.dump());
      // Checked as int64 before narrowing, so 4294967297 is not taken for 1.
      const int64_t p64 = e.get<int64_t>();
      if (p64 != 1 && p64 != 2)
        throw r.err("rope_profile_layers", "holds " + e.dump() + " (allowed: 1, 2)");
      c.rope_profile.push_back(static_cast<int>(p64));
    }
  } else if (c.n_layer > 0 && c.n_layer < (1 << 20)) {
    c.rope_profile.assign(c.n_layer, 1);
  }
  if (r.has("no_rope_layers")) {
    for (const auto& e : j["no_rope_layers"])
      if (e != 0) throw r.err("no_rope_layers", "must be all zeros: Dory has no NoPE layers");
  }
  if (r.has("attention_output_gate_logit_scale_init"))
    c.gate_init = r.number("attention_output_gate_logit_scale_init");
  c.bos_ids = r.ids("bos_token_id");
  c.eos_ids = r.ids("eos_token_id");

  r.fixed("dory_format_version", 1);
  r.fixed("tie_word_embeddings", false);
  r.fixed("ngpt", true);
  r.fixed("fngpt", true);
  r.fixed("ngpt_enable_final_norm", false);
  r.fixed("attention_output_gate", true);
  r.fixed("mlp_hidden_act", "silu");
  r.fixed("mlp_bias", false);
  r.fixed("attention_bias", false);
  r.fixed("initial_state", "input_copy");
  r.fixed("input_transform", "residual");
  r.fixed("output_transform", "replace");
  r.fixed("mixer_type", nullptr);
  const struct {
    const char *key, *full;
    int64_t want;
  } swa[] = {{"swa_num_attention_heads", "num_attention_heads", c.n_head},
             {"swa_num_key_value_heads", "num_key_value_heads", c.n_kv_head},
             {"swa_head_dim", "attention_head_dim", c.head_dim}};
  for (const auto& s : swa)
    if (r.has(s.key) && r.integer(s.key) != s.want)
      throw r.err(s.key, std::string("must equal ") + s.full + " (" + std::to_string(s.want) +
                             "): sliding and full attention share dimensions");
  c.validate(where);
  return c;
}

DoryConfig parse_hf_config(const std::string& path) {
  return parse_hf_config_text(read_text_file(path), path);
}

json read_json_file(const std::string& path) {
  const std::string text = read_text_file(path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
}

std::string hf_config_json(const DoryConfig& c) {
  json j = json::object();
  j["architectures"] = {"DoryForCausalLM"};
  j["model_type"] = "dory";
  for (const ConfigKey& k : config_keys()) {
    if (!k.hf) continue;
    switch (k.kind) {
      case ConfigKey::Kind::Int: j[k.hf] = c.*k.i; break;
      case ConfigKey::Kind::Float: j[k.hf] = c.*k.f; break;
      case ConfigKey::Kind::String: j[k.hf] = c.*k.s; break;
      case ConfigKey::Kind::Special: break;
    }
  }
  j["attention_head_dim"] = c.head_dim;
  j["head_dim"] = c.head_dim;
  j["recurrent_kv_cache_mode"] = kv_mode_name(c.kv_mode);
  j["partial_rotary_factor"] = c.partial_rotary;
  j["partial_rotary_factor_2"] = c.partial_rotary_2;
  j["rope_profile_layers"] = c.rope_profile;
  j["attention_output_gate_logit_scale_init"] = c.gate_init ? json(*c.gate_init) : json(nullptr);
  if (c.bos_ids.size() == 1) j["bos_token_id"] = c.bos_ids[0];
  else if (!c.bos_ids.empty()) j["bos_token_id"] = c.bos_ids;
  if (c.eos_ids.size() == 1) j["eos_token_id"] = c.eos_ids[0];
  else if (!c.eos_ids.empty()) j["eos_token_id"] = c.eos_ids;
  j["tie_word_embeddings"] = false;
  return j.dump(2);
}

}  // namespace dory
