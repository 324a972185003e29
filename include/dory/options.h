// The settings a run chooses (loops, KV mode, the turbo features, the device) and the
// plain records the engine reports back. No engine types here: every layer may include it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dory {

// How the recurrent block's attention layers keep their caches (docs/model.md, "KV caches").
enum class KvMode { PerLoop, LastLoop };
const char* kv_mode_name(KvMode m);
KvMode parse_kv_mode(const std::string& s);  // throws Error

// Which logits a forward returns: none (only the caches move), the last row's, every row's.
enum class Logits { None, Last, All };

// Early exit (docs/model.md, "Early exit"): after the first recurrent pass a decode token
// either leaves (its logits from one pass) or takes the remaining passes.
struct GateParams {
  enum class Kind { Off, Conf, Recon, Auto };
  Kind kind = Kind::Off;
  double theta = 0.7;  // conf: exit when the top probability >= theta
  std::optional<double>
      bias;  // recon: one pass when score >= bias (default: the router's file's, else 0)
  // recon: the router from this file instead of the model file's (a GGUF made by dory
  // calibrate, or cortiq's raw f32 router: docs/turbo.md); "" = the model file's.
  std::string router_file;
  std::string str() const;  // as parse_gate reads it
};
// "off" | "conf:THETA" | "recon" | "recon:BIAS" | "recon:FILE" | "recon:FILE:BIAS" | "auto";
// throws Error naming --gate (also when FILE does not exist).
GateParams parse_gate(const std::string& s);

// The O(1) far field of the full-attention layers (docs/model.md, "Far field").
struct O1Params {
  bool on = false;
  int m = 32;           // landmarks (at most)
  int w = 128;          // exact recent rows
  int sink = 4;         // exact first rows
  int64_t seal = 1024;  // rows a slot holds exactly before it seals
  bool clamp =
      false;  // rectifier: false = "aggregate" (drop a negative far part), true = clamp u at 0
  void validate() const;    // throws Error unless the numbers fit together
  std::string str() const;  // "off" or "m,w,sink,seal"
};
// "off" or "m,w,sink,seal" (e.g. "32,128,4,1024"); throws Error naming --o1.
O1Params parse_o1(const std::string& s);

// Rows kept exact past the seal (docs/model.md, "Exact rows").
struct ExactParams {
  bool on = false;
  int64_t budget = 0;          // rows per full-attention slot
  std::vector<float> weights;  // [full layers x n_kv_head x 2]; empty = the model file's
  std::string source;          // where the weights came from (for messages)
  std::string spill_dir;       // "" = keep the waiting rows in RAM
  std::string str() const;
};
// "off" | "ROWS" (the model file's weights) | "FILE:ROWS" (weights from FILE, a GGUF
// made by dory calibrate); throws Error naming --exact.
ExactParams parse_exact(const std::string& s);

// Every optional field left empty takes the model file's default (a "turbo"
// file, docs/model.md, "Turbo files"), else the plain model's behaviour.
struct SessionOptions {
  int loops = 0;                // recurrent passes per token, 1..16; 0 = the config's
  std::optional<KvMode> kv;     // default: the turbo file's last_loop, else the config's mode
  // Prompt rows per batched forward; 0 = the backend's (64 on the CPU, where a chunk's
  // activations stay in cache; 512 on the GPU, where a pass streams every weight once).
  int chunk = 0;
  int64_t rewind_margin = 256;  // rows a sliding layer keeps beyond its window
  // last_loop: a prompt chunk whose logits nobody reads runs min(loops, prompt_loops)
  // passes (docs/model.md, "Prompt loops"); 0 = off.
  std::optional<int> prompt_loops;
  std::optional<GateParams> gate;
  std::optional<O1Params> o1;
  std::optional<ExactParams> exact;
  std::string spill_dir;  // --spill: where exact rows wait between the seal and the prompt's end
};

// Where the forward pass runs. Auto: the GPU when the binary has a GPU backend and a
// device is present, else the CPU.
enum class Device { Auto, Cpu, Cuda };
const char* device_name(Device d);
Device parse_device(const std::string& s);  // "auto" | "cpu" | "cuda"; throws Error naming --device

struct BackendOptions {
  Device device = Device::Auto;
  int threads = 0;  // host threads; 0 = all cores
};

// What the early-exit gate did (tokens that reached it, and how they went).
struct GateStats {
  int64_t gated = 0;     // decode tokens that came to the gate
  int64_t one_pass = 0;  // of them, left after one pass
  int64_t readouts = 0;  // conf: read-outs after pass 1 (the tracker skips some)
  int64_t probes = 0;    // conf: read-outs made while the tracker was skipping
  double one_pass_share() const { return gated ? double(one_pass) / double(gated) : 0.0; }
};

// Where the KV memory is: exact rows (windows, unsealed full slots, kept query
// rows) and the far fields' constant state.
struct KvBytes {
  uint64_t exact = 0, far = 0;
  uint64_t total() const { return exact + far; }
};

// What `dory calibrate` reads off a run (Session::probe): per row, the state after
// the first recurrent pass, the top probability of a read-out after that pass, and how
// that read-out differs from the one after all passes.
struct ProbeRows {
  int64_t hidden = 0;
  std::vector<float> state1;           // [rows x hidden]
  std::vector<float> p1;               // top probability after pass 1 [rows]
  // What one pass costs at each row: KL(all passes || pass 1) of the next-token
  // distributions, and the next token's NLL after pass 1 minus after all passes (the
  // text's own next id; 0 for the last row, whose next token is not in the span).
  std::vector<float> kl, dnll;         // [rows]
};

// The exact-row features of one far-field slot (Session::exact_features): rows
// [lo, hi), each 2 x n_kv_head rank shares (per KV head: key residual, value norm).
struct SlotFeatures {
  int layer = 0, loop = 0;
  int64_t lo = 0, hi = 0;
  std::vector<double> f;  // [(hi - lo) x 2 n_kv_head]
};

}  // namespace dory
