// The two tables other code reads instead of switching: dtypes (tensor/dtype.h) and
// config keys (format/config_keys.h).
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "dory/error.h"
#include "format/config_keys.h"
#include "format/gguf.h"
#include "tensor/dtype.h"
#include "tensor/quant.h"

using namespace dory;

TEST(DTypeTable, EveryRowAgreesWithItself) {
  std::set<uint32_t> ids;
  std::set<std::string> names;
  for (const DTypeTraits& d : all_dtypes()) {
    EXPECT_EQ(&dtype_traits(d.type), &d) << d.name;
    EXPECT_TRUE(names.insert(d.name).second) << d.name;
    EXPECT_TRUE(ids.insert(d.ggml_id).second) << d.name;
    EXPECT_EQ(dtype_from_ggml_id(d.ggml_id), &d) << d.name;
    EXPECT_EQ(gguf::ggml_type_id(d.type), d.ggml_id) << d.name;
    EXPECT_EQ(row_bytes(d.type, d.block_elems), static_cast<uint64_t>(d.block_bytes)) << d.name;
    EXPECT_EQ(d.quantized, d.block_elems > 1) << d.name;
    EXPECT_EQ(d.safetensors != nullptr, !d.quantized) << d.name;
    if (d.safetensors) {
      DType t;
      ASSERT_TRUE(parse_safetensors_dtype(d.safetensors, &t));
      EXPECT_EQ(t, d.type);
    }
    // A block of values in [-1, 1] survives quantize -> dequantize within one 4-bit step
    // (1/8: Q4_0's codes run -8..7 times max/8, so +1 comes back as 0.875).
    std::vector<float> x(d.block_elems), y(d.block_elems);
    for (int i = 0; i < d.block_elems; ++i) x[i] = 0.25f * static_cast<float>((i % 9) - 4);
    std::vector<uint8_t> q(d.block_bytes);
    quantize_row(d.type, x.data(), q.data(), d.block_elems);
    dequantize_row(d.type, q.data(), y.data(), d.block_elems);
    for (int i = 0; i < d.block_elems; ++i) EXPECT_NEAR(y[i], x[i], 0.125 + 1e-6) << d.name << " " << i;
  }
  EXPECT_EQ(dtype_from_ggml_id(999), nullptr);
  // GGUF ids are ggml's enum values.
  EXPECT_EQ(dtype_traits(DType::Q4_K).ggml_id, 12u);
  EXPECT_EQ(dtype_traits(DType::BF16).ggml_id, 30u);
}

namespace {
// A config.json / GGUF stand-in: string -> number or text.
struct MapReader {
  std::map<std::string, double> num;
  std::map<std::string, std::string> str;
  bool has(const std::string& k) const { return num.count(k) || str.count(k); }
  int64_t integer(const std::string& k) const {
    if (!num.count(k)) throw Error("key '" + k + "' is missing");
    return static_cast<int64_t>(num.at(k));
  }
  double number(const std::string& k) const {
    if (!num.count(k)) throw Error("key '" + k + "' is missing");
    return num.at(k);
  }
  std::string string(const std::string& k) const {
    if (!str.count(k)) throw Error("key '" + k + "' is missing");
    return str.at(k);
  }
};
}  // namespace

TEST(ConfigKeyTable, ReadsEveryPlainKeyByEitherNameAndDefaults) {
  std::set<std::string> hf, gg;
  for (const ConfigKey& k : config_keys()) {
    if (k.hf) {
      EXPECT_TRUE(hf.insert(k.hf).second) << k.hf;
    }
    if (k.gguf && k.write) {
      EXPECT_TRUE(gg.insert(k.gguf).second) << k.gguf;
    }
  }
  for (bool gguf : {false, true}) {
    MapReader r;
    double v = 1;
    for (const ConfigKey& k : config_keys()) {
      const char* name = gguf ? k.gguf : k.hf;
      if (!name || k.kind == ConfigKey::Kind::Special) continue;
      if (k.kind == ConfigKey::Kind::String) r.str[name] = "S-*-";
      else if (k.required || k.gguf_required) r.num[name] = v++;
    }
    DoryConfig c;
    read_config_keys(r, gguf, c);
    EXPECT_EQ(c.n_layer, static_cast<int64_t>(r.num[gguf ? "dory.block_count" : "num_hidden_layers"]));
    EXPECT_EQ(c.pattern, "S-*-");
    EXPECT_EQ(c.max_positions, 8192);      // default
    EXPECT_EQ(c.swa_window, 0);            // default
    EXPECT_EQ(c.rope_theta_2, c.rope_theta);  // defaults to rope_theta
    // A required key that is missing is named.
    MapReader bad = r;
    bad.num.erase(gguf ? "dory.init_std" : "init_method_std");
    try {
      read_config_keys(bad, gguf, c);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(gguf ? "dory.init_std" : "init_method_std"), std::string::npos);
    }
  }
  EXPECT_EQ(gguf_key_for("hidden_size"), "dory.embedding_length");
  EXPECT_EQ(gguf_key_for("partial_rotary_factor_2"), "dory.rope.dimension_count");
  EXPECT_EQ(gguf_key_for("no_such_key"), "");
}
