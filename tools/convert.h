// Shared by `dory convert` and `dory quantize`: writes a model as GGUF in
// llama.cpp's Dory layout at a chosen weight type (tools/cmd_convert.cpp).
#pragma once
#include <string>

namespace dory::cli {

struct ConvertOpts {
  std::string in, out;
  std::string type = "bf16";
  int threads = 0;
  bool quiet = false;
};

// The --type names, for help texts.
extern const char* const kConvertTypes;
// The recipe table, for --help.
extern const char* const kConvertRecipe;

int convert_to_gguf(const ConvertOpts& o, bool require_hf_dir);

}  // namespace dory::cli
