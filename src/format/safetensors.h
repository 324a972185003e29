#pragma once
#include <map>
#include <memory>
#include <string>

#include "format/mapped_file.h"
#include "tensor/dtype.h"

namespace dory {

// One .safetensors file: an 8-byte little-endian header length, a JSON header
// naming each tensor's dtype, shape and byte range, then the raw data. The
// tensors are views into the mapping; every offset is checked before use.
class SafeTensorsFile {
 public:
  explicit SafeTensorsFile(const std::string& path);  // throws Error
  // Parses bytes already in memory (the caller keeps them alive); `name` is
  // what errors call the file. For tests and fuzzing: the same checks as above.
  SafeTensorsFile(const uint8_t* data, uint64_t size, const std::string& name);
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::string& path() const { return name_; }
  uint64_t size() const { return size_; }
  // As gguf::File's.
  void read_into_memory() {
    if (map_) map_->read_into_memory();
  }
  bool in_memory() const { return !map_ || map_->in_memory(); }

 private:
  void parse(const uint8_t* data, uint64_t size);
  std::unique_ptr<MappedFile> map_;  // null when parsing a caller's buffer
  std::string name_;
  uint64_t size_ = 0;
  std::map<std::string, TensorView> tensors_;
};

}  // namespace dory
