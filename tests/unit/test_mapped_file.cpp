// MappedFile: the mapping's alignment and read_into_memory (the same bytes at
// the same address, or an error with the mapping as it was).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "dory/error.h"
#include "dory/session.h"
#include "format/mapped_file.h"
#include "scratch_dir.h"
#include "tiny_model.h"

using namespace dory;

namespace {

std::string write_bytes(const std::string& name, const std::vector<uint8_t>& b) {
  const std::string path = (test_scratch::dir() / name).string();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  return path;
}

std::vector<uint8_t> pattern(size_t n) {
  std::vector<uint8_t> b(n);
  uint32_t x = 12345;
  for (auto& c : b) c = static_cast<uint8_t>((x = x * 1103515245u + 12345u) >> 24);
  return b;
}

}  // namespace

TEST(MappedFile, ReadIntoMemoryKeepsBytesAndAddress) {
  // Sizes around page and 2 MiB boundaries, and one of a single byte.
  for (size_t n : {size_t{1}, size_t{4095}, size_t{4097}, (size_t{2} << 20) + 17, size_t{5} << 20}) {
    const auto want = pattern(n);
    MappedFile m(write_bytes("f.bin", want));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(m.data()) % (uintptr_t{2} << 20), 0u) << n;
    const uint8_t* before = m.data();
    EXPECT_FALSE(m.in_memory());
    m.read_into_memory();
    EXPECT_TRUE(m.in_memory());
    ASSERT_EQ(m.data(), before) << n;
    ASSERT_EQ(m.size(), n);
    EXPECT_EQ(std::vector<uint8_t>(m.data(), m.data() + n), want) << n;
    m.read_into_memory();  // a second call: nothing to do
    EXPECT_EQ(m.data()[n - 1], want[n - 1]);
  }
}

TEST(MappedFile, FileThatChangedSizeIsAnErrorAndTheMappingStays) {
  const auto want = pattern(3 << 20);
  const std::string path = write_bytes("g.bin", want);
  MappedFile m(path);
  const auto grown = pattern((3 << 20) + 100);  // a bigger file: the old mapping stays readable
  write_bytes("g.bin", grown);
  try {
    m.read_into_memory();
    FAIL() << "no error for a file that changed size";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("changed size"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(m.in_memory());
  EXPECT_EQ(m.data()[0], grown[0]);  // still the file's mapping, with its current bytes
}

TEST(Model, WeightsInMemoryGiveTheMappedLogitsBitForBit) {
  const char* p = std::getenv("DORY_TINY_MODEL");
  ASSERT_NE(p, nullptr) << "DORY_TINY_MODEL is not set (run through ctest)";
  auto mapped = Model::load(p, WeightPlacement::Mapped);
  auto memory = Model::load(p, WeightPlacement::Memory);
  EXPECT_FALSE(mapped->weights_in_memory());
  EXPECT_TRUE(memory->weights_in_memory());
  const auto seq = fixture::ids(12, 3);
  Session a(fixture::cpu(2, mapped), {}), b(fixture::cpu(2, memory), {});
  const auto la = a.forward(seq, Logits::All), lb = b.forward(seq, Logits::All);
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) ASSERT_EQ(la[i], lb[i]) << i;
}
