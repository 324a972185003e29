#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace dory {

// A read-only memory map of a whole file, at an address aligned to 2 MiB.
// Weights are used in place from it, so a 4B bf16 checkpoint costs page
// cache, not 16 GB of converted floats; or, after read_into_memory(), from
// anonymous memory at the same addresses.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws Error
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Reads the file into anonymous memory (transparent huge pages asked for)
  // and moves that memory over the mapping: the same bytes at the same
  // addresses, so pointers into data() stay valid. Decode streams every
  // weight once a token; from 2 MiB pages it reads them faster than through
  // the file's page-cache mapping (see Model::load). Throws Error, with the
  // mapping as it was, when the memory or the read fails (e.g. the file
  // changed size since it was mapped).
  void read_into_memory();
  bool in_memory() const { return in_memory_; }
  // Hands the whole pages inside [p, p + n) back to the kernel (madvise MADV_DONTNEED): bytes
  // that were read once (weights repacked or decoded at load) stop counting in the RSS; they
  // come back from the file if read again. Nothing for a file read into memory, or a range
  // outside the mapping.
  void release(const void* p, uint64_t n) const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  bool in_memory_ = false;
};

std::string read_text_file(const std::string& path);  // throws Error
void write_text_file(const std::string& path, const std::string& text);  // throws Error
// Calls write(tmp) with tmp = path + ".tmp", then renames tmp to path: a file that fails
// half-way leaves path as it was (tmp removed, the error thrown on).
void write_replacing(const std::string& path, const std::function<void(const std::string& tmp)>& write);

}  // namespace dory
