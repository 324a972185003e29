// dory skill list|route|add: the skills of a CMF file (cortiq's, CMF.md section 3), which one
// a prompt routes to, and a new one grafted from a fine-tune.
//   dory skill list -m MODEL.cmf
//   dory skill route -m MODEL.cmf -p TEXT | -f FILE | --ids 1,2,3
//   dory skill add -m BASE.cmf --from FINETUNE --id ID --prompts FILE -o OUT.cmf
#include <openssl/evp.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "commands.h"
#include "common.h"
#include "dory/error.h"
#include "format/cmf.h"
#include "format/mapped_file.h"
#include "model/weights.h"
#include "model/gguf_dory.h"
#include "model_text.h"
#include "subspace.h"
#include "tensor/quant.h"

namespace dory::cli {

namespace {

struct SkillOpts {
  RunOpts run;
  std::string prompt, prompt_file, ids;
  // add
  std::string from, id, name, prompts, prompt_ids, out;
  int rank = 4;
  int phi_layer = -1;
};

const cmf::File& cmf_of(const Model& m) {
  const cmf::File* f = m.weights().cmf.get();
  if (!f) throw Error(m.path() + ": skills live in CMF files; this model is not one");
  return *f;
}

int run_list(const SkillOpts& o) {
  auto model = Model::load(o.run.model_path(), o.run.placement());
  const cmf::File& f = cmf_of(*model);
  if (f.skills().empty()) {
    std::printf("%s: no skills\n", f.path().c_str());
    return 0;
  }
  for (const cmf::Skill& k : f.skills()) {
    int64_t n = 0;
    const std::string pre = "skill." + k.id + ".";
    for (const auto& t : f.tensors()) n += t.name.rfind(pre, 0) == 0;
    std::string layers;
    for (int64_t l : k.layers) layers += (layers.empty() ? "" : ",") + std::to_string(l);
    std::printf("%-16s %s | %lld tensors | layers [%s] | ", k.id.c_str(),
                k.name.empty() ? "-" : k.name.c_str(), (long long)n, layers.c_str());
    if (k.routable && !k.selection_error.empty())
      std::printf("router not usable: %s\n", k.selection_error.c_str());
    else if (k.routable)
      std::printf("router: %s, phi layer %lld, rank %lld\n", k.selection.unit ? "mse_unit" : "mse",
                  (long long)k.selection.phi_layer, (long long)k.selection.rank);
    else
      std::printf("no router (chosen only by --skill %s)\n", k.id.c_str());
  }
  return 0;
}

int run_route(const SkillOpts& o) {
  const int given = !o.prompt.empty() + !o.prompt_file.empty() + !o.ids.empty();
  if (given != 1) throw Error("skill route: give exactly one of -p TEXT, -f FILE and --ids 1,2,3");
  RunOpts run = o.run;
  run.skill = "";
  std::vector<int32_t> ids;
  Loaded l;
  if (!o.ids.empty()) {
    ids = parse_ids(o.ids);
    check_device(run.backend_options());
    l.model = Model::load(run.model_path(), run.placement(), "", run.lora);
    l.backend = run.open(l.model);
  } else {
    l = load_model_and_tokenizer(run, "");
    const std::string text = o.prompt_file.empty() ? o.prompt : read_text_file(o.prompt_file);
    ids = l.tok->encode(text, /*add_special=*/true);
    if (ids.empty()) throw Error("the prompt encodes to no tokens");
  }
  auto errs = skill_errors(run, l, ids);
  std::stable_sort(errs.begin(), errs.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  for (const auto& [id, e] : errs) std::printf("%-16s E %.6f\n", id.c_str(), e);
  std::printf("route: %s (%zu tokens)\n", errs.front().first.c_str(), ids.size());
  return 0;
}

std::string f16_base64(const std::vector<float>& v) {
  std::vector<unsigned char> raw(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = f32_to_f16(v[i]);
    raw[2 * i] = static_cast<unsigned char>(h & 0xff);
    raw[2 * i + 1] = static_cast<unsigned char>(h >> 8);
  }
  std::string out(4 * ((raw.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), raw.data(), static_cast<int>(raw.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

// The prompts a router is fitted from: lines of text (--prompts) or of ids (--prompt-ids).
std::vector<std::vector<int32_t>> read_prompts(const SkillOpts& o, const Tokenizer* tok) {
  std::vector<std::vector<int32_t>> out;
  const std::string& path = o.prompts.empty() ? o.prompt_ids : o.prompts;
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open: " + std::strerror(errno));
  std::string line;
  int64_t no = 0;
  while (std::getline(in, line)) {
    ++no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::vector<int32_t> ids;
    try {
      ids = o.prompts.empty() ? parse_ids(line) : tok->encode(line, /*add_special=*/true);
    } catch (const Error& e) {
      throw Error(path + ":" + std::to_string(no) + ": " + e.what());
    }
    if (ids.empty()) throw Error(path + ":" + std::to_string(no) + ": the prompt encodes to no tokens");
    out.push_back(std::move(ids));
  }
  if (out.size() < 2) throw Error(path + ": a router needs at least 2 prompts, it has " + std::to_string(out.size()));
  return out;
}

int run_add(const SkillOpts& o) {
  if (!std::regex_match(o.id, std::regex("[A-Za-z0-9_-]+")) || o.id == "auto" || o.id == "none")
    throw Error("--id '" + o.id + "': a skill id is letters, digits, '_' and '-' (and not auto or none)");
  if (o.prompts.empty() == o.prompt_ids.empty())
    throw Error("skill add: give exactly one of --prompts FILE (text lines) and --prompt-ids FILE (id lines)");
  RunOpts run = o.run;
  run.skill = "";
  Loaded l;
  check_device(run.backend_options());
  l.model = Model::load(run.model_path(), run.placement());
  const cmf::File* base = l.model->weights().cmf.get();
  if (!base) throw Error(l.model->path() + ": skills live in CMF files; convert the base first (dory convert BASE OUT.cmf)");
  // A sharded base: the output is one file holding every shard's tensors (shard 1's header and
  // tokenizer, as the loader reads them).
  std::vector<const cmf::File*> parts{base};
  for (const auto& f : l.model->weights().cmf_shards) parts.push_back(f.get());
  for (const cmf::File* f : parts)
    for (const auto& s : f->sections())
      if (std::string(s.name) == "masks" && s.len > 0)
        throw Error(f->path() + ": a base with a masks section is not supported by skill add");
  for (const cmf::Skill& k : base->skills())
    if (k.id == o.id) throw Error(base->path() + ": it has a skill '" + o.id + "' already");
  l.backend = run.open(l.model);
  std::unique_ptr<Tokenizer> tok;
  if (!o.prompts.empty()) {
    if (base->vocab().empty()) throw Error(base->path() + ": no tokenizer section; give the prompts as ids (--prompt-ids)");
    tok = Tokenizer::from_json(base->vocab(), "{}", base->path() + " (tokenizer section)", base->path());
  }
  const auto prompts = read_prompts(o, tok.get());
  const DoryConfig& c = l.model->config();

  // The tensors that differ, by value, between the base and the fine-tune.
  std::string resolved;
  std::unique_ptr<Weights> ft = load_weights(o.from, &resolved);
  std::map<std::string, const TensorView*> ft_by;
  for (const TensorView& t : ft->all) ft_by[t.name] = &t;
  std::map<std::string, const TensorView*> base_by;
  for (const TensorView& t : l.model->weights().all) base_by[t.name] = &t;
  std::vector<std::pair<std::string, std::vector<float>>> changed;
  std::set<int64_t> layers;
  for (const auto& [hf, shape] : expected_tensors(c)) {
    auto bt = base_by.find(hf);
    auto it = ft_by.find(ft->gguf ? gguf_tensor_name(hf) : hf);
    if (bt == base_by.end()) throw Error(base->path() + ": tensor '" + hf + "' not found");
    if (it == ft_by.end()) throw Error(o.from + ": tensor '" + hf + "' not found (not the same model)");
    if (it->second->shape != bt->second->shape)
      throw Error(o.from + ": tensor '" + hf + "' has shape " + shape_str(it->second->shape) + ", the base's is " +
                  shape_str(bt->second->shape) + " (a fine-tune of another shape)");
    std::vector<float> a = bt->second->to_f32(), b = it->second->to_f32();
    if (a == b) continue;
    std::smatch m;
    if (std::regex_search(hf, m, std::regex("layers\\.(\\d+)\\."))) layers.insert(std::stoll(m[1].str()));
    changed.emplace_back(hf, std::move(b));
  }
  if (changed.empty()) throw Error(o.from + ": no tensor differs from " + base->path() + "'s: nothing to graft");

  // The router: phi of each prompt on the base, their mean and principal basis.
  const int phi_layer = o.phi_layer >= 0 ? o.phi_layer : 2 * c.n_layer / 3;
  if (phi_layer >= c.n_layer)
    throw Error("--phi-layer " + std::to_string(phi_layer) + ": the model has " + std::to_string(c.n_layer) + " layers");
  const int64_t H = c.hidden;
  std::vector<float> X;
  for (const auto& ids : prompts) {
    const std::vector<float> phi = prompt_phi(run, l.backend, ids, phi_layer);
    X.insert(X.end(), phi.begin(), phi.end());
  }
  const int rank = std::min<int>(o.rank, static_cast<int>(prompts.size()) - 1);
  std::vector<float> mean, basis;
  topology(X, H, std::vector<bool>(prompts.size(), true), rank, *l.backend, &mean, &basis);

  nlohmann::json header = nlohmann::json::parse(base->header_json());
  nlohmann::json rec = {{"id", o.id},
                        {"layers", std::vector<int64_t>(layers.begin(), layers.end())},
                        {"selection",
                         {{"metric", "mse"},
                          {"phi_layer", phi_layer},
                          {"rank", rank},
                          {"mean", f16_base64(mean)},
                          {"basis", f16_base64(basis)}}},
                        {"provenance", {{"tool", "dory skill add"}, {"source", resolved.substr(resolved.find_last_of('/') + 1)},
                                        {"prompts", prompts.size()}}}};
  if (!o.name.empty()) rec["name"] = o.name;
  if (!header.contains("skills") || !header["skills"].is_array()) header["skills"] = nlohmann::json::array();
  header["skills"].push_back(rec);
  header.erase("section_hashes");  // the writer's sections are its own
  header.erase("shard");           // one file, whatever the base's shards
  cmf::Writer wr(header.dump());
  if (!base->vocab().empty()) wr.set_vocab(std::string(base->vocab()));
  for (const cmf::File* f : parts)
    for (const cmf::Tensor& t : f->tensors())
      wr.add(t.name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  uint64_t added = 0;
  for (const auto& [name, f] : changed) {
    const auto& shape = base_by[name]->shape;
    std::vector<uint8_t> payload(row_bytes(DType::BF16, static_cast<int64_t>(f.size())));
    quantize_row(DType::BF16, f.data(), payload.data(), static_cast<int64_t>(f.size()));
    added += payload.size();
    wr.add("skill." + o.id + "." + name, cmf::kBF16, shape, std::move(payload));
  }
  write_replacing(o.out, [&](const std::string& tmp) { wr.write(tmp); });
  std::string ls;
  for (int64_t x : layers) ls += (ls.empty() ? "" : ",") + std::to_string(x);
  std::fprintf(stderr,
               "skill %s: %zu tensors (bf16, %s) that differ in %s, layers [%s]; router from %zu prompts, phi layer "
               "%d, rank %d; wrote %s\n",
               o.id.c_str(), changed.size(), human_bytes(added).c_str(), o.from.c_str(), ls.c_str(), prompts.size(),
               phi_layer, rank, o.out.c_str());
  return 0;
}

Runner add_skill(CLI::App& app) {
  auto* cmd = app.add_subcommand("skill", "the skills of a CMF file: list them, route a prompt, add one from a fine-tune");
  cmd->require_subcommand(1);
  auto o = std::make_shared<SkillOpts>();
  auto which = std::make_shared<std::string>();
  auto* list = cmd->add_subcommand("list", "each skill: name, tensors, layers, router");
  add_run_opts(list, o->run);
  list->callback([which] { *which = "list"; });
  auto* route = cmd->add_subcommand(
      "route", "E of a prompt under each skill's router (CMF.md section 3), smallest first");
  add_run_opts(route, o->run);
  route->add_option("-p,--prompt", o->prompt, "prompt text");
  route->add_option("-f,--file", o->prompt_file, "read the prompt from a file");
  route->add_option("--ids", o->ids, "token ids instead of text: 1,2,3");
  route->callback([which] { *which = "route"; });
  auto* add = cmd->add_subcommand(
      "add", "graft the tensors of a same-shaped fine-tune that differ from the base into a copy of the base "
             "as skill ID (bf16), with a router fitted from prompts of its kind");
  add_run_opts(add, o->run);
  add->add_option("--from", o->from, "the fine-tune: a Hugging Face directory, .gguf or .cmf of the same shapes")
      ->required();
  add->add_option("--id", o->id, "the skill's id ([A-Za-z0-9_-]+)")->required();
  add->add_option("--name", o->name, "a readable name");
  add->add_option("--prompts", o->prompts, "prompts the skill is for, one per line (text)");
  add->add_option("--prompt-ids", o->prompt_ids, "the same as token ids, one prompt per line (1,2,3)");
  add->add_option("--rank", o->rank, "rank of the router's basis (at most prompts - 1)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  add->add_option("--phi-layer", o->phi_layer, "layer whose hidden state the router reads (default: 2 x layers / 3)");
  add->add_option("-o,--output", o->out, "the new .cmf: the base's tensors and skills plus this one")->required();
  add->callback([which] { *which = "add"; });
  return [o, which] {
    return *which == "list" ? run_list(*o) : *which == "route" ? run_route(*o) : run_add(*o);
  };
}

}  // namespace

static const bool registered = register_command(79, add_skill);

}  // namespace dory::cli
