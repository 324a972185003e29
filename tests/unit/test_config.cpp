#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "format/hf_config.h"

using dory::Error;

namespace {

nlohmann::json good() {
  return {{"hidden_size", 64},          {"intermediate_size", 96},
          {"num_attention_heads", 4},   {"num_key_value_heads", 2},
          {"attention_head_dim", 16},   {"vocab_size", 256},
          {"num_hidden_layers", 4},     {"hybrid_layer_pattern", "S-*-"},
          {"n_input_layers", 1},        {"n_recurrent_layers", 2},
          {"n_output_layers", 1},       {"n_recurrent_loops", 2},
          {"swa_window_size", 4},       {"rope_theta", 10000.0},
          {"init_method_std", 0.02},    {"ngpt_alpha_init", 0.05}};
}

std::string error_of(const nlohmann::json& j) {
  try {
    dory::parse_hf_config_text(j.dump(), "cfg.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Config, GoodConfigParsesWithDefaults) {
  dory::DoryConfig c = dory::parse_hf_config_text(good().dump(), "cfg.json");
  EXPECT_EQ(c.rope_theta_2, 10000.0);  // defaults to rope_theta
  EXPECT_EQ(c.rope_profile, std::vector<int>(4, 1));
  EXPECT_DOUBLE_EQ(c.g0(), 8.0);  // sqrt(H) when null
  EXPECT_EQ(c.kv_mode, dory::KvMode::PerLoop);
  EXPECT_EQ(c.rotary_dims(1), 16);
}

TEST(Config, ErrorsNameTheKey) {
  for (const char* key : {"hidden_size", "hybrid_layer_pattern", "init_method_std", "rope_theta",
                          "n_recurrent_loops"}) {
    auto j = good();
    j.erase(key);
    EXPECT_NE(error_of(j).find(std::string("'") + key + "' is missing"), std::string::npos)
        << error_of(j);
  }
  auto j = good();
  j["hybrid_layer_pattern"] = "S-*";
  EXPECT_NE(error_of(j).find("hybrid_layer_pattern"), std::string::npos);
  j = good();
  j["n_output_layers"] = 2;
  EXPECT_NE(error_of(j).find("num_hidden_layers is 4"), std::string::npos) << error_of(j);
  j = good();
  j["ngpt"] = false;
  EXPECT_NE(error_of(j).find("'ngpt'"), std::string::npos);
  j = good();
  j["head_dim"] = 32;
  EXPECT_NE(error_of(j).find("head_dim"), std::string::npos);
  j = good();
  j["recurrent_kv_cache_mode"] = "sometimes";
  EXPECT_NE(error_of(j).find("recurrent_kv_cache_mode"), std::string::npos);
  j = good();
  j["partial_rotary_factor"] = 0.3;  // 4.8 -> 4 dims is fine; 0.1 -> 1 dim is odd
  EXPECT_EQ(error_of(j), "");
  j["partial_rotary_factor"] = 0.1;
  EXPECT_NE(error_of(j).find("partial_rotary_factor"), std::string::npos);
}
