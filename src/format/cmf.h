// cortiq's CMF v2 container (docs/cmf.md): the 128-byte envelope, the tensor directory, the
// JSON header, the tokenizer section, hash64 and the tensor dtypes' decoders. Read from a
// memory map; every offset and size is checked against the file before it is used, and a
// bad file is one Error naming the file, the field and what was found.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "format/mapped_file.h"

namespace dory::cmf {

// hash64 of CMF (vmfcore's): LE u64 words through fmix64, XOR-folded with their index times
// the golden ratio, the length, and a last fmix64.
uint64_t hash64(const void* data, size_t len);

// The dtype ids of the directory (docs/cmf.md, section 2).
enum DTypeId : int {
  kF32 = 0,
  kF16 = 1,
  kBF16 = 2,
  kQ8Row = 3,
  kQ4Block = 4,
  kMix8_4 = 5,
  kU8 = 6,
  kQ4Col = 7,
  kVbit = 8,
  kQ8_2f = 9,
  kVbitRo = 10,
  kQ4Tiled = 11,
  kQ1 = 12,
  kQ1s = 13,
  kQ1t = 14,
  kQ4tp = 15,
  kQ2tp = 16
};
const char* dtype_name(int id);  // "q8_2f"; "dtype 5 (reserved)" for the ones with no layout
// The payload bytes a fixed-size dtype takes for this shape; -1 when the size is variable
// (vbit, vbit_ro, q1s, q1t) and is read from the payload; throws Error for a shape the dtype
// does not take (2-D types given another rank, cols not a multiple of 32).
int64_t expected_bytes(int dtype, const std::vector<int64_t>& shape);

// Feature bits of the envelope.
enum Feature : uint32_t {
  kTensorDir = 1u << 0,
  kBinaryMasks = 1u << 1,
  kQuant2F = 1u << 2,
  kDeltaMasks = 1u << 3,
  kHotPacks = 1u << 4,
  kLoopMasks = 1u << 5,
  kSkillFile = 1u << 6
};

struct Tensor {
  std::string name;
  int dtype = 0;
  std::vector<int64_t> shape;
  uint64_t off = 0, nbytes = 0, hash = 0;  // off: relative to the data section
  const uint8_t* data = nullptr;           // into the mapping
  int64_t numel() const;
};

struct Section {
  const char* name;
  uint64_t off = 0, len = 0;
};

// A skill's router descriptor (CMF.md section 3, `selection`): phi = the mean over a
// prompt's tokens of the hidden state after layer phi_layer; r = phi - mean;
// E = (|r|^2 - sum_k (b_k . r)^2) / |phi|^2; the skill with the smallest E wins.
struct Selection {
  bool unit = false;       // metric "mse_unit": phi is L2-normalized first
  int64_t phi_layer = -1;
  int64_t rank = 0;
  std::vector<float> mean;   // [hidden]
  std::vector<float> basis;  // [rank x hidden], orthonormal rows
};

struct Skill {
  std::string id, name;
  std::vector<int64_t> layers;
  bool routable = false;  // has a `selection` router descriptor
  Selection selection;    // when routable
  std::string selection_error;  // a descriptor that is not well formed: why (routing refuses it)
  std::string base_dir_hash;
};

// Row r of a 2-D tensor whose dtype stores each 32-column group as small integers times one
// scale: w[r, 32g + k] = q[32g + k] * scale[g] exactly (q8_row, q4_block and q4_tiled with
// cols % 32 == 0, q4tp, q2tp; q2tp's codes as the odd integers -3..3 with half its rung).
// Writes cols integers and cols / 32 scales; returns the integers' width (4: all in -8..7,
// 8: int8), or 0 for any other dtype or shape (nothing written). The kernels run such rows as
// ggml's Q4_0 / Q8_0 blocks (model/weights.cpp).
int group_row(const Tensor& t, int64_t r, int8_t* q, float* scale);

// E of a prompt's phi under a skill's router (see Selection).
double skill_error(const Selection& s, const std::vector<float>& phi);

class File {
 public:
  // Maps and checks a .cmf file (envelope, every directory record, the header JSON).
  static std::unique_ptr<File> open(const std::string& path);
  // The same over bytes in memory (tests, fuzzing); `name` stands for the path in errors.
  static std::unique_ptr<File> parse(std::vector<uint8_t> bytes, const std::string& name);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t features() const { return features_; }
  // header, directory, data, masks, vocab, index (len 0: absent).
  const std::vector<Section>& sections() const { return sections_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }
  const Tensor* find(const std::string& name) const;
  std::string_view header_json() const;
  // The tokenizer section: a Hugging Face tokenizer.json (empty when absent).
  std::string_view vocab() const;
  const std::string& quant_type() const { return quant_type_; }
  const std::string& arch_json() const {
    return arch_json_;
  }  // the header's "arch" object, as JSON
  const std::string& chat_template() const { return chat_template_; }
  const std::vector<int64_t>& eos_ids() const { return eos_ids_; }
  const std::vector<Skill>& skills() const { return skills_; }
  uint64_t dir_hash() const { return dir_hash_; }
  // A tensor's bytes handed back to the kernel once they were repacked or decoded
  // (MappedFile::release); nothing if the tensor is not in this file.
  void release(const Tensor& t) const;
  uint64_t size() const { return size_; }

  // Checks every recorded hash (header, directory, the header's section hashes, every tensor).
  // progress(done_bytes, total_bytes) after each item. Returns one line per mismatch (empty:
  // all match); hashes recorded as 0 ("not recorded") are counted, not checked.
  struct VerifyResult {
    std::vector<std::string> problems;
    int checked = 0, unrecorded = 0;
  };
  VerifyResult verify(const std::function<void(uint64_t, uint64_t)>& progress = {}) const;

 private:
  void parse_all();
  std::string path_;
  std::unique_ptr<MappedFile> map_;
  std::vector<uint8_t> bytes_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0, features_ = 0;
  uint64_t header_hash_ = 0, dir_hash_ = 0;
  std::vector<Section> sections_;
  std::vector<Tensor> tensors_;
  std::string quant_type_, arch_json_, chat_template_;
  std::vector<int64_t> eos_ids_;
  std::vector<Skill> skills_;
  std::vector<std::pair<std::string, uint64_t>> section_hashes_;  // masks, vocab, index
};

// A path naming a CMF file (it ends in .cmf).
bool is_cmf_name(const std::string& path);

// The arch keys cortiq names otherwise than config.json does: (cortiq's, config.json's), e.g.
// ("num_layers", "num_hidden_layers"). A Dory CMF's arch carries the rest under config.json's
// names.
const std::vector<std::pair<std::string, std::string>>& arch_key_names();

// The files of a sharded model, in order: for "stem-00002-of-00003.cmf" (any shard's name) the
// three names stem-00001-of-00003.cmf ... (each must exist: an Error names the first that does
// not); for any other name, that name alone.
std::vector<std::string> shard_paths(const std::string& path);

// Decodes a whole tensor to float (numel() values): f32, f16, bf16, q8_row, q4_block,
// q4_tiled, q8_2f, q4tp, q2tp exactly as docs/cmf.md says (the stored f16 scales, q4tp's
// sequential f32 ladder). The variable-width types (vbit, vbit_ro, q1, q1s, q1t), u8 and the
// reserved ids throw Error saying they are not supported and what to convert with.
void dequantize(const Tensor& t, float* out);

// q8_2f of a float matrix [rows x cols] as cortiq's encoder makes it: col[c] = the column's
// RMS and row_scale[r] = max|w / col| / 127, both rounded to f16 before the codes are taken
// (so decoding with the stored values is exact), q = round(w / col / row_scale) within +-127.
std::vector<uint8_t> encode_q8_2f(const float* w, int64_t rows, int64_t cols);

// Writes a CMF v2 file as cortiq's writers lay it out: envelope, header at 128, directory,
// data at a 4096 boundary (tensors of 16 KiB or more on 4096, others on 64), the vocab
// section; every hash recorded. Tensors are added with their payload's size and written in
// the order added.
class Writer {
 public:
  explicit Writer(std::string header_json) : header_(std::move(header_json)) {}
  void add(const std::string& name, int dtype, const std::vector<int64_t>& shape,
           std::vector<uint8_t> payload);
  void set_vocab(std::string tokenizer_json) { vocab_ = std::move(tokenizer_json); }
  // Writes to path (the caller renames a temporary into place). Throws Error.
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    int dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> payload;
  };
  std::string header_, vocab_;
  std::vector<Entry> entries_;
};

}  // namespace dory::cmf
