// GGUF version 3 (ggml docs/gguf.md): a little-endian header ("GGUF", version,
// tensor count, metadata count), typed key/value metadata (scalars, strings and
// arrays, arrays of arrays included), tensor infos (name, dims with ne[0] the
// row length, ggml type id, offset), padding to `general.alignment` (default
// 32), then the tensor data, each tensor at an aligned offset.
//
// The reader memory-maps the file and checks every length, count, type and
// offset against the file size before use: a bad file is a one-line dory::Error
// naming the file and the problem, never a crash. The writer streams: header and
// infos first, then each tensor's bytes in order with their padding.
#pragma once
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "format/mapped_file.h"
#include "tensor/dtype.h"

namespace dory::gguf {

enum class VType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* vtype_name(VType t);

// ggml type ids of the weight types this engine runs.
constexpr uint32_t kGgmlF32 = 0, kGgmlF16 = 1, kGgmlQ4_0 = 2, kGgmlQ8_0 = 8, kGgmlQ4_K = 12,
                   kGgmlQ5_K = 13, kGgmlQ6_K = 14, kGgmlBF16 = 30;
uint32_t ggml_type_id(DType t);
bool dtype_from_ggml(uint32_t id, DType* out);

// One metadata value. Integers keep their exact value (u for unsigned types and
// bool, i for signed), floats their double value; arrays hold elements of one
// type (elem), which may itself be ARRAY.
struct Value {
  VType type = VType::U32;
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  std::string s;
  VType elem = VType::U8;  // arrays
  std::vector<Value> arr;

  static Value u8(uint8_t v) { return uns(VType::U8, v); }
  static Value u16(uint16_t v) { return uns(VType::U16, v); }
  static Value u32(uint32_t v) { return uns(VType::U32, v); }
  static Value u64(uint64_t v) { return uns(VType::U64, v); }
  static Value i8(int8_t v) { return sig(VType::I8, v); }
  static Value i16(int16_t v) { return sig(VType::I16, v); }
  static Value i32(int32_t v) { return sig(VType::I32, v); }
  static Value i64(int64_t v) { return sig(VType::I64, v); }
  static Value f32(float v) { Value x; x.type = VType::F32; x.f = v; return x; }
  static Value f64(double v) { Value x; x.type = VType::F64; x.f = v; return x; }
  static Value boolean(bool v) { return uns(VType::BOOL, v ? 1 : 0); }
  static Value str(std::string v) { Value x; x.type = VType::STRING; x.s = std::move(v); return x; }
  static Value array(VType elem, std::vector<Value> items) {
    Value x; x.type = VType::ARRAY; x.elem = elem; x.arr = std::move(items); return x;
  }
  static Value strings(const std::vector<std::string>& v);
  static Value i32s(const std::vector<int32_t>& v);

  bool is_int() const;
  bool is_float() const { return type == VType::F32 || type == VType::F64; }
  // A short rendering for `dory info`: arrays longer than max_items are summarized.
  std::string show(size_t max_items = 8) const;

 private:
  static Value uns(VType t, uint64_t v) { Value x; x.type = t; x.u = v; x.i = static_cast<int64_t>(v); return x; }
  static Value sig(VType t, int64_t v) { Value x; x.type = t; x.i = v; x.u = static_cast<uint64_t>(v); return x; }
};

struct TensorInfo {
  std::string name;
  uint32_t ggml_type = 0;
  std::vector<int64_t> ne;  // GGUF order: ne[0] is the row length
  uint64_t offset = 0;      // from the start of the data section
  uint64_t nbytes = 0;
  TensorView view;          // row-major shape (ne reversed) into the mapping
};

class File {
 public:
  explicit File(const std::string& path);  // maps and parses; throws Error
  // Parses bytes already in memory (the caller keeps them alive); `name` is
  // what errors call the file. For tests and fuzzing.
  File(const uint8_t* data, uint64_t size, const std::string& name);

  const std::string& path() const { return name_; }
  uint64_t size() const { return size_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  // The mapping's bytes into anonymous memory (MappedFile::read_into_memory);
  // nothing to do for a file parsed from the caller's bytes.
  void read_into_memory() {
    if (map_) map_->read_into_memory();
  }
  bool in_memory() const { return !map_ || map_->in_memory(); }

  // Metadata in file order.
  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* find(const std::string& key) const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* tensor(const std::string& name) const;

 private:
  void parse(const uint8_t* data, uint64_t size);
  std::unique_ptr<MappedFile> map_;
  std::string name_;
  uint64_t size_ = 0;
  uint32_t version_ = 0, alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> kv_;
  std::map<std::string, size_t> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

// Streaming writer. Set metadata and declare every tensor, then begin(path)
// writes the header, metadata and tensor infos; write_tensor() then takes each
// declared tensor's bytes in declaration order; finish() closes the file.
class Writer {
 public:
  Writer() = default;
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Adds or replaces a key (first insertion fixes its position).
  void set(const std::string& key, Value v);
  // shape is row-major (last dim = row length); stored reversed as ne.
  void add_tensor(const std::string& name, DType t, const std::vector<int64_t>& shape);
  void set_alignment(uint32_t a);  // also sets general.alignment when not 32

  void begin(const std::string& path);
  void write_tensor(const void* data, uint64_t nbytes);  // one whole tensor
  // Appends bytes of the current tensor (in pieces of any size); moves on to the
  // next tensor once the current one is complete.
  void write_tensor_data(const void* data, uint64_t n);
  void finish();
  size_t n_tensors() const { return infos_.size(); }
  uint64_t tensor_nbytes(size_t i) const { return infos_[i].nbytes; }

 private:
  void put(const void* p, size_t n);
  void put_str(const std::string& s);
  void put_value(const Value& v, bool with_type);
  void pad_to(uint64_t a);
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<TensorInfo> infos_;
  uint32_t alignment_ = 32;
  uint64_t data_size_ = 0;
  std::FILE* f_ = nullptr;
  std::string path_;
  uint64_t pos_ = 0;
  size_t next_ = 0;
  uint64_t cur_ = 0;  // bytes of infos_[next_] written so far
};

}  // namespace dory::gguf
