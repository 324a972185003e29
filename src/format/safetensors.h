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
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::string& path() const { return map_.path(); }
  uint64_t size() const { return map_.size(); }

 private:
  MappedFile map_;
  std::map<std::string, TensorView> tensors_;
};

}  // namespace dory
