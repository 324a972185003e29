// llama.cpp's Dory layout in GGUF (docs/model.md section 1): the metadata keys that
// carry DoryConfig, and the tensor names. Scale vectors are stored raw (as in
// the Hugging Face export); the loader folds their constants like it does for
// safetensors, as llama.cpp's graph does.
#pragma once
#include <string>

#include "dory/model.h"
#include "format/gguf.h"

namespace dory {

// "backbone.layers.3.mixer.q_proj.weight" -> "blk.3.attn_q.weight", etc.
// Returns "" for a name that is not a Dory tensor.
std::string gguf_tensor_name(const std::string& hf_name);

// Reads and validates the config from the dory.* keys; errors name the GGUF key.
// f32 values are taken as the shortest decimal that rounds to them (0.02f -> 0.02),
// so a converted file computes exactly what its config.json does.
DoryConfig config_from_gguf(const gguf::File& f);

// Writes general.architecture and the dory.* keys of c.
void write_dory_metadata(gguf::Writer& w, const DoryConfig& c);

// Embeds tokenizer.ggml.* and tokenizer.chat_template from a Hugging Face
// directory's tokenizer.json / tokenizer_config.json (byte-level BPE only).
// Returns a note on what was embedded ("" when the directory has no tokenizer).
// The token list is padded to vocab with [PADn] entries (as llama.cpp's conversion does).
std::string write_tokenizer_metadata(gguf::Writer& w, const std::string& hf_dir, int64_t vocab);

}  // namespace dory
