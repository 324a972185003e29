// dory skill list|route: the skills of a CMF file (cortiq's, CMF.md section 3) and which one
// a prompt routes to.
//   dory skill list -m MODEL.cmf
//   dory skill route -m MODEL.cmf -p TEXT | -f FILE | --ids 1,2,3
#include <algorithm>
#include <cstdio>

#include "commands.h"
#include "common.h"
#include "dory/error.h"
#include "format/cmf.h"
#include "model/weights.h"
#include "model_text.h"

namespace dory::cli {

namespace {

struct SkillOpts {
  RunOpts run;
  std::string prompt, prompt_file, ids;
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

Runner add_skill(CLI::App& app) {
  auto* cmd = app.add_subcommand("skill", "the skills of a CMF file: list them, route a prompt");
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
  return [o, which] { return *which == "list" ? run_list(*o) : run_route(*o); };
}

}  // namespace

static const bool registered = register_command(79, add_skill);

}  // namespace dory::cli
