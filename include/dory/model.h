// A loaded Dory model: configuration plus immutable weights, memory-mapped
// from the files or read into memory (WeightPlacement).
// Shared by every session and thread; nothing in it changes after load().
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dory/error.h"
#include "dory/options.h"

namespace dory {

// The model section of docs/model.md, as read from config.json (or GGUF metadata).
struct DoryConfig {
  int64_t hidden = 0;      // H
  int64_t ffn = 0;         // F
  int64_t n_head = 0;      // nh
  int64_t n_kv_head = 0;   // nk
  int64_t head_dim = 0;    // hd
  int64_t vocab = 0;       // V
  int64_t n_layer = 0;     // L
  std::string pattern;     // one of S * - per layer
  int64_t n_input = 0, n_recurrent = 0, n_output = 0;
  int64_t n_loops = 1;
  KvMode kv_mode = KvMode::PerLoop;
  int64_t swa_window = 0;  // W
  double rope_theta = 10000, rope_theta_2 = 10000;
  std::vector<int> rope_profile;  // per layer: 1 or 2
  double partial_rotary = 1.0, partial_rotary_2 = 1.0;
  double init_std = 0.02;   // sigma
  double alpha_init = 0.05; // a0
  std::optional<double> gate_init;  // g0; null means sqrt(H)
  int64_t max_positions = 0;
  std::vector<int64_t> bos_ids, eos_ids;

  double g0() const;
  int64_t rotary_dims(int profile) const;
  bool is_attention(int64_t layer) const { return pattern[layer] != '-'; }
  bool is_sliding(int64_t layer) const { return pattern[layer] == 'S'; }
  bool is_recurrent(int64_t layer) const {
    return layer >= n_input && layer < n_input + n_recurrent;
  }
  // Throws Error("<where>: ...") naming the offending key.
  void validate(const std::string& where) const;
};

struct Weights;  // src/model/weights.h

// Where the weights live once loaded.
//   Mapped (the default, --mmap): used in place from the memory-mapped files:
//     loading reads nothing, the page cache holds them once for every
//     process, the first token reads what is not cached yet.
//   Memory (--no-mmap): read into anonymous memory on 2 MiB (transparent
//     huge) pages at load. Decode reads every weight once per token; from
//     huge pages it streams them faster (4B-shaped Q4_0, 2 threads, the two
//     alternating within one run: products 32.7 GB/s mapped, 34.7 in memory;
//     whole runs interleaved, tg64 36.9 -> 38.5 GB/s). The price is the load:
//     the pages are zeroed and filled before the first token (about 0.3 s per
//     GiB on this VM when its memory is at hand, up to 2 s per GiB when the
//     host must first back the pages), and each process holds its own copy.
enum class WeightPlacement { Mapped, Memory };

class Model {
 public:
  // path: a Hugging Face directory (config.json + model.safetensors or a sharded
  // index), or one of those files inside it.
  // Memory: an Error (naming the file and why) when the weights cannot be
  // read into memory.
  // skill: a CMF file's skill to overlay (its skill.ID.NAME tensors read in place of NAME);
  // "" or "none" for the base model. Other formats have no skills: naming one is an Error.
  // loras: PEFT adapters ("DIR or adapter_model.safetensors[:SCALE]") applied at run time.
  static std::shared_ptr<const Model> load(const std::string& path,
                                           WeightPlacement place = WeightPlacement::Mapped,
                                           const std::string& skill = "", const std::vector<std::string>& loras = {});
  ~Model();

  const DoryConfig& config() const;
  const Weights& weights() const { return *weights_; }
  const std::string& path() const { return path_; }

  // For `dory info`.
  int64_t n_params() const;
  uint64_t file_bytes() const;
  // True when the weights were read into memory (WeightPlacement), false when
  // they are used from the mapped files.
  bool weights_in_memory() const;
  std::map<std::string, std::pair<int64_t, int64_t>> dtype_mix() const;  // dtype -> (tensors, elements)
  std::vector<std::string> files() const;
  // Weight bytes one decode token reads with `loops` recurrent passes.
  uint64_t bytes_per_token(int loops) const;

 private:
  Model() = default;
  std::string path_;
  std::unique_ptr<Weights> weights_;
};

}  // namespace dory
