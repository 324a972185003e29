// One table of the model's config keys: the config.json name, the GGUF name, the type,
// whether it must be there and its default. The Hugging Face reader (hf_config.cpp), the
// GGUF reader and the GGUF writer (model/gguf_dory.cpp) all walk it; the few keys whose
// reading is more than "a number into a field" are marked Special and handled beside it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dory/model.h"

namespace dory {

struct ConfigKey {
  enum class Kind { Int, Float, String, Special };
  const char* hf;    // config.json name (nullptr: GGUF only)
  const char* gguf;  // GGUF metadata name (nullptr: config.json only)
  Kind kind;
  bool required;     // config.json: must be there
  bool gguf_required;
  int64_t DoryConfig::*i = nullptr;      // Int
  double DoryConfig::*f = nullptr;       // Float
  std::string DoryConfig::*s = nullptr;  // String
  double dflt = 0;                       // optional Int / Float: the value when absent
  const char* dflt_from = nullptr;       // optional Float: absent means this key's value (config.json name)
  bool write = true;                     // the GGUF writer writes it (false: an alias of another row)
};

// In the order the GGUF writer writes them.
const std::vector<ConfigKey>& config_keys();
// The GGUF key that carries a config.json key (for errors that name the file's own key);
// "" when none does.
std::string gguf_key_for(const std::string& hf_key);

// Reads the Int / Float / String keys through a reader with has(k), integer(k), number(k)
// and string(k) (each throwing an Error that names the key), by config.json names
// (gguf = false) or GGUF names. Special keys are left to the caller.
template <class Reader>
void read_config_keys(const Reader& r, bool gguf, DoryConfig& c) {
  for (const ConfigKey& k : config_keys()) {
    const char* name = gguf ? k.gguf : k.hf;
    if (!name || k.kind == ConfigKey::Kind::Special) continue;
    const bool need = gguf ? k.gguf_required : k.required;
    if (!need && !r.has(name)) {
      if (k.kind == ConfigKey::Kind::Int) c.*k.i = static_cast<int64_t>(k.dflt);
      if (k.kind == ConfigKey::Kind::Float) {
        c.*k.f = k.dflt;
        if (k.dflt_from)
          for (const ConfigKey& o : config_keys())
            if (o.hf && std::string(o.hf) == k.dflt_from) c.*k.f = c.*o.f;
      }
      continue;
    }
    switch (k.kind) {
      case ConfigKey::Kind::Int: c.*k.i = r.integer(name); break;
      case ConfigKey::Kind::Float: c.*k.f = r.number(name); break;
      case ConfigKey::Kind::String: c.*k.s = r.string(name); break;
      case ConfigKey::Kind::Special: break;
    }
  }
}

}  // namespace dory
