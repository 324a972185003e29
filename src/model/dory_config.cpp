#include <cmath>
#include <string>

#include "dory/model.h"

namespace dory {

const char* kv_mode_name(KvMode m) { return m == KvMode::PerLoop ? "per_loop" : "last_loop"; }

KvMode parse_kv_mode(const std::string& s) {
  if (s == "per_loop") return KvMode::PerLoop;
  if (s == "last_loop") return KvMode::LastLoop;
  throw Error("unknown KV cache mode '" + s + "' (expected per_loop or last_loop)");
}

double DoryConfig::g0() const { return gate_init ? *gate_init : std::sqrt(double(hidden)); }

int64_t DoryConfig::rotary_dims(int profile) const {
  return static_cast<int64_t>(head_dim * (profile == 2 ? partial_rotary_2 : partial_rotary));
}

void DoryConfig::validate(const std::string& where) const {
  auto fail = [&](const std::string& key, const std::string& why) {
    throw Error(where + ": key '" + key + "' " + why);
  };
  auto positive = [&](const char* key, int64_t v, int64_t max) {
    if (v <= 0 || v > max)
      fail(key, "is " + std::to_string(v) + ", expected 1.." + std::to_string(max));
  };
  positive("hidden_size", hidden, 1 << 16);
  positive("intermediate_size", ffn, 1 << 18);
  positive("num_attention_heads", n_head, 1024);
  positive("num_key_value_heads", n_kv_head, 1024);
  positive("attention_head_dim", head_dim, 4096);
  positive("vocab_size", vocab, 1 << 24);
  positive("num_hidden_layers", n_layer, 4096);
  positive("n_recurrent_loops", n_loops, 16);
  if (n_head % n_kv_head)
    fail("num_key_value_heads", "(" + std::to_string(n_kv_head) +
                                    ") must divide num_attention_heads (" +
                                    std::to_string(n_head) + ")");
  if (static_cast<int64_t>(pattern.size()) != n_layer)
    fail("hybrid_layer_pattern", "has " + std::to_string(pattern.size()) +
                                     " characters but num_hidden_layers is " +
                                     std::to_string(n_layer));
  for (size_t i = 0; i < pattern.size(); ++i)
    if (pattern[i] != 'S' && pattern[i] != '*' && pattern[i] != '-')
      fail("hybrid_layer_pattern", std::string("has '") + pattern[i] + "' at layer " +
                                       std::to_string(i) + " (allowed: S, *, -)");
  if (n_input < 0 || n_recurrent < 0 || n_output < 0 ||
      n_input + n_recurrent + n_output != n_layer)
    fail("n_input_layers", "+ n_recurrent_layers + n_output_layers = " +
                               std::to_string(n_input) + " + " + std::to_string(n_recurrent) +
                               " + " + std::to_string(n_output) +
                               ", but num_hidden_layers is " + std::to_string(n_layer));
  if (pattern.find('S') != std::string::npos && swa_window <= 0)
    fail("swa_window_size", "must be positive when the pattern has S layers");
  if (static_cast<int64_t>(rope_profile.size()) != n_layer)
    fail("rope_profile_layers", "has " + std::to_string(rope_profile.size()) +
                                    " entries but num_hidden_layers is " +
                                    std::to_string(n_layer));
  for (int p : rope_profile)
    if (p != 1 && p != 2)
      fail("rope_profile_layers", "holds " + std::to_string(p) + " (allowed: 1, 2)");
  for (auto [key, f] : {std::pair{"partial_rotary_factor", partial_rotary},
                        std::pair{"partial_rotary_factor_2", partial_rotary_2}}) {
    // The range check comes first: converting an out-of-range double to int64 is UB.
    if (!(f > 0 && f <= 1))
      fail(key, "is " + std::to_string(f) + ", expected a fraction in (0, 1]");
    int64_t r = static_cast<int64_t>(head_dim * f);
    if (r <= 0 || r % 2)
      fail(key, "gives " + std::to_string(r) + " rotary dims; they must be positive, even and "
                "at most head_dim");
  }
  if (!(rope_theta > 0)) fail("rope_theta", "must be positive");
  if (!(rope_theta_2 > 0)) fail("rope_theta_2", "must be positive");
  if (!(init_std > 0)) fail("init_method_std", "must be positive");
  if (gate_init && !(*gate_init > 0)) fail("attention_output_gate_logit_scale_init", "must be positive");
  if (max_positions <= 0) fail("max_position_embeddings", "must be positive");
}

}  // namespace dory
