// Fuzzes the CMF reader (envelope, sections, directory records, name pool, header JSON,
// skills) on bytes in memory, then what reads a parsed file: verification of every hash and
// the dtype decoders on each tensor that is small enough.
#include <memory>
#include <string>
#include <vector>

#include "format/cmf.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<dory::cmf::File> file;
  dory::fuzz::expect_ok_or_error(
      [&] { file = dory::cmf::File::parse(std::vector<uint8_t>(data, data + size), "fuzz.cmf"); });
  if (!file) return 0;
  (void)file->verify();
  (void)file->vocab();
  for (const auto& t : file->tensors()) {
    if (t.numel() > (1 << 16)) continue;
    std::vector<float> out(static_cast<size_t>(t.numel()));
    dory::fuzz::expect_ok_or_error([&] { dory::cmf::dequantize(t, out.data()); });
  }
  return 0;
}
