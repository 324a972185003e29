#include "format/config_keys.h"

namespace dory {

const std::vector<ConfigKey>& config_keys() {
  using K = ConfigKey::Kind;
  using C = DoryConfig;
  // hf, gguf, kind, required (config.json), required (GGUF), int field, float field, string field, default.
  static const std::vector<ConfigKey> keys = {
      {"num_hidden_layers", "dory.block_count", K::Int, true, true, &C::n_layer},
      {"max_position_embeddings", "dory.context_length", K::Int, false, false, &C::max_positions, nullptr, nullptr,
       8192},
      {"hidden_size", "dory.embedding_length", K::Int, true, true, &C::hidden},
      {"intermediate_size", "dory.feed_forward_length", K::Int, true, true, &C::ffn},
      {"num_attention_heads", "dory.attention.head_count", K::Int, true, true, &C::n_head},
      {"num_key_value_heads", "dory.attention.head_count_kv", K::Int, true, true, &C::n_kv_head},
      // GGUF: may be left out, then token_embd.weight's rows say it (0 here until then).
      {"vocab_size", "dory.vocab_size", K::Int, true, false, &C::vocab},
      // config.json: attention_head_dim, or head_dim, agreeing when both are there.
      {"attention_head_dim", "dory.attention.key_length", K::Special, true, true},
      {nullptr, "dory.attention.value_length", K::Special, false, false},
      {"partial_rotary_factor", "dory.rope.dimension_count", K::Special, false, false},
      {"partial_rotary_factor_2", "dory.rope.dimension_count", K::Special, false, false, nullptr, nullptr, nullptr,
       0, nullptr, false},
      {"rope_theta", "dory.rope.freq_base", K::Float, true, true, nullptr, &C::rope_theta},
      {"swa_window_size", "dory.attention.sliding_window", K::Int, false, false, &C::swa_window},
      {"n_input_layers", "dory.input_layer_count", K::Int, true, true, &C::n_input},
      {"n_recurrent_layers", "dory.recurrent_layer_count", K::Int, true, true, &C::n_recurrent},
      {"n_output_layers", "dory.output_layer_count", K::Int, true, true, &C::n_output},
      {"n_recurrent_loops", "dory.recurrent_loop_count", K::Int, true, true, &C::n_loops},
      {"hybrid_layer_pattern", "dory.layer_pattern", K::String, true, true, nullptr, nullptr, &C::pattern},
      {"recurrent_kv_cache_mode", "dory.recurrent_kv_cache_mode", K::Special, false, false},
      {"rope_profile_layers", "dory.rope.profile", K::Special, false, true},
      {"rope_theta_2", "dory.rope.freq_base_2", K::Float, false, false, nullptr, &C::rope_theta_2, nullptr, 0,
       "rope_theta"},
      {"init_method_std", "dory.init_std", K::Float, true, true, nullptr, &C::init_std},
      {"ngpt_alpha_init", "dory.alpha_init", K::Float, true, true, nullptr, &C::alpha_init},
      {"attention_output_gate_logit_scale_init", "dory.gate_init", K::Special, false, false},
  };
  return keys;
}

std::string gguf_key_for(const std::string& hf_key) {
  for (const ConfigKey& k : config_keys())
    if (k.hf && k.gguf && hf_key == k.hf) return k.gguf;
  return "";
}

}  // namespace dory
