// dory convert HF_DIR OUT.gguf [--type ...], and the engine of dory quantize:
// a model in, GGUF in llama.cpp's Dory layout out, tensor by tensor, written to
// OUT.tmp and renamed at the end so a failure leaves no broken file.
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.h"
#include "common.h"
#include "convert.h"
#include "format/cmf.h"
#include "format/gguf.h"
#include "format/hf_config.h"
#include "format/mapped_file.h"
#include "model/gguf_dory.h"
#include "model/turbo.h"
#include "model/weights.h"
#include "tensor/quant.h"

namespace dory::cli {

void merge_adapters(Weights& w, const std::vector<std::string>& specs);

const char* const kConvertTypes = "bf16|f16|f32|q8_0|q4_0|q4_k_m|q5_k_m|q6_k";
const char* const kConvertRecipe =
    "Which tensor gets which type (llama.cpp's llama-quant.cpp rules where they apply):\n"
    "  1-D tensors (scales, alpha, logit_scale): BF16 at --type bf16, F16 at f16, else F32\n"
    "  bf16/f16/f32/q6_k: every matrix that type\n"
    "  q8_0:   matrices Q8_0; token_embd.weight BF16 when the input's is a float type\n"
    "          (one row is read per token, so decode reads no more; top-1 agreement with\n"
    "          BF16 on the built-in model 0.9897 -> 0.9917; --embd-type q8_0 gives\n"
    "          llama.cpp's all-Q8_0 file)\n"
    "  q4_0:   matrices Q4_0; output.weight Q6_K\n"
    "  q4_k_m: matrices Q4_K; output.weight Q6_K; attn_v and ffn_down Q6_K where\n"
    "          llama.cpp's use_more_bits(i, n) holds (first 1/8, last 1/8, every 3rd\n"
    "          between; i counts those tensors in name order), else Q4_K\n"
    "  q5_k_m: as q4_k_m with Q5_K in place of Q4_K\n"
    "  Rows that are not whole blocks: K types fall back to Q8_0 (llama.cpp: Q5_0/Q5_1/Q8_0),\n"
    "  Q8_0/Q4_0 to F16; output.weight with rows not whole 256 blocks gets Q8_0.";

namespace {

struct FType {
  const char* name;
  DType base;
  uint32_t file_type;  // llama.cpp's LlamaFileType
  bool k_mix;          // the _M rules
  bool output_q6k;
  bool embd_bf16;  // token_embd.weight BF16 (from a float input)
};

const FType kFTypes[] = {
    {"f32", DType::F32, 0, false, false, false},    {"f16", DType::F16, 1, false, false, false},
    {"bf16", DType::BF16, 32, false, false, false}, {"q8_0", DType::Q8_0, 7, false, false, true},
    {"q4_0", DType::Q4_0, 2, false, true, false},   {"q4_k_m", DType::Q4_K, 15, true, true, false},
    {"q5_k_m", DType::Q5_K, 17, true, true, false}, {"q6_k", DType::Q6_K, 18, false, true, false},
};

bool use_more_bits(int64_t i, int64_t n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

DType fallback(DType t, int64_t cols) {
  if (dtype_row_ok(t, cols)) return t;
  if (dtype_block_elems(t) > dtype_block_elems(DType::Q8_0))  // a K type: 256-element blocks
    return dtype_row_ok(DType::Q8_0, cols) ? DType::Q8_0 : DType::F16;
  return DType::F16;
}

bool contains(const std::string& s, const char* sub) {
  return s.find(sub) != std::string::npos;
}

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string base_name(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t s = p.rfind('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

struct Plan {
  std::string name;  // GGUF name
  const TensorView* src;
  DType type;
};

// Converts rows [r0, r1) of src (cols each) to dst type t.
void convert_rows(const TensorView& src, DType t, int64_t cols, int64_t r0, int64_t r1,
                  uint8_t* out, std::vector<float>& tmp) {
  const uint64_t rb = row_bytes(t, cols);
  tmp.resize(cols);
  for (int64_t r = r0; r < r1; ++r) {
    src.to_f32(r * cols, cols, tmp.data());
    quantize_row(t, tmp.data(), out + (r - r0) * rb, cols);
  }
}

// A single tensor type by its ggml name (lower case), for the overrides.
DType parse_tensor_type(const std::string& flag, const std::string& s) {
  std::string names;
  for (const DTypeTraits& d : all_dtypes()) {
    std::string n = d.name;
    for (char& ch : n) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (s == n) return d.type;
    names += (names.empty() ? "" : "|") + n;
  }
  throw Error(flag + " '" + s + "' is not one of " + names);
}

}  // namespace

void add_tensor_type_overrides(CLI::App* cmd, ConvertOpts& o) {
  cmd->add_option("--output-type", o.output_type,
                  "type of output.weight (the LM head), overriding the recipe: "
                  "f32|f16|bf16|q8_0|q4_0|q4_k|q5_k|q6_k");
  cmd->add_option("--embd-type", o.embd_type,
                  "type of token_embd.weight, overriding the recipe (same names)");
}

int convert_to_gguf(const ConvertOpts& o, bool require_hf_dir) {
  const FType* ft = nullptr;
  static const FType kKeep = {"keep", DType::BF16, 32, false, false, false};
  for (const FType& f : kFTypes)
    if (o.type == f.name) ft = &f;
  if (o.keep_types) ft = &kKeep;
  if (!ft) throw Error("--type '" + o.type + "' is not one of " + kConvertTypes);
  // (Plain flags rather than std::optional: GCC 12 warns on optional<enum> here.)
  const bool has_out = !o.output_type.empty(), has_embd = !o.embd_type.empty();
  const DType out_type = has_out ? parse_tensor_type("--output-type", o.output_type) : DType::F32;
  const DType embd_type = has_embd ? parse_tensor_type("--embd-type", o.embd_type) : DType::F32;
  if (require_hf_dir && !is_dir(o.in))
    throw Error(o.in +
                ": not a directory; dory convert takes a Hugging Face directory "
                "(use dory quantize for a GGUF input)");
  std::string resolved;
  std::unique_ptr<Weights> w = load_weights(o.in, &resolved);
  merge_adapters(*w, o.merge_lora);
  const DoryConfig& c = w->cfg;

  gguf::Writer wr;
  std::string tok_note;
  if (w->gguf) {
    // Keep the input's metadata (tokenizer, template, anything else) as it is.
    for (const auto& [k, v] : w->gguf->metadata())
      if (k != "general.alignment" && k.rfind("dory.turbo.", 0) != 0) wr.set(k, v);
  } else {
    wr.set("general.architecture", gguf::Value::str("dory"));
    wr.set("general.name", gguf::Value::str(base_name(resolved)));
  }
  write_dory_metadata(wr, c);
  if (!o.keep_types || !w->gguf) wr.set("general.file_type", gguf::Value::u32(ft->file_type));
  wr.set("general.quantization_version", gguf::Value::u32(2));
  if (!w->gguf) tok_note = write_tokenizer_metadata(wr, resolved, c.vocab);

  // Tensors in name order (llama.cpp's quantizer walks them in that order, and
  // its use_more_bits counters follow it).
  std::map<std::string, const TensorView*> src;
  for (const TensorView& t : w->all) {
    const std::string g = w->gguf ? t.name : gguf_tensor_name(t.name);
    src[g] = &t;
  }
  int64_t n_wv = 0, n_down = 0, i_wv = 0, i_down = 0;
  for (const auto& [name, t] : src) {
    n_wv += contains(name, "attn_v.weight");
    n_down += contains(name, "ffn_down.weight");
  }
  std::vector<Plan> plan;
  for (const auto& [name, t] : src) {
    DType ty;
    if (t->shape.size() == 1) {
      ty = ft->base == DType::BF16 ? DType::BF16 : ft->base == DType::F16 ? DType::F16 : DType::F32;
    } else {
      const int64_t cols = t->shape.back();
      ty = ft->base;
      if (name == "output.weight" && ft->output_q6k)
        ty = dtype_row_ok(DType::Q6_K, cols) ? DType::Q6_K : DType::Q8_0;
      if (ft->k_mix && contains(name, "attn_v.weight") && use_more_bits(i_wv, n_wv))
        ty = DType::Q6_K;
      if (ft->k_mix && contains(name, "ffn_down.weight") && use_more_bits(i_down, n_down))
        ty = DType::Q6_K;
      if (name == "token_embd.weight" && ft->embd_bf16 && !dtype_is_quantized(t->dtype))
        ty = DType::BF16;
      if (name == "output.weight" && has_out) ty = out_type;
      if (name == "token_embd.weight" && has_embd) ty = embd_type;
      ty = fallback(ty, cols);
    }
    if (o.keep_types) ty = t->dtype;
    if (contains(name, "attn_v.weight")) ++i_wv;
    if (contains(name, "ffn_down.weight")) ++i_down;
    plan.push_back({name, t, ty});
    wr.add_tensor(name, ty, t->shape);
  }

  // The turbo keys and tensors (dory calibrate's, else the input's own), after the model's.
  const Turbo& turbo = o.turbo ? *o.turbo : w->turbo;
  declare_turbo(wr, turbo, c);

  uint64_t total = 0;
  write_replacing(o.out, [&](const std::string& tmp) {
    wr.begin(tmp);
    if (!o.quiet) {
      std::fprintf(stderr, "writing %s: %zu tensors, type %s%s%s\n", o.out.c_str(), plan.size(),
                   ft->name, tok_note.empty() ? "" : ", ", tok_note.c_str());
    }
    const int nth = o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
    for (size_t k = 0; k < plan.size(); ++k) {
      const Plan& p = plan[k];
      const TensorView& t = *p.src;
      const int64_t cols = t.shape.back();
      const int64_t rows = t.numel() / std::max<int64_t>(cols, 1);
      const uint64_t rb = row_bytes(p.type, cols);
      if (t.dtype == p.type) {
        wr.write_tensor(t.data, t.nbytes());  // same type: the bytes as they are
      } else {
        // Pieces of up to ~64 MiB of output, rows spread over threads.
        const int64_t step =
            std::max<int64_t>(1, int64_t((64ull << 20) / std::max<uint64_t>(rb, 1)));
        std::vector<uint8_t> buf;
        for (int64_t r0 = 0; r0 < rows; r0 += step) {
          const int64_t r1 = std::min(rows, r0 + step);
          buf.resize((r1 - r0) * rb);
          const int64_t nt = std::min<int64_t>(nth, r1 - r0);
          std::vector<std::thread> th;
          for (int64_t i = 0; i < nt; ++i) {
            const int64_t a = r0 + (r1 - r0) * i / nt, b = r0 + (r1 - r0) * (i + 1) / nt;
            th.emplace_back([&, a, b] {
              std::vector<float> f;
              convert_rows(t, p.type, cols, a, b, buf.data() + (a - r0) * rb, f);
            });
          }
          for (auto& x : th) x.join();
          wr.write_tensor_data(buf.data(), buf.size());
        }
      }
      total += rows * rb;
      if (!o.quiet)
        std::fprintf(stderr, "[%3zu/%zu] %-28s %-5s %-14s -> %-5s %s\n", k + 1, plan.size(),
                     p.name.c_str(), dtype_name(t.dtype), shape_str(t.shape).c_str(),
                     dtype_name(p.type), human_bytes(rows * rb).c_str());
    }
    write_turbo_data(wr, turbo);
    wr.finish();
  });
  if (!o.quiet)
    std::fprintf(stderr, "wrote %s (%s of tensor data)\n", o.out.c_str(), human_bytes(total).c_str());
  return 0;
}

// --merge-lora: every adapted matrix becomes W + sum(scale * B @ A) in float, and its view (in
// w.all, by name) points at that, so the writers take it as any float tensor.
void merge_adapters(Weights& w, const std::vector<std::string>& specs) {
  if (specs.empty()) return;
  apply_loras(w, specs);
  std::map<const void*, std::pair<const kern::Mat*, TensorView*>> by_data;
  for (TensorView& t : w.all) by_data[t.data] = {nullptr, &t};
  size_t merged = 0;
  for (auto& [mat, deltas] : w.loras) {
    auto it = by_data.find(mat->data);
    if (it == by_data.end()) continue;
    TensorView& t = *it->second.second;
    std::vector<float>& m = w.decoded.emplace_back(t.to_f32());
    const int64_t rows = mat->rows, cols = mat->cols;
    for (const kern::LoraDelta& d : deltas)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          double s = 0;
          for (int64_t k = 0; k < d.rank; ++k) s += double(d.bt[k * rows + r]) * d.a[k * cols + c];
          m[r * cols + c] += static_cast<float>(d.scale * s);
        }
    t.dtype = DType::F32;
    t.data = m.data();
    ++merged;
  }
  std::fprintf(stderr, "merged %zu adapted matrices from %zu adapter%s\n", merged, specs.size(),
               specs.size() == 1 ? "" : "s");
}

// dory convert/quantize IN OUT.cmf: the model as cortiq's CMF container, tensors under their
// Hugging Face names, the whole Dory config in the header's arch object (so the file needs no
// config.json beside it), the tokenizer.json and chat template when the input has them.
int convert_to_cmf(const ConvertOpts& o) {
  using nlohmann::json;
  static const char* const kTypes = "bf16|f16|f32|q8_2f";
  const std::string ty = o.type.empty() ? "bf16" : o.type;
  if (ty != "bf16" && ty != "f16" && ty != "f32" && ty != "q8_2f")
    throw Error("--type '" + ty + "' is not a CMF type dory.cpp writes (" + kTypes + ")");
  std::string resolved;
  std::unique_ptr<Weights> w = load_weights(o.in, &resolved);
  merge_adapters(*w, o.merge_lora);
  const DoryConfig& c = w->cfg;
  json arch = json::parse(hf_config_json(c));
  arch.erase("architectures");
  arch.erase("model_type");
  arch["arch_name"] = "dory";
  for (const auto& [cortiq, hf] : cmf::arch_key_names()) {  // cortiq's names for the common keys
    arch[cortiq] = arch[hf];
    arch.erase(hf);
  }
  arch["rms_norm_eps"] = 1e-6;
  // cortiq's readers require layer_types; hybrid_layer_pattern is what Dory reads (an MLP
  // layer has no cortiq name: it is written as its block's attention kind would be).
  json types = json::array();
  for (char k : c.pattern) types.push_back(k == '*' ? "FullAttention" : "SlidingAttention");
  arch["layer_types"] = types;
  json header = {{"format", "cmf"},
                 {"version", 2},
                 {"arch", arch},
                 {"quant_type", ty == "q8_2f" ? "Q8_2F"
                                : ty == "f16" ? "F16"
                                : ty == "f32" ? "F32"
                                              : "BF16"},
                 {"provenance", {{"converter", "dory.cpp"}, {"source", base_name(resolved)}}}};
  // The tokenizer: tokenizer.json (+ the chat template of tokenizer_config.json) beside an HF
  // model, or a CMF input's own; a GGUF input's tokenizer is not a tokenizer.json.
  std::string vocab, tmpl;
  if (w->cmf) {
    vocab = std::string(w->cmf->vocab());
    tmpl = w->cmf->chat_template();
  } else if (!w->gguf) {
    struct stat st {};
    const std::string dir = is_dir(resolved) ? resolved : resolved.substr(0, resolved.rfind('/'));
    if (::stat((dir + "/tokenizer.json").c_str(), &st) == 0)
      vocab = read_text_file(dir + "/tokenizer.json");
    if (::stat((dir + "/tokenizer_config.json").c_str(), &st) == 0) {
      try {
        const json tc = json::parse(read_text_file(dir + "/tokenizer_config.json"));
        if (tc.contains("chat_template") && tc["chat_template"].is_string())
          tmpl = tc["chat_template"];
      } catch (const json::exception&) {
        // a tokenizer_config.json that is not JSON: no template (the tokenizer reports it when
        // loaded)
      }
    }
  }
  json tc = {{"eos_token_ids", c.eos_ids}};
  if (!tmpl.empty()) tc["chat_template"] = tmpl;
  header["tokenizer_config"] = tc;
  cmf::Writer wr(header.dump());
  if (!vocab.empty()) wr.set_vocab(vocab);
  // Hugging Face names in CMF whatever the input called them (a GGUF's are llama.cpp's).
  std::map<std::string, const TensorView*> by_name;
  for (const TensorView& t : w->all) by_name[t.name] = &t;
  std::vector<std::pair<std::string, const TensorView*>> order;
  for (const auto& [hf, shape] : expected_tensors(c)) {
    auto it = by_name.find(w->gguf ? gguf_tensor_name(hf) : hf);
    if (it == by_name.end()) throw Error(o.in + ": tensor '" + hf + "' not found");
    order.emplace_back(hf, it->second);
  }
  uint64_t total = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const TensorView& t = *order[k].second;
    const std::string& hf_name = order[k].first;
    int dt;
    std::vector<uint8_t> payload;
    const std::vector<float> f = t.to_f32();
    if (ty == "q8_2f" && t.shape.size() == 2) {
      dt = cmf::kQ8_2f;
      payload = cmf::encode_q8_2f(f.data(), t.shape[0], t.shape[1]);
    } else {
      const DType d = ty == "f16"                    ? DType::F16
                      : ty == "f32" || ty == "q8_2f" ? DType::F32
                                                     : DType::BF16;
      dt = d == DType::F16 ? cmf::kF16 : d == DType::F32 ? cmf::kF32 : cmf::kBF16;
      payload.resize(row_bytes(d, static_cast<int64_t>(f.size())));
      if (t.dtype == d)
        std::memcpy(payload.data(), t.data, payload.size());  // the bytes as they are
      else
        quantize_row(d, f.data(), payload.data(), static_cast<int64_t>(f.size()));
    }
    total += payload.size();
    if (!o.quiet)
      std::fprintf(stderr, "[%3zu/%zu] %-44s %-5s %-14s -> %s\n", k + 1, order.size(),
                   hf_name.c_str(), dtype_name(t.dtype), shape_str(t.shape).c_str(),
                   cmf::dtype_name(dt));
    wr.add(hf_name, dt, t.shape, std::move(payload));
  }
  write_replacing(o.out, [&](const std::string& tmp) { wr.write(tmp); });
  if (!o.quiet)
    std::fprintf(stderr, "wrote %s (CMF v2, %s of tensor data%s)\n", o.out.c_str(),
                 human_bytes(total).c_str(), vocab.empty() ? ", no tokenizer" : ", tokenizer.json");
  return 0;
}

Runner add_convert(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "convert",
      std::string("convert a Hugging Face directory to GGUF (llama.cpp's Dory layout), or to CMF\n"
                  "(OUT.cmf: --type bf16|f16|f32|q8_2f; docs/cmf.md)\n") +
          kConvertRecipe);
  auto o = std::make_shared<ConvertOpts>();
  cmd->add_option("input", o->in, "Hugging Face directory (config.json + safetensors)")->required();
  cmd->add_option("output", o->out, "output .gguf, or .cmf for cortiq's container")->required();
  cmd->add_option("--type", o->type,
                  std::string("weight type (default bf16): ") + kConvertTypes +
                      "; for .cmf bf16|f16|f32|q8_2f");
  cmd->add_option("-t,--threads", o->threads, "threads (default all cores)");
  cmd->add_flag("-q,--quiet", o->quiet, "no per-tensor progress lines");
  cmd->add_option(
      "--merge-lora", o->merge_lora,
      "merge this LoRA adapter (PEFT DIR or adapter_model.safetensors, or a GGUF adapter file, "
      "optionally :SCALE) into the written weights (repeatable)");
  add_tensor_type_overrides(cmd, *o);
  return [o] { return cmf::is_cmf_name(o->out) ? convert_to_cmf(*o) : convert_to_gguf(*o, true); };
}

static const bool registered = register_command(74, add_convert);

}  // namespace dory::cli
