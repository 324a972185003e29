// A "turbo" model file (docs/model.md section 7): a Dory GGUF that also carries defaults
// for the runtime features and the tensors fitted for them by `dory calibrate`.
//
// Keys (all optional; any one makes the file a turbo file):
//   dory.turbo.exit_bias     f32        recon gate: one pass when score >= bias
//   dory.turbo.o1            u32[4]     far field m, w, sink, seal
//   dory.turbo.exact_budget  u32        rows kept exact per full-attention slot
// Tensors (F32):
//   dory_router.easy_mean [H], dory_router.easy_basis [r_easy, H],
//   dory_router.hard_mean [H], dory_router.hard_basis [r_hard, H]   the recon router
//   dory_exact.weight [full layers, 2 * n_kv_head]                    exact-row weights
//                      (row = full layer in order; per KV head: key residual, value norm)
// Defaults in force unless a flag says otherwise: kv last_loop, the recon gate
// (when there is a router), o1, prompt_loops = 1, exact rows (when there are weights).
#pragma once
#include <string>
#include <vector>

#include "format/gguf.h"
#include "model/weights.h"

namespace dory {

bool is_turbo_tensor(const std::string& gguf_name);

// Reads the turbo keys and tensors of f (validated against c; errors name the key
// or tensor). An absent part stays empty.
Turbo read_turbo(const gguf::File& f, const DoryConfig& c);

// Declares the turbo keys and tensors of t on w (call before begin()); then
// write_turbo_data() writes the tensors' bytes, in the same order, after every
// other declared tensor.
void declare_turbo(gguf::Writer& w, const Turbo& t, const DoryConfig& c);
void write_turbo_data(gguf::Writer& w, const Turbo& t);

// The number of full-attention layers (the rows of dory_exact.weight).
int64_t full_layer_count(const DoryConfig& c);

// Exact-row weights from a GGUF made by dory calibrate (its dory_exact.weight), or from
// cortiq's raw weight file (little-endian f32: one float skipped, then the same weights in
// the same order), checked against c.
std::vector<float> load_exact_weights(const std::string& path, const DoryConfig& c);

// The recon router of --gate recon:FILE: a GGUF's dory_router.* tensors (with its exit bias
// as the default), or a raw f32 router file (one float skipped, then easy mean [H], easy
// basis [r x H], hard mean [H], hard basis [r x H]; bias 0), checked against c.
Router load_router(const std::string& path, const DoryConfig& c);
// The raw files dory calibrate --raw writes (the header float: the rank, resp. the number of
// full layers; readers skip it). Written whole or not at all.
void write_raw_router(const std::string& path, const Router& r);
void write_raw_exact(const std::string& path, const std::vector<float>& weights, const DoryConfig& c);

}  // namespace dory
