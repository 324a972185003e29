#include "format/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>

#include "dory/error.h"

namespace dory {

namespace {

constexpr uint64_t kHuge = uint64_t{2} << 20;

uint64_t page_round(uint64_t n) {
  const uint64_t pg = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return (n + pg - 1) / pg * pg;
}

// `len` bytes of address space at a 2 MiB boundary (so the 2 MiB pieces of a
// file land on huge-page boundaries), as an inaccessible reservation to map
// over; nullptr when there is no room.
void* reserve_aligned(uint64_t len) {
  void* raw = ::mmap(nullptr, len + kHuge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto r = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t a = (r + kHuge - 1) / kHuge * kHuge;
  if (a > r) ::munmap(raw, a - r);
  const uintptr_t tail = a + len, raw_end = r + len + kHuge;
  if (raw_end > tail) ::munmap(reinterpret_cast<void*>(tail), raw_end - tail);
  return reinterpret_cast<void*>(a);
}

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": not a regular file");
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > 0) {
    void* at = reserve_aligned(page_round(size_));
    void* p = at ? ::mmap(at, size_, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0) : MAP_FAILED;
    if (p == MAP_FAILED) {
      int e = at ? errno : ENOMEM;
      if (at) ::munmap(at, page_round(size_));
      ::close(fd);
      throw Error(path + ": cannot map: " + std::strerror(e));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

void MappedFile::read_into_memory() {
  if (in_memory_ || size_ == 0) return;
  const uint64_t len = page_round(size_);
  void* at = reserve_aligned(len);
  if (!at || ::mprotect(at, len, PROT_READ | PROT_WRITE) != 0) {
    const int e = errno;
    if (at) ::munmap(at, len);
    throw Error(path_ + ": cannot allocate " + std::to_string(len >> 20) + " MiB to read the weights into: " +
                std::strerror(at ? e : ENOMEM));
  }
  ::madvise(at, len, MADV_HUGEPAGE);  // a hint: without THP the pages are 4 KiB
  auto fail = [&](const std::string& why) {
    ::munmap(at, len);
    throw Error(path_ + ": cannot read into memory: " + why);
  };
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != size_) {
    ::close(fd);
    fail("the file changed size since it was opened");
  }
  auto* dst = static_cast<uint8_t*>(at);
  for (uint64_t off = 0; off < size_;) {
    const uint64_t want = std::min<uint64_t>(size_ - off, uint64_t{64} << 20);
    const ssize_t got = ::pread(fd, dst + off, want, static_cast<off_t>(off));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const std::string why = got < 0 ? std::strerror(errno) : "the file ended early";
      ::close(fd);
      fail(why);
    }
    off += static_cast<uint64_t>(got);
  }
  ::close(fd);
  ::mprotect(at, len, PROT_READ);
  // Moves the filled pages over the file mapping, which is discarded (huge
  // pages move whole: both addresses are 2 MiB aligned).
  void* moved = ::mremap(at, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, const_cast<uint8_t*>(data_));
  if (moved == MAP_FAILED) fail(std::string("mremap: ") + std::strerror(errno));
  in_memory_ = true;
}

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw Error(path + ": read error");
  return ss.str();
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw Error(path + ": cannot open for writing: " + std::strerror(errno));
  f << text;
  f.flush();
  if (!f) throw Error(path + ": write error");
}

void write_replacing(const std::string& path, const std::function<void(const std::string& tmp)>& write) {
  const std::string tmp = path + ".tmp";
  try {
    write(tmp);
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw Error(path + ": cannot rename " + tmp + " to it: " + std::strerror(errno));
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

void MappedFile::release(const void* p, uint64_t n) const {
  const auto* b = static_cast<const uint8_t*>(p);
  if (in_memory_ || !data_ || b < data_ || b + n > data_ + size_) return;
  const uintptr_t page = 4096;
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(b) + page - 1) & ~(page - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(b) + n) & ~(page - 1);
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

}  // namespace dory
