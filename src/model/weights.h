#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dory/model.h"
#include "dory/options.h"
#include "format/cmf.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/gate.h"
#include "tensor/kernels.h"

namespace dory {

// One physical layer: a single sub-layer (attention or MLP). Matrices point
// into the mapped files; the small scale vectors are folded with their
// constant factors into float at load.
struct LayerWeights {
  char kind = '-';  // 'S', '*' or '-'
  // attention
  kern::Mat wq{}, wk{}, wv{}, wg{}, wo{};
  std::vector<float> q_scale;     // (sqk * sqrt(hd) / sigma)^2        [nh*hd]
  std::vector<float> gate_scale;  // (s_gate * sqrt(g0) / sigma)^2     [nh*hd]
  int rope_profile = 1;
  // mlp
  kern::Mat w_gate{}, w_up{}, w_down{};
  std::vector<float> suv_gate, suv_up;  // suv * sqrt(H)                [F]
  // residual rate |alpha * a0 / sigma|                                 [H]
  std::vector<float> alpha;
};

// Defaults and fitted tensors a "turbo" model file carries (docs/model.md section 7),
// each used unless a flag says otherwise.
struct Turbo {
  bool present = false;        // the file has any turbo key
  std::optional<O1Params> o1;  // dory.turbo.o1 = [m, w, sink, seal]
  std::optional<int64_t> exact_budget;
  Router router;  // empty() when the file has none
  // Exact-row weights [n full layers x n_kv_head x 2] (key residual, value norm).
  std::vector<float> exact_weights;
};

struct Weights {
  DoryConfig cfg;
  Turbo turbo;
  std::vector<std::unique_ptr<SafeTensorsFile>> files;
  std::unique_ptr<gguf::File> gguf;  // set when loaded from a .gguf (then files is empty)
  std::unique_ptr<cmf::File> cmf;    // set when loaded from a .cmf (shard 1 of a sharded model)
  std::vector<std::unique_ptr<cmf::File>> cmf_shards;  // the other shards
  std::unique_ptr<cmf::File> cmf_skill;  // --skill FILE.cmf: a standalone skill file (kept mapped)
  // Tensors decoded at load (CMF dtypes the kernels do not run yet, as F32): the views point here.
  std::vector<std::vector<float>> decoded;
  std::vector<std::vector<uint8_t>> repacked;                   // CMF q8_2f matrices as Q8_0 blocks
  std::vector<std::unique_ptr<SafeTensorsFile>> adapter_files;  // --lora files (kept mapped)
  std::map<const kern::Mat*, std::vector<kern::LoraDelta>> loras;  // what each Mat::lora points at
  std::vector<std::string> adapter_names;  // the --lora specs in order (adapter ids 0, 1, ...)
  std::vector<float> adapter_scales;       // their :SCALE (1 when not given)
  std::vector<TensorView> all;             // every tensor, for info
  TensorView embd;                         // [V, H]
  kern::Mat lm_head{};                     // [V, H]
  std::vector<float> logit_scale;          // logit_scale / sigma   [V]
  std::vector<LayerWeights> layers;
};

// Loads a Hugging Face directory (or a file in one). Checks every tensor's
// presence, dtype and shape against the config; throws Error naming them.
std::unique_ptr<Weights> load_hf_weights(const std::string& path, std::string* resolved_dir);

// Loads a .gguf in llama.cpp's Dory layout: the same checks (every tensor
// present, shaped right, nothing unexpected); matrices may be any weight type,
// 1-D tensors F32/F16/BF16.
std::unique_ptr<Weights> load_gguf_weights(const std::string& path);
// The same for a parsed file (one read from memory: tests and fuzzing).
std::unique_ptr<Weights> load_gguf_weights(std::unique_ptr<gguf::File> file);

// A CMF file (cortiq's container, docs/cmf.md): tensors under the Hugging Face names; the
// config from the header's "arch" object with Dory's keys (under config.json's names) and a
// config.json beside the file, which must agree where both say something. f32/f16/bf16 are
// used in place; q8_2f, q8_row, q4_block, q4_tiled, q4tp and q2tp become ggml Q8_0 / Q4_0
// blocks at load (weights.cpp, repack_groups: their scales to f16) and run on those kernels;
// vbit and the others the kernels cannot take are decoded to F32. Skill tensors
// (skill.ID.NAME) are left to the skills.
// skill: "" / "none", or the id of a skill in the file's header whose tensors (skill.ID.NAME)
// replace the backbone's NAME, read in place as the backbone's are.
std::unique_ptr<Weights> load_cmf_weights(const std::string& path, const std::string& skill = "");

// LoRA adapters ("DIR_OR_adapter_model.safetensors[:SCALE]" for PEFT's, "FILE.gguf[:SCALE]" for
// llama.cpp's GGUF adapters: general.type "adapter", NAME.lora_a / NAME.lora_b on the model's
// GGUF tensor names, scale alpha / rank), applied at run time: each
// adapted matrix's Mat::lora lists (A, B, scale * lora_alpha / r) and the CPU backend adds
// scale * B (A x) to its products; the base weights are not touched. Throws Error naming the
// file and the tensor for a module the model does not have or a shape that does not fit.
void apply_loras(Weights& w, const std::vector<std::string>& specs);

// Any of the above, by what path is.
std::unique_ptr<Weights> load_weights(const std::string& path, std::string* resolved,
                                      const std::string& skill = "");

// The tensor names and shapes a config implies, in a stable order.
std::vector<std::pair<std::string, std::vector<int64_t>>> expected_tensors(const DoryConfig& c);

}  // namespace dory
