// dory info: what a model is, without running it.
#include <cstdio>
#include <map>
#include <string>

#include "commands.h"
#include "common.h"
#include "format/cmf.h"
#include "runtime/npy.h"
#include "model/weights.h"
#include "tensor/kernels.h"

namespace dory::cli {

namespace {

std::string block_summary(const DoryConfig& c, int64_t b, int64_t e) {
  int s = 0, f = 0, m = 0;
  for (int64_t i = b; i < e; ++i) (c.pattern[i] == 'S' ? s : c.pattern[i] == '*' ? f : m)++;
  char buf[160];
  if (b >= e) return "none";
  std::snprintf(buf, sizeof buf, "layers %3lld..%-3lld (%lld: %d sliding, %d full, %d mlp)",
                (long long)b, (long long)e - 1, (long long)(e - b), s, f, m);
  return buf;
}

// A CMF file (cortiq's container): its sections, tensor dtypes (and what each runs as) and skills.
int run_cmf_info(const std::string& path, const std::string& dump, const std::string& out) {
  auto f = cmf::File::open(path);
  if (!dump.empty()) {
    const cmf::Tensor* t = f->find(dump);
    if (!t) throw Error(path + ": no tensor named '" + dump + "'");
    std::vector<float> v(static_cast<size_t>(t->numel()));
    cmf::dequantize(*t, v.data());
    write_npy_f32(out, v.data(), t->shape);
    std::fprintf(stderr, "wrote %s: '%s' (%s %s) as float32\n", out.c_str(), dump.c_str(), cmf::dtype_name(t->dtype),
                 shape_str(t->shape).c_str());
    return 0;
  }
  std::printf("file           %s (%s), CMF v%u, features 0x%x\n", path.c_str(), human_bytes(f->size()).c_str(),
              f->version(), f->features());
  for (const cmf::Section& s : f->sections())
    if (s.len) std::printf("section        %-9s offset %llu, %s\n", s.name, (unsigned long long)s.off, human_bytes(s.len).c_str());
  // A shard: where the rest of the model is, and whose header, tokenizer and skills it runs with.
  std::vector<std::string> shards{path};
  try {
    shards = cmf::shard_paths(path);
  } catch (const Error& e) {  // a shard missing: this file is still described
    std::printf("shard          %s\n", e.what());
  }
  std::unique_ptr<cmf::File> first;
  if (shards.size() > 1) {
    size_t no = 0;
    while (no < shards.size() && shards[no] != path) ++no;
    std::printf("shard          %zu of %zu (the model: all %zu files; header, tokenizer and skills from %s)\n", no + 1,
                shards.size(), shards.size(), shards[0].c_str());
    if (no != 0) first = cmf::File::open(shards[0]);
  }
  const cmf::File& head = first ? *first : *f;
  std::printf("quant_type     %s\n", f->quant_type().c_str());
  std::printf("arch           %s\n", f->arch_json().c_str());
  std::map<std::string, std::pair<int64_t, uint64_t>> mix;
  for (const cmf::Tensor& t : f->tensors()) {
    auto& m = mix[cmf::dtype_name(t.dtype)];
    m.first += 1, m.second += t.nbytes;
  }
  // What the loader makes of each (model/weights.cpp, load_cmf_weights).
  auto runs_as = [](const std::string& n) -> const char* {
    if (n == "f32" || n == "f16" || n == "bf16") return "read in place";
    if (n == "q8_2f") return "runs as Q8_0 blocks, column scales on the input";
    if (n == "q8_row") return "runs as Q8_0 blocks";
    if (n == "q4_block" || n == "q4_tiled") return "runs as Q4_0 blocks";
    if (n == "q4tp" || n == "q2tp") return "runs as Q4_0 blocks (ladder rungs to f16)";
    return "decoded to F32 at load";
  };
  for (const auto& [name, m] : mix)
    std::printf("dtype          %-9s %5lld tensors, %s: %s\n", name.c_str(), (long long)m.first,
                human_bytes(m.second).c_str(), runs_as(name));
  for (const cmf::Skill& k : head.skills()) {
    std::string layers;
    for (int64_t l : k.layers) layers += (layers.empty() ? "" : ",") + std::to_string(l);
    std::printf("skill          %s%s%s, layers [%s]%s\n", k.id.c_str(), k.name.empty() ? "" : " (", k.name.empty() ? "" : (k.name + ")").c_str(),
                layers.c_str(), k.routable ? ", routable" : "");
  }
  std::printf("tokenizer      %s\n",
              head.vocab().empty() ? "none" : ("tokenizer.json, " + human_bytes(head.vocab().size())).c_str());
  std::printf("run            -m %s (Dory's config from the header's arch, with a config.json beside the file "
              "if there is one)\n",
              path.c_str());
  return 0;
}


int run_info(const std::string& path) {
  auto model = Model::load(path);
  const DoryConfig& c = model->config();
  const auto files = model->files();
  std::printf("model          %s\n", model->path().c_str());
  const gguf::File* gf = model->weights().gguf.get();
  if (gf)
    std::printf("format         GGUF v%u, %zu tensors, %zu metadata keys, alignment %u, %s\n",
                gf->version(), gf->tensors().size(), gf->metadata().size(), gf->alignment(),
                human_bytes(model->file_bytes()).c_str());
  else
    std::printf("format         Hugging Face safetensors, %zu file%s, %s\n", files.size(),
                files.size() == 1 ? "" : "s", human_bytes(model->file_bytes()).c_str());
  std::printf("architecture   DoryForCausalLM (looped normalized GPT)\n");
  std::printf("hidden         %lld   ffn %lld   vocab %lld\n", (long long)c.hidden,
              (long long)c.ffn, (long long)c.vocab);
  std::printf("attention      %lld query heads, %lld kv heads, head dim %lld, window %lld\n",
              (long long)c.n_head, (long long)c.n_kv_head, (long long)c.head_dim,
              (long long)c.swa_window);
  std::printf("layers         %lld, pattern %s\n", (long long)c.n_layer, c.pattern.c_str());
  std::printf("  input        %s\n", block_summary(c, 0, c.n_input).c_str());
  std::printf("  recurrent    %s x %lld loops\n",
              block_summary(c, c.n_input, c.n_input + c.n_recurrent).c_str(), (long long)c.n_loops);
  std::printf("  output       %s\n",
              block_summary(c, c.n_input + c.n_recurrent, c.n_layer).c_str());
  int64_t p2 = 0;
  for (int p : c.rope_profile) p2 += p == 2;
  std::printf("rope           theta %g (%lld rotary dims), theta_2 %g (%lld dims) on %lld layers\n",
              c.rope_theta, (long long)c.rotary_dims(1), c.rope_theta_2,
              (long long)c.rotary_dims(2), (long long)p2);
  std::printf("kv cache mode  %s\n", kv_mode_name(c.kv_mode));
  const Turbo& tb = model->weights().turbo;
  if (tb.present) {
    std::printf("turbo          defaults: kv last_loop, prompt loops 1");
    if (!tb.router.empty())
      std::printf(", gate recon (router rank %lld/%lld, exit bias %.4g)", (long long)tb.router.rank_easy,
                  (long long)tb.router.rank_hard, tb.router.bias);
    if (tb.o1) std::printf(", o1 %s", tb.o1->str().c_str());
    if (tb.exact_budget && !tb.exact_weights.empty())
      std::printf(", exact rows %lld (weights for %lld full layers)", (long long)*tb.exact_budget,
                  (long long)(tb.exact_weights.size() / (2 * c.n_kv_head)));
    std::printf("\n");
  }
  std::printf("ngpt           sigma %g, alpha_init %g, gate g0 %g%s\n", c.init_std, c.alpha_init,
              c.g0(), c.gate_init ? "" : " (sqrt(H))");
  std::printf("context        %lld positions\n", (long long)c.max_positions);
  const int64_t np = model->n_params();
  std::printf("parameters     %lld (%s)\n", (long long)np,
              (np >= 1e9 ? std::to_string(np / 1e9).substr(0, 5) + " B"
                         : std::to_string(np / 1e6).substr(0, 5) + " M")
                  .c_str());
  std::map<std::string, uint64_t> bytes;
  for (const auto& t : model->weights().all) bytes[dtype_name(t.dtype)] += t.nbytes();
  for (const auto& [dt, e] : model->dtype_mix())
    std::printf("dtype          %-5s %5lld tensors, %lld elements, %s\n", dt.c_str(),
                (long long)e.first, (long long)e.second, human_bytes(bytes[dt]).c_str());
  std::printf("decode reads   %s of weights per token at %lld loops\n",
              human_bytes(model->bytes_per_token(static_cast<int>(c.n_loops))).c_str(),
              (long long)c.n_loops);
  const kern::KernelSet& ks = kern::active();
  std::string sets;
  for (const kern::KernelSet* k : kern::supported()) sets += std::string(sets.empty() ? "" : " ") + k->name;
  const char* bf16_note = "; BF16 products take their input rounded to bf16 (DORY_BF16_INPUT=float keeps floats)";
  std::printf("kernels        %s (this CPU: %s)%s\n", ks.name, sets.c_str(), ks.bf16_input ? bf16_note : "");
  // The backends this binary has (--device), and why one is missing.
  for (const std::string& line : backend_report()) std::printf("backend        %s\n", line.c_str());
  if (gf) {
    // The file's own tensor types (the dtype lines above are the weights as loaded).
    struct Mix {
      int64_t n = 0, elems = 0;
      uint64_t bytes = 0;
    };
    std::map<std::string, Mix> mix;
    for (const auto& t : gf->tensors()) {
      DType dt;
      Mix& m = mix[gguf::dtype_from_ggml(t.ggml_type, &dt) ? dtype_name(dt)
                                                            : "ggml type " + std::to_string(t.ggml_type)];
      int64_t e = 1;
      for (int64_t d : t.ne) e *= d;
      ++m.n, m.elems += e, m.bytes += t.nbytes;
    }
    std::printf("file tensors\n");
    for (const auto& [name, m] : mix)
      std::printf("  %-8s %5lld tensors, %lld elements, %s\n", name.c_str(), (long long)m.n, (long long)m.elems,
                  human_bytes(m.bytes).c_str());
    std::printf("metadata\n");
    for (const auto& [k, v] : gf->metadata())
      std::printf("  %-36s %-6s %s\n", k.c_str(), gguf::vtype_name(v.type), v.show().c_str());
  }
  return 0;
}

}  // namespace

Runner add_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "print a model's architecture, sizes and dtypes");
  auto path = std::make_shared<std::string>();
  auto dump = std::make_shared<std::string>(), out = std::make_shared<std::string>();
  cmd->add_option("-m,--model", *path, kModelHelp + std::string("; or a CMF file (.cmf): its sections, dtypes and skills"));
  cmd->add_option("--dump", *dump, "CMF files: write this tensor, decoded to float32, to -o as .npy");
  cmd->add_option("-o,--output", *out, "with --dump: the .npy to write");
  return [path, dump, out] {
    const std::string p = path->empty() ? default_model_path() : *path;
    if (!dump->empty() && (!cmf::is_cmf_name(p) || out->empty()))
      throw Error("--dump needs a CMF file (-m FILE.cmf) and -o OUT.npy");
    return cmf::is_cmf_name(p) ? run_cmf_info(p, *dump, *out) : run_info(p);
  };
}

static const bool registered = register_command(10, add_info);

}  // namespace dory::cli
