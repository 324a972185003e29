#include "model/weights.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "format/gguf.h"
#include "format/hf_config.h"
#include "format/mapped_file.h"
#include "model/gguf_dory.h"
#include "model/turbo.h"

namespace dory {

namespace {

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool is_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

std::string list_names(const std::vector<std::string>& names) {
  std::string s;
  const size_t show = 8;
  for (size_t i = 0; i < names.size() && i < show; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > show) s += " (and " + std::to_string(names.size() - show) + " more)";
  return s;
}

// The safetensors files of a checkpoint directory: the index's shards, or the
// single model.safetensors.
std::vector<std::string> shard_files(const std::string& dir,
                                     std::map<std::string, std::string>* weight_map) {
  const std::string index = dir + "/model.safetensors.index.json";
  if (is_file(index)) {
    nlohmann::json j = read_json_file(index);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw Error(index + ": missing the \"weight_map\" object");
    std::set<std::string> seen;
    std::vector<std::string> files;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        throw Error(index + ": weight_map entry '" + it.key() + "' is not a file name");
      std::string f = it.value().get<std::string>();
      if (f.find('/') != std::string::npos || f == ".." || f.empty())
        throw Error(index + ": weight_map entry '" + it.key() + "' names '" + f +
                    "', which is not a file in the checkpoint directory");
      (*weight_map)[it.key()] = f;
      if (seen.insert(f).second) files.push_back(f);
    }
    if (files.empty()) throw Error(index + ": weight_map is empty");
    return files;
  }
  if (is_file(dir + "/model.safetensors")) return {"model.safetensors"};
  throw Error(dir + ": no model.safetensors or model.safetensors.index.json in this directory");
}

kern::Mat as_mat(const TensorView& t) {
  return kern::Mat{t.dtype, t.data, t.shape.size() == 2 ? t.shape[0] : 1,
                   t.shape.size() == 2 ? t.shape[1] : t.numel()};
}

// Points the matrices into the files and folds the scale vectors' constants.
template <class Get>
void fold_weights(Weights& wr, Get get) {
  Weights* w = &wr;
  auto scaled = [&](const std::string& n, auto f) {
    std::vector<float> v = get(n).to_f32();
    for (float& x : v) x = static_cast<float>(f(static_cast<double>(x)));
    return v;
  };
  const DoryConfig& c = w->cfg;
  const double sigma = c.init_std;
  w->embd = get("backbone.embeddings.weight");
  w->lm_head = as_mat(get("lm_head.weight"));
  w->logit_scale = scaled("lm_head.logit_scale", [&](double s) { return s / sigma; });
  w->layers.resize(c.n_layer);
  for (int64_t i = 0; i < c.n_layer; ++i) {
    LayerWeights& L = w->layers[i];
    const std::string p = "backbone.layers." + std::to_string(i) + ".";
    L.kind = c.pattern[i];
    L.rope_profile = c.rope_profile[i];
    auto rate = [&](double a) { return std::fabs(a * c.alpha_init / sigma); };
    if (c.is_attention(i)) {
      L.wq = as_mat(get(p + "mixer.q_proj.weight"));
      L.wk = as_mat(get(p + "mixer.k_proj.weight"));
      L.wv = as_mat(get(p + "mixer.v_proj.weight"));
      L.wg = as_mat(get(p + "mixer.g_proj.weight"));
      L.wo = as_mat(get(p + "mixer.o_proj.weight"));
      const double fq = std::sqrt(double(c.head_dim)) / sigma, fg = std::sqrt(c.g0()) / sigma;
      L.q_scale = scaled(p + "mixer.sqk", [&](double s) { return (s * fq) * (s * fq); });
      L.gate_scale = scaled(p + "mixer.s_gate", [&](double s) { return (s * fg) * (s * fg); });
      L.alpha = scaled(p + "attn_alpha", rate);
    } else {
      L.w_gate = as_mat(get(p + "mixer.gate_proj.weight"));
      L.w_up = as_mat(get(p + "mixer.up_proj.weight"));
      L.w_down = as_mat(get(p + "mixer.down_proj.weight"));
      const double fs = std::sqrt(double(c.hidden));
      L.suv_gate = scaled(p + "mixer.suv_gate", [&](double s) { return s * fs; });
      L.suv_up = scaled(p + "mixer.suv_up", [&](double s) { return s * fs; });
      L.alpha = scaled(p + "mlp_alpha", rate);
    }
  }
}

// The model's matrices by Hugging Face name ("backbone.layers.3.mixer.up_proj.weight",
// "lm_head.weight"): what CMF column scales and LoRA adapters attach to.
std::map<std::string, kern::Mat*> matrices_by_name(Weights& w) {
  std::map<std::string, kern::Mat*> out;
  for (int64_t i = 0; i < w.cfg.n_layer; ++i) {
    LayerWeights& L = w.layers[i];
    const std::string p = "backbone.layers." + std::to_string(i) + ".mixer.";
    const std::pair<kern::Mat*, const char*> mats[] = {
        {&L.wq, "q_proj"},    {&L.wk, "k_proj"},       {&L.wv, "v_proj"},
        {&L.wg, "g_proj"},    {&L.wo, "o_proj"},       {&L.w_gate, "gate_proj"},
        {&L.w_up, "up_proj"}, {&L.w_down, "down_proj"}};
    for (const auto& [m, n] : mats)
      if (m->data) out[p + n + ".weight"] = m;
  }
  out["lm_head.weight"] = &w.lm_head;
  return out;
}

}  // namespace

std::vector<std::pair<std::string, std::vector<int64_t>>> expected_tensors(const DoryConfig& c) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> e;
  const int64_t H = c.hidden, F = c.ffn, Q = c.n_head * c.head_dim, KV = c.n_kv_head * c.head_dim;
  e.push_back({"backbone.embeddings.weight", {c.vocab, H}});
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "backbone.layers." + std::to_string(i) + ".";
    if (c.is_attention(i)) {
      e.push_back({p + "mixer.q_proj.weight", {Q, H}});
      e.push_back({p + "mixer.k_proj.weight", {KV, H}});
      e.push_back({p + "mixer.v_proj.weight", {KV, H}});
      e.push_back({p + "mixer.g_proj.weight", {Q, H}});
      e.push_back({p + "mixer.o_proj.weight", {H, Q}});
      e.push_back({p + "mixer.sqk", {Q}});
      e.push_back({p + "mixer.s_gate", {Q}});
      e.push_back({p + "attn_alpha", {H}});
    } else {
      e.push_back({p + "mixer.gate_proj.weight", {F, H}});
      e.push_back({p + "mixer.up_proj.weight", {F, H}});
      e.push_back({p + "mixer.down_proj.weight", {H, F}});
      e.push_back({p + "mixer.suv_gate", {F}});
      e.push_back({p + "mixer.suv_up", {F}});
      e.push_back({p + "mlp_alpha", {H}});
    }
  }
  e.push_back({"lm_head.weight", {c.vocab, H}});
  e.push_back({"lm_head.logit_scale", {c.vocab}});
  return e;
}

std::unique_ptr<Weights> load_hf_weights(const std::string& path, std::string* resolved_dir) {
  std::string dir = path;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (!is_dir(dir)) {
    if (!is_file(dir)) throw Error(path + ": no such file or directory");
    if (!ends_with(dir, ".safetensors") && !ends_with(dir, ".json"))
      throw Error(path +
                  ": not a model: expected a Hugging Face directory with config.json "
                  "and model.safetensors");
    size_t slash = dir.rfind('/');
    dir = slash == std::string::npos ? "." : dir.substr(0, slash);
  }
  *resolved_dir = dir;
  const std::string cfg_path = dir + "/config.json";
  if (!is_file(cfg_path)) throw Error(dir + ": no config.json in the model directory");

  auto w = std::make_unique<Weights>();
  w->cfg = parse_hf_config(cfg_path);
  const DoryConfig& c = w->cfg;

  std::map<std::string, std::string> weight_map;
  std::map<std::string, const TensorView*> by_name;
  std::map<std::string, std::string> origin;
  for (const std::string& f : shard_files(dir, &weight_map)) {
    w->files.push_back(std::make_unique<SafeTensorsFile>(dir + "/" + f));
    for (const auto& [name, t] : w->files.back()->tensors()) {
      if (by_name.count(name))
        throw Error(dir + "/" + f + ": tensor '" + name + "' also appears in " + origin[name]);
      if (!weight_map.empty() && weight_map.count(name) && weight_map[name] != f)
        throw Error(dir + "/" + f + ": tensor '" + name + "' is listed in the index under " +
                    weight_map[name]);
      by_name[name] = &t;
      origin[name] = dir + "/" + f;
    }
  }
  for (const auto& [name, f] : weight_map)
    if (!by_name.count(name))
      throw Error(dir + "/model.safetensors.index.json: tensor '" + name + "' is listed in " + f +
                  " but that file does not contain it");

  // Presence, then shapes, against what config.json implies.
  const auto expected = expected_tensors(c);
  std::vector<std::string> missing, unexpected;
  std::set<std::string> want;
  for (const auto& [name, shape] : expected) {
    want.insert(name);
    if (!by_name.count(name)) missing.push_back(name);
  }
  for (const auto& [name, t] : by_name)
    if (!want.count(name)) unexpected.push_back(name);
  if (!missing.empty())
    throw Error(dir + ": " + std::to_string(missing.size()) +
                " tensors that config.json implies are missing: " + list_names(missing));
  if (!unexpected.empty())
    throw Error(dir + ": " + std::to_string(unexpected.size()) +
                " unexpected tensors (not part of this Dory config): " + list_names(unexpected));
  for (const auto& [name, shape] : expected) {
    const TensorView& t = *by_name[name];
    if (t.shape != shape)
      throw Error(origin[name] + ": tensor '" + name + "' has shape " + shape_str(t.shape) +
                  ", but config.json implies " + shape_str(shape));
    w->all.push_back(t);
  }

  fold_weights(*w, [&](const std::string& n) -> const TensorView& { return *by_name[n]; });
  return w;
}

std::unique_ptr<Weights> load_gguf_weights(const std::string& path) {
  return load_gguf_weights(std::make_unique<gguf::File>(path));
}

std::unique_ptr<Weights> load_gguf_weights(std::unique_ptr<gguf::File> file) {
  auto w = std::make_unique<Weights>();
  w->gguf = std::move(file);
  const gguf::File& f = *w->gguf;
  const std::string& path = f.path();
  w->cfg = config_from_gguf(f);
  DoryConfig& c = w->cfg;
  // llama.cpp always writes dory.gate_init (sqrt(H) when config.json has null):
  // take that value as "sqrt(H)" so a converted file computes what its config did.
  if (c.gate_init &&
      static_cast<float>(*c.gate_init) == static_cast<float>(std::sqrt(double(c.hidden))))
    c.gate_init.reset();

  const auto expected = expected_tensors(c);
  std::map<std::string, const TensorView*> by_name;  // HF name -> view
  std::set<std::string> want;
  std::vector<std::string> missing, unexpected;
  for (const auto& [name, shape] : expected) {
    const std::string g = gguf_tensor_name(name);
    want.insert(g);
    const gguf::TensorInfo* t = f.tensor(g);
    if (!t)
      missing.push_back(g);
    else
      by_name[name] = &t->view;
  }
  for (const auto& t : f.tensors())
    if (!want.count(t.name) && !is_turbo_tensor(t.name)) unexpected.push_back(t.name);
  if (!missing.empty())
    throw Error(path + ": " + std::to_string(missing.size()) +
                " tensors that the dory.* metadata implies are missing: " + list_names(missing));
  if (!unexpected.empty())
    throw Error(path + ": " + std::to_string(unexpected.size()) +
                " unexpected tensors (not part of this Dory config): " + list_names(unexpected));
  for (const auto& [name, shape] : expected) {
    const TensorView& t = *by_name[name];
    if (t.shape != shape) {
      std::vector<int64_t> ne(shape.rbegin(), shape.rend());
      throw Error(path + ": tensor '" + t.name + "' has shape " + shape_str(t.shape) + " (ne " +
                  shape_str(std::vector<int64_t>(t.shape.rbegin(), t.shape.rend())) +
                  "), but the metadata implies " + shape_str(shape) + " (ne " + shape_str(ne) +
                  ")");
    }
    if (shape.size() == 1 && dtype_is_quantized(t.dtype))
      throw Error(path + ": tensor '" + t.name + "' is " + dtype_name(t.dtype) +
                  "; 1-D tensors must be F32, F16 or BF16");
    w->all.push_back(t);
  }
  fold_weights(*w, [&](const std::string& n) -> const TensorView& { return *by_name[n]; });
  w->turbo = read_turbo(f, c);
  return w;
}

namespace {

// A CMF group dtype (cmf::group_row: integers times one scale per 32 columns) as ggml blocks,
// so it runs on the Q4_0 / Q8_0 kernels (SIMD on the CPU, the GPU's) instead of as F32: Q4_0
// when every integer fits a nibble (q4_block, q4_tiled, q4tp, q2tp: 18 bytes a group), else
// Q8_0 (q8_row: 34). Each group's scale becomes the block's f16 d: exact for q8_row, q4_block
// and q4_tiled (their scales are f16 already); q4tp's and q2tp's ladder rungs are f32, so d
// holds them to f16's rounding, at most 2^-11 of the scale (the products already round their
// input to int8, 2^-8). A rung outside f16's normal range would round coarser: then false,
// and the tensor is decoded to F32 instead (nothing appended). False too for other dtypes.
bool repack_groups(const cmf::Tensor& t, std::vector<std::vector<uint8_t>>& store, DType& type) {
  if (t.shape.size() != 2 || t.shape[1] % 32 != 0 || t.shape[0] == 0) return false;
  const int64_t rows = t.shape[0], cols = t.shape[1], nb = cols / 32;
  std::vector<int8_t> q(static_cast<size_t>(cols));
  std::vector<float> sc(static_cast<size_t>(nb));
  const int width = cmf::group_row(t, 0, q.data(), sc.data());
  if (width == 0) return false;
  type = width == 4 ? DType::Q4_0 : DType::Q8_0;
  const int64_t bb = width == 4 ? 18 : 34;
  std::vector<uint8_t> out(static_cast<size_t>(rows * nb * bb));
  for (int64_t r = 0; r < rows; ++r) {
    if (r > 0) cmf::group_row(t, r, q.data(), sc.data());
    for (int64_t g = 0; g < nb; ++g) {
      const uint16_t d = f32_to_f16(sc[g]);
      const float back = f16_to_f32(d), s = sc[g];
      if (!std::isfinite(s) || std::fabs(back - s) > std::ldexp(std::fabs(s), -11) ||
          (s != 0 && std::fabs(s) < std::ldexp(1.0f, -14)))
        return false;
      uint8_t* blk = out.data() + (r * nb + g) * bb;
      blk[0] = static_cast<uint8_t>(d & 0xff), blk[1] = static_cast<uint8_t>(d >> 8);
      const int8_t* qq = q.data() + 32 * g;
      if (width == 4) {
        // ggml's Q4_0: byte j holds element j (low nibble) and element j + 16 (high).
        for (int j = 0; j < 16; ++j)
          blk[2 + j] = static_cast<uint8_t>((qq[j] + 8) | (qq[j + 16] + 8) << 4);
      } else {
        std::memcpy(blk + 2, qq, 32);
      }
    }
  }
  store.push_back(std::move(out));
  return true;
}

}  // namespace

std::unique_ptr<Weights> load_cmf_weights(const std::string& path, const std::string& skill) {
  using nlohmann::json;
  auto w = std::make_unique<Weights>();
  // A sharded model: the header, tokenizer and skills are shard 1's; the tensors all shards'.
  const std::vector<std::string> shards = cmf::shard_paths(path);
  w->cmf = cmf::File::open(shards[0]);
  for (size_t i = 1; i < shards.size(); ++i) w->cmf_shards.push_back(cmf::File::open(shards[i]));
  const cmf::File& f = *w->cmf;
  if (f.features() & cmf::kSkillFile)
    throw Error(path + ": a standalone skill file (feature bit 6) does not run on its own: give its base "
                       "model with -m and this file with --skill");
  std::map<std::string, const cmf::Tensor*> all_tensors;
  for (const cmf::File* sf : [&] {
         std::vector<const cmf::File*> v{w->cmf.get()};
         for (auto& x : w->cmf_shards) v.push_back(x.get());
         return v;
       }())
    for (const cmf::Tensor& t : sf->tensors())
      if (!all_tensors.emplace(t.name, &t).second)
        throw Error(sf->path() + ": tensor '" + t.name + "' is in another shard too");
  // The config: the arch object under config.json's names, then a config.json beside the file.
  json arch = json::parse(f.arch_json());
  json cfg = json::object();
  for (auto it = arch.begin(); it != arch.end(); ++it) {
    std::string k = it.key();
    for (const auto& [cortiq, hf] : cmf::arch_key_names())
      if (k == cortiq) k = hf;
    if (k == "arch_name" || k == "layer_types" || k == "rms_norm_eps" || k == "norm_style" ||
        k == "hidden_act" || k == "embed_multiplier" || k == "loop_final_norm")
      continue;  // cortiq's own keys, which a Dory config has no use for
    cfg[k] = it.value();
  }
  if (arch.contains("arch_name") && arch["arch_name"] != "dory")
    throw Error(path + ": the header's arch_name is " + arch["arch_name"].dump() +
                ", not \"dory\"");
  size_t slash = path.rfind('/');
  const std::string beside =
      (slash == std::string::npos ? std::string(".") : path.substr(0, slash)) + "/config.json";
  if (is_file(beside)) {
    json side = read_json_file(beside);
    if (!side.is_object()) throw Error(beside + ": not a JSON object");
    for (auto it = side.begin(); it != side.end(); ++it) {
      if (cfg.contains(it.key()) && !cfg[it.key()].is_null() && cfg[it.key()] != it.value())
        throw Error(path + ": the header's arch says " + it.key() + " = " + cfg[it.key()].dump() +
                    ", " + beside + " says " + it.value().dump());
      cfg[it.key()] = it.value();
    }
  }
  w->cfg = parse_hf_config_text(
      cfg.dump(), path + " (arch" + (is_file(beside) ? " + " + beside : std::string()) + ")");
  const DoryConfig& c = w->cfg;

  // The skill overlay: its tensors replace the backbone's by name (replacement, not addition).
  // --skill FILE.cmf: a standalone skill file (CMF.md section 3.4), checked against this base.
  const bool standalone = skill.size() > 4 && skill.compare(skill.size() - 4, 4, ".cmf") == 0;
  const bool overlay = !standalone && !skill.empty() && skill != "none";
  if (standalone) {
    w->cmf_skill = cmf::File::open(skill);
    const cmf::File& sf = *w->cmf_skill;
    if (!(sf.features() & cmf::kSkillFile))
      throw Error(skill + ": not a standalone skill file (feature bit 6 is not set); a model's own "
                          "skills are chosen by id");
    if (sf.skills().size() != 1)
      throw Error(skill + ": a standalone skill file has one skill record, this one has " +
                  std::to_string(sf.skills().size()));
    const std::string& have = sf.skills()[0].base_dir_hash;
    char* end = nullptr;
    const uint64_t base_hash = have.empty() ? 0 : std::strtoull(have.c_str(), &end, 16);
    if (have.empty() || *end || have.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos ||
        base_hash != f.dir_hash()) {
      char want[17];
      std::snprintf(want, sizeof want, "%016llx", static_cast<unsigned long long>(f.dir_hash()));
      throw Error(skill + ": made for the base with directory hash " + (have.empty() ? "(none recorded)" : have) +
                  ", not " + path + " (" + want + ")");
    }
    for (const cmf::Tensor& t : sf.tensors()) {
      auto it = all_tensors.find(t.name);
      if (it == all_tensors.end())
        throw Error(skill + ": tensor '" + t.name + "' replaces nothing in " + path);
      if (it->second->shape != t.shape)
        throw Error(skill + ": tensor '" + t.name + "' has shape " + shape_str(t.shape) + ", the base's is " +
                    shape_str(it->second->shape) + " (a defragmented base is not supported)");
      it->second = &t;
    }
  }
  if (overlay) {
    bool known = false;
    std::string ids;
    for (const cmf::Skill& k : f.skills()) {
      known |= k.id == skill;
      ids += (ids.empty() ? "" : ", ") + k.id;
    }
    if (!known)
      throw Error(path + ": no skill '" + skill + "' (the file has " +
                  (ids.empty() ? std::string("none") : ids) + ")");
    const std::string pre = "skill." + skill + ".";
    int replaced = 0;
    for (auto& [tname, t] : all_tensors)
      if (tname.rfind(pre, 0) == 0) {
        const std::string base = tname.substr(pre.size());
        auto it = all_tensors.find(base);
        if (it == all_tensors.end())
          throw Error(path + ": skill tensor '" + tname + "' replaces '" + base +
                      "', which the model does not have");
        it->second = t;
        ++replaced;
      }
    if (replaced == 0)
      throw Error(path + ": skill '" + skill + "' has no tensors (skill." + skill + ".*)");
  }
  const auto expected = expected_tensors(c);
  std::map<std::string, const TensorView*> by_name;
  std::map<std::string, const float*> col_scales;  // q8_2f matrices: their column scales
  // The file's bytes of a tensor copied into repacked / decoded are not read again: out of the
  // RSS as soon as they are copied (the mapping stays), so the peak stays near one copy. The
  // embedding of a q8_2f file is read again below (its decoded copy): released at the end.
  const cmf::Tensor* release_later = nullptr;
  auto release = [&](const cmf::Tensor* t) {
    if (w->cmf) w->cmf->release(*t);
    for (const auto& f : w->cmf_shards) f->release(*t);
    if (w->cmf_skill) w->cmf_skill->release(*t);
  };
  std::vector<TensorView> views;
  views.reserve(expected.size());
  std::vector<std::string> missing, unexpected;
  std::set<std::string> want;
  for (const auto& [name, shape] : expected) want.insert(name);
  for (const auto& [tname, t] : all_tensors)
    if (!want.count(tname) && tname.rfind("skill.", 0) != 0) unexpected.push_back(tname);
  for (const auto& [name, shape] : expected) {
    const auto found = all_tensors.find(name);
    const cmf::Tensor* t = found == all_tensors.end() ? nullptr : found->second;
    if (!t) {
      missing.push_back(name);
      continue;
    }
    if (t->shape != shape)
      throw Error(path + ": tensor '" + t->name + "' has shape " + shape_str(t->shape) +
                  ", but the config implies " + shape_str(shape) + " for '" + name + "'");
    TensorView v;
    v.name = name;
    v.shape = t->shape;
    if (t->dtype == cmf::kF32 || t->dtype == cmf::kF16 || t->dtype == cmf::kBF16) {
      v.dtype = t->dtype == cmf::kF32   ? DType::F32
                : t->dtype == cmf::kF16 ? DType::F16
                                        : DType::BF16;
      v.data = t->data;
    } else if (t->dtype == cmf::kQ8_2f && t->shape[1] % 32 == 0) {
      // q8_2f runs on the Q8_0 kernels: w[r,c] = (q * row_scale[r]) * col[c], so each row is
      // Q8_0 blocks with d = row_scale[r] (an f16 already: exact) and the column scales go on
      // the input (kern::Mat::col_scale). 34 bytes a 32 weights, against 32 + a little.
      const int64_t rows = t->shape[0], cols = t->shape[1], nb = cols / 32;
      std::vector<uint8_t>& q = w->repacked.emplace_back(static_cast<size_t>(rows * nb * 34));
      const uint8_t* rs = t->data + rows * cols;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < nb; ++b) {
          uint8_t* blk = q.data() + (r * nb + b) * 34;
          blk[0] = rs[2 * r], blk[1] = rs[2 * r + 1];
          std::memcpy(blk + 2, t->data + r * cols + 32 * b, 32);
        }
      std::vector<float>& col = w->decoded.emplace_back(static_cast<size_t>(cols));
      const uint8_t* cs = rs + 2 * rows;
      for (int64_t c = 0; c < cols; ++c)
        col[c] = f16_to_f32(static_cast<uint16_t>(cs[2 * c] | cs[2 * c + 1] << 8));
      v.dtype = DType::Q8_0;
      v.data = q.data();
      col_scales[name] = col.data();
    } else if (DType bt; repack_groups(*t, w->repacked, bt)) {
      v.dtype = bt;
      v.data = w->repacked.back().data();
    } else {
      w->decoded.emplace_back(static_cast<size_t>(t->numel()));
      cmf::dequantize(*t, w->decoded.back().data());
      v.dtype = DType::F32;
      v.data = w->decoded.back().data();
    }
    views.push_back(v);
    if (v.data != t->data) {  // copied, not read in place
      if (t->dtype == cmf::kQ8_2f && name == "backbone.embeddings.weight") release_later = t;
      else release(t);
    }
  }
  if (!missing.empty())
    throw Error(path + ": " + std::to_string(missing.size()) +
                " tensors that the config implies are missing: " + list_names(missing));
  if (!unexpected.empty())
    throw Error(path + ": " + std::to_string(unexpected.size()) +
                " unexpected tensors (not part of this Dory config): " + list_names(unexpected));
  for (const TensorView& v : views) by_name[v.name] = &v;
  w->all = views;
  fold_weights(*w, [&](const std::string& n) -> const TensorView& { return *by_name[n]; });
  // The q8_2f matrices' column scales on their Mats.
  for (const auto& [n, m] : matrices_by_name(*w))
    if (auto it = col_scales.find(n); it != col_scales.end()) m->col_scale = it->second;
  if (col_scales.count("backbone.embeddings.weight")) {
    // The embedding rows are read, not multiplied: its column scales go into a decoded copy.
    const cmf::Tensor* t = all_tensors.at("backbone.embeddings.weight");
    std::vector<float>& e = w->decoded.emplace_back(static_cast<size_t>(t->numel()));
    cmf::dequantize(*t, e.data());
    w->embd.dtype = DType::F32;
    w->embd.data = e.data();
  }
  if (release_later) release(release_later);
  return w;
}

namespace {

// An adapter's A [rank x cols] and B [rows x rank] decoded to float, kept with the weights,
// and listed on the matrix they adapt.
void add_lora(Weights& w, kern::Mat& m, const TensorView& a, const TensorView& b, float scale,
              float base) {
  w.decoded.push_back(a.to_f32());
  const float* pa = w.decoded.back().data();
  const std::vector<float> bf = b.to_f32();  // [rows x rank] -> [rank x rows]
  const int64_t rows = b.shape[0], rank = b.shape[1];
  std::vector<float>& bt = w.decoded.emplace_back(bf.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < rank; ++k) bt[k * rows + r] = bf[r * rank + k];
  const float* pb = bt.data();
  w.loras[&m].push_back(
      kern::LoraDelta{a.shape[0], scale, pa, pb, static_cast<int>(w.adapter_names.size()), base});
  m.lora = &w.loras[&m];
}

bool has_gguf_magic(const std::string& path) {
  char m[4] = {};
  std::FILE* fp = std::fopen(path.c_str(), "rb");
  if (!fp) return false;
  const bool got = std::fread(m, 1, 4, fp) == 4;
  std::fclose(fp);
  return got && std::memcmp(m, "GGUF", 4) == 0;
}

// llama.cpp's GGUF LoRA adapter (convert_lora_to_gguf.py's output): general.type "adapter",
// adapter.type "lora", adapter.lora.alpha, and for each adapted matrix NAME (the model's GGUF
// tensor name) NAME.lora_a [rank x cols] and NAME.lora_b [rows x rank] (row-major shapes), any
// type dory reads. Scale: user * alpha / rank, or user when alpha is 0 (as llama.cpp).
void apply_gguf_lora(Weights& w, const std::string& spec, const std::string& file, float user) {
  gguf::File f(file);
  auto str = [&](const char* key) -> std::string {
    const gguf::Value* v = f.find(key);
    return v && v->type == gguf::VType::STRING ? v->s : "";
  };
  const std::string type = str("general.type"), atype = str("adapter.type"),
                    arch = str("general.architecture");
  if (type != "adapter")
    throw Error("--lora " + spec + ": a GGUF " +
                (type.empty() ? "file without general.type" : "'" + type + "'") +
                ", not a LoRA adapter (general.type \"adapter\")");
  if (atype != "lora")
    throw Error("--lora " + spec + ": adapter.type is '" + atype + "', not 'lora'");
  if (arch != "dory")
    throw Error("--lora " + spec + ": an adapter for '" + arch + "', not for dory");
  double alpha = 0;
  if (const gguf::Value* v = f.find("adapter.lora.alpha")) {
    if (!v->is_float() && !v->is_int())
      throw Error("--lora " + spec + ": adapter.lora.alpha must be a number");
    alpha = v->is_float() ? v->f : static_cast<double>(v->i);
  }
  std::map<std::string, kern::Mat*> by_gguf;
  for (const auto& [hf, m] : matrices_by_name(w))
    if (const std::string g = gguf_tensor_name(hf); !g.empty()) by_gguf[g] = m;
  int n_pairs = 0;
  for (const gguf::TensorInfo& ta : f.tensors()) {
    const std::string suffix = ".lora_a";
    const std::string& name = ta.name;
    if (name.size() < suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string base = name.substr(0, name.size() - suffix.size());
    auto mit = by_gguf.find(base);
    if (mit == by_gguf.end())
      throw Error(file + ": tensor '" + name + "' adapts '" + base +
                  "', which the model does not have");
    const gguf::TensorInfo* tb = f.tensor(base + ".lora_b");
    if (!tb) throw Error(file + ": tensor '" + name + "' has no lora_b beside it");
    const TensorView &a = ta.view, &b = tb->view;
    kern::Mat& m = *mit->second;
    if (a.shape.size() != 2 || b.shape.size() != 2 || a.shape[1] != m.cols ||
        b.shape[0] != m.rows || b.shape[1] != a.shape[0])
      throw Error(file + ": '" + name + "' " + shape_str(a.shape) + " and its lora_b " +
                  shape_str(b.shape) + " do not fit '" + base + "' [" + std::to_string(m.rows) +
                  ", " + std::to_string(m.cols) + "]");
    const float unit =
        alpha != 0 ? static_cast<float>(alpha / static_cast<double>(a.shape[0])) : 1.0f;
    add_lora(w, m, a, b, user * unit, unit);
    ++n_pairs;
  }
  if (n_pairs == 0) throw Error(file + ": no .lora_a/.lora_b tensor pairs");
}

}  // namespace

void apply_loras(Weights& w, const std::vector<std::string>& specs) {
  using nlohmann::json;
  const std::map<std::string, kern::Mat*> modules = matrices_by_name(w);
  for (const std::string& spec : specs) {
    // FILE[:SCALE]: the scale when what follows the last ':' is a number.
    std::string file = spec;
    float user = 1.0f;
    if (const size_t colon = spec.rfind(':'); colon != std::string::npos) {
      char* end = nullptr;
      const std::string tail = spec.substr(colon + 1);
      const float v = std::strtof(tail.c_str(), &end);
      if (!tail.empty() && end && *end == 0) file = spec.substr(0, colon), user = v;
    }
    if (is_file(file) && has_gguf_magic(file)) {
      apply_gguf_lora(w, spec, file, user);
      w.adapter_names.push_back(spec);
      w.adapter_scales.push_back(user);
      continue;
    }
    std::string dir = file, st = file;
    if (is_dir(file))
      st = file + "/adapter_model.safetensors";
    else
      dir = file.rfind('/') == std::string::npos ? "." : file.substr(0, file.rfind('/'));
    if (!is_file(st)) throw Error("--lora " + spec + ": no adapter_model.safetensors at " + st);
    const std::string cfg_path = dir + "/adapter_config.json";
    if (!is_file(cfg_path)) throw Error("--lora " + spec + ": no adapter_config.json beside " + st);
    json cfg = read_json_file(cfg_path);
    if (!cfg.is_object() || !cfg.contains("r") || !cfg["r"].is_number_integer() ||
        cfg["r"].get<int64_t>() < 1)
      throw Error(cfg_path + ": key 'r' must be a positive integer");
    const double r = static_cast<double>(cfg["r"].get<int64_t>());
    const double alpha = cfg.contains("lora_alpha") && cfg["lora_alpha"].is_number()
                             ? cfg["lora_alpha"].get<double>()
                             : r;
    const bool rs = cfg.contains("use_rslora") && cfg["use_rslora"].is_boolean() &&
                    cfg["use_rslora"].get<bool>();
    const float base = static_cast<float>(alpha / (rs ? std::sqrt(r) : r));
    w.adapter_files.push_back(std::make_unique<SafeTensorsFile>(st));
    const auto& tensors = w.adapter_files.back()->tensors();
    int n_pairs = 0;
    for (const auto& [name, a] : tensors) {
      const std::string suffix = ".lora_A.weight";
      if (name.size() < suffix.size() ||
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
        continue;
      std::string module = name.substr(0, name.size() - suffix.size());
      for (const char* pre : {"base_model.model.", "model."})
        if (module.rfind(pre, 0) == 0 && !modules.count(module + ".weight"))
          module = module.substr(std::strlen(pre));
      auto mit = modules.find(module + ".weight");
      if (mit == modules.end())
        throw Error(st + ": tensor '" + name + "' adapts '" + module +
                    "', which the model does not have");
      auto bit = tensors.find(name.substr(0, name.size() - suffix.size()) + ".lora_B.weight");
      if (bit == tensors.end()) throw Error(st + ": tensor '" + name + "' has no lora_B beside it");
      const TensorView& b = bit->second;
      kern::Mat& m = *mit->second;
      if (a.shape.size() != 2 || b.shape.size() != 2 || a.shape[1] != m.cols ||
          b.shape[0] != m.rows || b.shape[1] != a.shape[0])
        throw Error(st + ": '" + name + "' " + shape_str(a.shape) + " and its lora_B " +
                    shape_str(b.shape) + " do not fit '" + module + "' [" + std::to_string(m.rows) +
                    ", " + std::to_string(m.cols) + "]");
      add_lora(w, m, a, b, user * base, base);
      ++n_pairs;
    }
    if (n_pairs == 0) throw Error(st + ": no lora_A/lora_B tensor pairs");
    w.adapter_names.push_back(spec);
    w.adapter_scales.push_back(user);
  }
}

std::unique_ptr<Weights> load_weights(const std::string& path, std::string* resolved,
                                      const std::string& skill) {
  if (is_file(path)) {
    bool gguf_magic = false, cmf_magic = false;
    if (std::FILE* fp = std::fopen(path.c_str(), "rb")) {
      char m[4] = {};
      const bool got = std::fread(m, 1, 4, fp) == 4;
      gguf_magic = got && std::memcmp(m, "GGUF", 4) == 0;
      cmf_magic = got && std::memcmp(m, "CMF\x01", 4) == 0;
      std::fclose(fp);
    }
    if (cmf_magic || cmf::is_cmf_name(path)) {
      *resolved = path;
      return load_cmf_weights(path, skill);
    }
    if (!skill.empty() && skill != "none")
      throw Error(path + ": --skill " + skill +
                  ": skills live in CMF files; this model is not one");
    if (gguf_magic || ends_with(path, ".gguf")) {
      *resolved = path;
      return load_gguf_weights(path);
    }
  }
  if (!skill.empty() && skill != "none")
    throw Error(path + ": --skill " + skill + ": skills live in CMF files; this model is not one");
  return load_hf_weights(path, resolved);
}

}  // namespace dory
