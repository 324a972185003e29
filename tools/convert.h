// Shared by `dory convert` and `dory quantize`: writes a model as GGUF in
// llama.cpp's Dory layout at a chosen weight type (tools/cmd_convert.cpp).
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace dory {
struct Turbo;
}

namespace dory::cli {

struct ConvertOpts {
  std::string in, out;
  std::string type = "bf16";
  // Overrides of the recipe for output.weight and token_embd.weight (llama-quantize's
  // --output-tensor-type / --token-embedding-type); "" = the recipe's.
  std::string output_type, embd_type;
  int threads = 0;
  bool quiet = false;
  // dory calibrate: every tensor keeps its type (type is ignored), and the turbo
  // keys and tensors of *turbo replace any the input has.
  bool keep_types = false;
  const Turbo* turbo = nullptr;
  // --merge-lora: PEFT adapters merged into the written weights (W + scale * B @ A).
  std::vector<std::string> merge_lora;
};

// The --type names, for help texts.
extern const char* const kConvertTypes;
// The recipe table, for --help.
extern const char* const kConvertRecipe;

// Adds --output-type and --embd-type to a convert/quantize command.
void add_tensor_type_overrides(CLI::App* cmd, ConvertOpts& o);

int convert_to_gguf(const ConvertOpts& o, bool require_hf_dir);
// OUT.cmf: cortiq's container (bf16|f16|f32|q8_2f); any input dory reads.
int convert_to_cmf(const ConvertOpts& o);

}  // namespace dory::cli
