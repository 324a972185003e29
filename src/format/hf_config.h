#pragma once
#include <string>

#include "dory/model.h"

namespace dory {

// Reads a Hugging Face config.json into a validated DoryConfig. Errors name the
// file and the key.
DoryConfig parse_hf_config(const std::string& path);
DoryConfig parse_hf_config_text(const std::string& text, const std::string& where);

// The config.json a DoryConfig reads back from (its keys from the config key table, the
// fixed-value keys Dory's checkpoints carry), as JSON text.
std::string hf_config_json(const DoryConfig& c);

}  // namespace dory
