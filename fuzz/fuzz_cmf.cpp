// Fuzzes the CMF reader (envelope, sections, directory records, name pool, header JSON,
// skills) on bytes in memory, then what reads a parsed file: verification of every hash and
// the dtype decoders on each tensor that is small enough, and the group-row reader the loader
// repacks with.
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
    // The rows the loader repacks into Q4_0 / Q8_0 blocks (a 2-D tensor's first and last).
    if (t.shape.size() == 2 && t.shape[0] > 0 && t.shape[1] > 0 && t.shape[1] <= (1 << 16)) {
      std::vector<int8_t> q(static_cast<size_t>(t.shape[1]));
      std::vector<float> sc(static_cast<size_t>(t.shape[1] / 32 + 1));
      (void)dory::cmf::group_row(t, 0, q.data(), sc.data());
      (void)dory::cmf::group_row(t, t.shape[0] - 1, q.data(), sc.data());
    }
  }
  return 0;
}
