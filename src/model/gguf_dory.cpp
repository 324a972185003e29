#include "model/gguf_dory.h"

#include "format/config_keys.h"
#include "format/hf_config.h"

#include <sys/stat.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>

#include "format/mapped_file.h"
#include "text/tokenizer.h"

namespace dory {

namespace {

bool file_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The shortest decimal that reads back as f, as a double: the value config.json had.
double shortest_decimal(float f) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, f);
  double d = f;
  std::from_chars(buf, r.ptr, d);
  return d;
}

struct Meta {
  const gguf::File& f;
  Error err(const std::string& key, const std::string& why) const {
    return Error(f.path() + ": key '" + key + "' " + why);
  }
  const gguf::Value* get(const std::string& k) const { return f.find(k); }
  const gguf::Value& need(const std::string& k) const {
    const gguf::Value* v = f.find(k);
    if (!v) throw err(k, "is missing");
    return *v;
  }
  static int64_t as_int(const Meta& m, const std::string& k, const gguf::Value& v) {
    if (!v.is_int())
      throw m.err(k, std::string("must be an integer, found ") + gguf::vtype_name(v.type));
    const bool is_unsigned = v.type == gguf::VType::U8 || v.type == gguf::VType::U16 ||
                             v.type == gguf::VType::U32 || v.type == gguf::VType::U64;
    if (is_unsigned && v.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw m.err(k, "is " + std::to_string(v.u) + ", out of range");
    return is_unsigned ? static_cast<int64_t>(v.u) : v.i;
  }
  int64_t integer(const std::string& k) const { return as_int(*this, k, need(k)); }
  int64_t integer_or(const std::string& k, int64_t d) const { return get(k) ? integer(k) : d; }
  bool has(const std::string& k) const { return get(k) != nullptr; }
  double number(const std::string& k) const {
    const gguf::Value& v = need(k);
    double d;
    if (v.type == gguf::VType::F32) d = shortest_decimal(static_cast<float>(v.f));
    else if (v.type == gguf::VType::F64) d = v.f;
    else if (v.is_int()) d = static_cast<double>(as_int(*this, k, v));
    else throw err(k, std::string("must be a number, found ") + gguf::vtype_name(v.type));
    if (!std::isfinite(d)) throw err(k, "must be finite");
    return d;
  }
  double number_or(const std::string& k, double d) const { return get(k) ? number(k) : d; }
  std::string string(const std::string& k) const {
    const gguf::Value& v = need(k);
    if (v.type != gguf::VType::STRING)
      throw err(k, std::string("must be a string, found ") + gguf::vtype_name(v.type));
    return v.s;
  }
};

}  // namespace

std::string gguf_tensor_name(const std::string& n) {
  if (n == "backbone.embeddings.weight") return "token_embd.weight";
  if (n == "lm_head.weight") return "output.weight";
  if (n == "lm_head.logit_scale") return "dory_logit_scale.weight";
  const std::string pre = "backbone.layers.";
  if (n.compare(0, pre.size(), pre) != 0) return "";
  const size_t dot = n.find('.', pre.size());
  if (dot == std::string::npos) return "";
  const std::string idx = n.substr(pre.size(), dot - pre.size());
  if (idx.empty() || idx.find_first_not_of("0123456789") != std::string::npos) return "";
  static const std::map<std::string, std::string> role = {
      {"mixer.q_proj.weight", "attn_q"},      {"mixer.k_proj.weight", "attn_k"},
      {"mixer.v_proj.weight", "attn_v"},      {"mixer.g_proj.weight", "attn_gate"},
      {"mixer.o_proj.weight", "attn_output"}, {"mixer.sqk", "dory_sqk"},
      {"mixer.s_gate", "dory_s_gate"},        {"attn_alpha", "dory_alpha"},
      {"mlp_alpha", "dory_alpha"},            {"mixer.gate_proj.weight", "ffn_gate"},
      {"mixer.up_proj.weight", "ffn_up"},     {"mixer.down_proj.weight", "ffn_down"},
      {"mixer.suv_gate", "dory_suv_gate"},    {"mixer.suv_up", "dory_suv_up"},
  };
  auto it = role.find(n.substr(dot + 1));
  if (it == role.end()) return "";
  return "blk." + idx + "." + it->second + ".weight";
}

DoryConfig config_from_gguf(const gguf::File& f) {
  Meta m{f};
  const std::string arch = m.string("general.architecture");
  if (arch != "dory")
    throw m.err("general.architecture", "is \"" + arch + "\", expected \"dory\"");
  DoryConfig c;
  // The plain keys, from the one table (format/config_keys.h); the special ones below.
  read_config_keys(m, true, c);
  c.head_dim = m.integer("dory.attention.key_length");
  if (m.get("dory.attention.value_length") && m.integer("dory.attention.value_length") != c.head_dim)
    throw m.err("dory.attention.value_length",
                "is " + std::to_string(m.integer("dory.attention.value_length")) +
                    " but dory.attention.key_length is " + std::to_string(c.head_dim) +
                    "; Dory needs them equal");
  if (m.get("dory.vocab_size")) {
  } else if (const gguf::TensorInfo* t = f.tensor("token_embd.weight"); t && t->ne.size() == 2) {
    c.vocab = t->ne[1];
  } else if (const gguf::Value* tk = m.get("tokenizer.ggml.tokens"); tk && tk->type == gguf::VType::ARRAY) {
    c.vocab = static_cast<int64_t>(tk->arr.size());
  } else {
    throw m.err("dory.vocab_size", "is missing (and there is no token_embd.weight to take it from)");
  }
  if (m.get("dory.recurrent_kv_cache_mode")) {
    try {
      c.kv_mode = parse_kv_mode(m.string("dory.recurrent_kv_cache_mode"));
    } catch (const Error& e) {
      if (std::string(e.what()).find(f.path()) == 0) throw;
      throw m.err("dory.recurrent_kv_cache_mode", e.what());
    }
  }
  if (m.get("dory.rope.dimension_count")) {
    const int64_t r = m.integer("dory.rope.dimension_count");
    if (r <= 0 || r > c.head_dim || r % 2)
      throw m.err("dory.rope.dimension_count",
                  "is " + std::to_string(r) + "; it must be positive, even and at most key_length (" +
                      std::to_string(c.head_dim) + ")");
    if (c.head_dim > 0) c.partial_rotary = c.partial_rotary_2 = double(r) / double(c.head_dim);
  }
  const gguf::Value& prof = m.need("dory.rope.profile");
  if (prof.type != gguf::VType::ARRAY)
    throw m.err("dory.rope.profile", std::string("must be an array, found ") + gguf::vtype_name(prof.type));
  for (const gguf::Value& e : prof.arr) {
    const int64_t p = Meta::as_int(m, "dory.rope.profile", e);
    if (p != 1 && p != 2)
      throw m.err("dory.rope.profile", "holds " + std::to_string(p) +
                                           " (allowed: 1, 2; 0 = no RoPE is not supported)");
    c.rope_profile.push_back(static_cast<int>(p));
  }
  if (m.get("dory.gate_init")) c.gate_init = m.number("dory.gate_init");
  if (m.get("tokenizer.ggml.bos_token_id")) c.bos_ids = {m.integer("tokenizer.ggml.bos_token_id")};
  if (m.get("tokenizer.ggml.eos_token_id")) c.eos_ids = {m.integer("tokenizer.ggml.eos_token_id")};
  try {
    c.validate(f.path());
  } catch (const Error& e) {
    // Name the GGUF key, not the config.json one validate() knows.
    std::string msg = e.what();
    const std::string head = f.path() + ": key '";
    if (msg.compare(0, head.size(), head) == 0) {
      const size_t end = msg.find('\'', head.size());
      const std::string key = msg.substr(head.size(), end - head.size());
      if (const std::string g = gguf_key_for(key); !g.empty()) msg = head + g + msg.substr(end);
    }
    throw Error(msg);
  }
  return c;
}

void write_dory_metadata(gguf::Writer& w, const DoryConfig& c) {
  using gguf::Value;
  using K = ConfigKey::Kind;
  auto u32 = [](int64_t v) { return Value::u32(static_cast<uint32_t>(v)); };
  auto f32 = [](double v) { return Value::f32(static_cast<float>(v)); };
  w.set("general.architecture", Value::str("dory"));
  // Every key of the table, in its order; the special ones by what they carry.
  for (const ConfigKey& k : config_keys()) {
    if (!k.gguf || !k.write) continue;
    const std::string g = k.gguf;
    switch (k.kind) {
      case K::Int: w.set(g, u32(c.*k.i)); break;
      case K::Float: w.set(g, f32(c.*k.f)); break;
      case K::String: w.set(g, Value::str(c.*k.s)); break;
      case K::Special:
        if (g == "dory.attention.key_length" || g == "dory.attention.value_length") {
          w.set(g, u32(c.head_dim));
        } else if (g == "dory.rope.dimension_count") {
          w.set(g, u32(c.rotary_dims(1)));
        } else if (g == "dory.recurrent_kv_cache_mode") {
          w.set(g, Value::str(kv_mode_name(c.kv_mode)));
        } else if (g == "dory.rope.profile") {
          w.set(g, Value::i32s(std::vector<int32_t>(c.rope_profile.begin(), c.rope_profile.end())));
        } else if (g == "dory.gate_init") {
          w.set(g, f32(c.g0()));
        } else {
          throw std::logic_error("write_dory_metadata: no writer for " + g);
        }
        break;
    }
  }
}

std::string write_tokenizer_metadata(gguf::Writer& w, const std::string& dir, int64_t vocab) {
  using gguf::Value;
  using nlohmann::json;
  const std::string tj = dir + "/tokenizer.json", tc = dir + "/tokenizer_config.json";
  std::string note;
  json cfg = json::object();
  if (file_exists(tc)) {
    cfg = read_json_file(tc);
    if (!cfg.is_object()) throw Error(tc + ": not a JSON object");
  }
  if (file_exists(tj)) {
    json j = read_json_file(tj);
    if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
      throw Error(tj + ": no \"model\" object");
    const json& model = j["model"];
    if (model.value("type", "") != "BPE" || !model.contains("vocab") || !model["vocab"].is_object())
      throw Error(tj + ": only BPE tokenizers can be embedded as tokenizer.ggml (model type '" +
                  model.value("type", std::string("?")) + "')");
    std::map<int64_t, std::string> by_id;
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
          it.value().get<int64_t>() >= (1 << 24))
        throw Error(tj + ": vocab entry '" + it.key() + "' has a bad id");
      by_id[it.value().get<int64_t>()] = it.key();
    }
    std::map<int64_t, int32_t> type_of;  // 3 control, 4 user defined
    if (j.contains("added_tokens") && j["added_tokens"].is_array())
      for (const auto& t : j["added_tokens"]) {
        if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
            !t.contains("content") || !t["content"].is_string())
          throw Error(tj + ": bad added_tokens entry");
        const int64_t id = t["id"].get<int64_t>();
        if (id < 0 || id >= (1 << 24)) throw Error(tj + ": added token id out of range");
        by_id[id] = t["content"].get<std::string>();
        type_of[id] = t.value("special", false) ? 3 : 4;
      }
    int64_t n = by_id.empty() ? 0 : by_id.rbegin()->first + 1;
    if (vocab > n) n = vocab;
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    for (int64_t i = 0; i < n; ++i) {
      auto it = by_id.find(i);
      if (it == by_id.end()) {
        tokens.push_back("[PAD" + std::to_string(i) + "]");
        types.push_back(4);
      } else {
        tokens.push_back(it->second);
        auto t = type_of.find(i);
        types.push_back(t == type_of.end() ? 1 : t->second);
      }
    }
    std::vector<std::string> merges;
    if (model.contains("merges") && model["merges"].is_array())
      for (const auto& mg : model["merges"]) {
        if (mg.is_string()) merges.push_back(mg.get<std::string>());
        else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string())
          merges.push_back(mg[0].get<std::string>() + " " + mg[1].get<std::string>());
        else throw Error(tj + ": bad merges entry");
      }
    // The pre-tokenizer, by its regex (llama.cpp names it by a hash of sample output).
    std::string pre = "default";
    const std::string dump = j.contains("pre_tokenizer") ? j["pre_tokenizer"].dump() : "";
    if (dump.find("\\\\p{Lu}\\\\p{Lt}\\\\p{Lm}\\\\p{Lo}\\\\p{M}") != std::string::npos) pre = "tekken";
    else if (dump.find("\\\\p{N}{1,3}") != std::string::npos) pre = "llama-bpe";
    else if (dump.find("\"ByteLevel\"") != std::string::npos && dump.find("Split") == std::string::npos)
      pre = "gpt-2";
    w.set("tokenizer.ggml.model", Value::str("gpt2"));
    w.set("tokenizer.ggml.pre", Value::str(pre));
    w.set("tokenizer.ggml.tokens", Value::strings(tokens));
    w.set("tokenizer.ggml.token_type", Value::i32s(types));
    w.set("tokenizer.ggml.merges", Value::strings(merges));
    auto token_id = [&](const char* key) -> int64_t {
      if (!cfg.contains(key)) return -1;
      const json& t = cfg[key];
      std::string s = t.is_string() ? t.get<std::string>()
                      : (t.is_object() && t.contains("content") && t["content"].is_string())
                          ? t["content"].get<std::string>()
                          : "";
      for (const auto& [id, text] : by_id)
        if (!s.empty() && text == s) return id;
      return -1;
    };
    const int64_t bos = token_id("bos_token"), eos = token_id("eos_token"),
                  pad = token_id("pad_token"), unk = token_id("unk_token");
    if (bos >= 0) w.set("tokenizer.ggml.bos_token_id", Value::u32(static_cast<uint32_t>(bos)));
    if (eos >= 0) w.set("tokenizer.ggml.eos_token_id", Value::u32(static_cast<uint32_t>(eos)));
    if (unk >= 0) w.set("tokenizer.ggml.unknown_token_id", Value::u32(static_cast<uint32_t>(unk)));
    if (pad >= 0) w.set("tokenizer.ggml.padding_token_id", Value::u32(static_cast<uint32_t>(pad)));
    // What the tokenizer adds around a text: tokenizer_config.json's add_*_token flags, or
    // without them tokenizer.json's post-processor (the built-in model's adds BOS that way).
    // Both are written, so the GGUF encodes as the directory does (a reader without the keys
    // falls back to llama.cpp's default for the pre-tokenizer name, which may differ).
    // (GGUF can only say "the BOS / EOS id": a rule adding other tokens is not carried.) A
    // tokenizer this engine cannot load still converts: then only the config's flags, if any.
    std::optional<bool> add_bos, add_eos;
    try {
      const auto t = Tokenizer::from_path(dir);
      add_bos = t->adds_bos() && bos >= 0;
      add_eos = t->adds_eos() && eos >= 0;
    } catch (const Error&) {
      if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) add_bos = cfg["add_bos_token"].get<bool>();
      if (cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean()) add_eos = cfg["add_eos_token"].get<bool>();
    }
    if (add_bos) w.set("tokenizer.ggml.add_bos_token", Value::boolean(*add_bos));
    if (add_eos) w.set("tokenizer.ggml.add_eos_token", Value::boolean(*add_eos));
    note = "tokenizer: " + std::to_string(tokens.size()) + " tokens, " +
           std::to_string(merges.size()) + " merges, pre '" + pre + "'";
  }
  std::string tmpl;
  if (cfg.contains("chat_template")) {
    const json& t = cfg["chat_template"];
    if (t.is_string()) tmpl = t.get<std::string>();
    else if (t.is_array())
      for (const auto& e : t)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
            e["template"].is_string())
          tmpl = e["template"].get<std::string>();
  }
  if (tmpl.empty() && file_exists(dir + "/chat_template.jinja"))
    tmpl = read_text_file(dir + "/chat_template.jinja");
  if (!tmpl.empty()) {
    w.set("tokenizer.chat_template", Value::str(tmpl));
    note += std::string(note.empty() ? "" : "; ") + "chat template (" +
            std::to_string(tmpl.size()) + " bytes)";
  }
  return note;
}

}  // namespace dory
