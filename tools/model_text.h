#pragma once
#include <memory>
#include <string>

#include "common.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace dory::cli {

// A model with its tokenizer (tokenizer.json beside the weights, a GGUF's own tokenizer.ggml.*
// metadata, or --tokenizer).
struct Loaded {
  std::shared_ptr<const Model> model;
  std::shared_ptr<Backend> backend;  // --device's, with the model on it
  std::unique_ptr<Tokenizer> tok;
};
Loaded load_model_and_tokenizer(const RunOpts& run, const std::string& tokenizer_path);

// The model's chat template, or ChatML (with a note on stderr) when it has none.
std::string chat_template_source(const Tokenizer& tok);

}  // namespace dory::cli
