// dory quantize IN OUT.gguf --type ...: IN is a Hugging Face directory or a GGUF.
#include "commands.h"
#include "convert.h"
#include "format/cmf.h"

namespace dory::cli {

Runner add_quantize(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "quantize",
      std::string(
          "write a model (HF directory, GGUF or CMF) as GGUF at a weight type (or as CMF)\n") +
          kConvertRecipe);
  auto o = std::make_shared<ConvertOpts>();
  o->type = "";
  cmd->add_option("input", o->in, "Hugging Face directory or .gguf")->required();
  cmd->add_option("output", o->out, "output .gguf (or .cmf: bf16|f16|f32|q8_2f)")->required();
  cmd->add_option("--type", o->type, std::string("weight type: ") + kConvertTypes)->required();
  cmd->add_option("-t,--threads", o->threads, "threads (default all cores)");
  cmd->add_flag("-q,--quiet", o->quiet, "no per-tensor progress lines");
  cmd->add_option(
      "--merge-lora", o->merge_lora,
      "merge this LoRA adapter (PEFT DIR or a GGUF adapter file, optionally :SCALE) into "
      "the weights (repeatable)");
  add_tensor_type_overrides(cmd, *o);
  return [o] { return cmf::is_cmf_name(o->out) ? convert_to_cmf(*o) : convert_to_gguf(*o, false); };
}

static const bool registered = register_command(75, add_quantize);

}  // namespace dory::cli
