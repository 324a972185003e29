#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "dory/model.h"

namespace dory {

// A JSON file, parsed; throws Error("PATH: not valid JSON: ...") or the read's own error.
nlohmann::json read_json_file(const std::string& path);

// Reads a Hugging Face config.json into a validated DoryConfig. Errors name the
// file and the key.
DoryConfig parse_hf_config(const std::string& path);
DoryConfig parse_hf_config_text(const std::string& text, const std::string& where);

// The config.json a DoryConfig reads back from (its keys from the config key table, the
// fixed-value keys Dory's checkpoints carry), as JSON text.
std::string hf_config_json(const DoryConfig& c);

}  // namespace dory
