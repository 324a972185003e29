#pragma once
#include <string>

#include "dory/model.h"

namespace dory {

// Reads a Hugging Face config.json into a validated DoryConfig. Errors name the
// file and the key.
DoryConfig parse_hf_config(const std::string& path);
DoryConfig parse_hf_config_text(const std::string& text, const std::string& where);

}  // namespace dory
