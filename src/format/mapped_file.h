#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace dory {

// A read-only memory map of a whole file. Weights are used in place from it,
// so a 4B bf16 checkpoint costs page cache, not 16 GB of converted floats.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws Error
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

std::string read_text_file(const std::string& path);  // throws Error
void write_text_file(const std::string& path, const std::string& text);  // throws Error

}  // namespace dory
