// GGUF reader/writer: round trips of every metadata and tensor type, and
// hostile files (truncated anywhere, bad counts, offsets, types): always a
// dory::Error naming the file, never a crash.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>

#include "dory/error.h"
#include "format/gguf.h"
#include "scratch_dir.h"
#include "tensor/quant.h"

using namespace dory;
using gguf::Value;
using gguf::VType;

namespace {

std::string tmp_path(const std::string& name) { return test_scratch::file(name).string(); }

std::vector<uint8_t> slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

struct Built {
  std::vector<uint8_t> bytes;
  std::vector<std::vector<uint8_t>> data;  // each tensor's bytes
};

const DType kTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0,
                        DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};

Built build(uint32_t alignment = 32) {
  gguf::Writer w;
  if (alignment != 32) w.set_alignment(alignment);
  w.set("general.architecture", Value::str("test"));
  w.set("u8", Value::u8(250));
  w.set("i8", Value::i8(-100));
  w.set("u16", Value::u16(65000));
  w.set("i16", Value::i16(-32000));
  w.set("u32", Value::u32(4000000000u));
  w.set("i32", Value::i32(-2000000000));
  w.set("u64", Value::u64(18000000000000000000ull));
  w.set("i64", Value::i64(-9000000000000000000ll));
  w.set("f32", Value::f32(0.02f));
  w.set("f64", Value::f64(3.141592653589793));
  w.set("bool", Value::boolean(true));
  w.set("str", Value::str(std::string("h\0llo", 5)));
  w.set("strs", Value::strings({"a", "", "ccc"}));
  w.set("ints", Value::i32s({1, -2, 3}));
  w.set("empty", Value::array(VType::F32, {}));
  w.set("nested", Value::array(VType::ARRAY, {Value::i32s({1, 2}), Value::i32s({}),
                                              Value::i32s({3})}));
  Built b;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0, 1);
  for (DType t : kTypes) {
    const int64_t cols = 256, rows = 3;
    w.add_tensor(std::string("t.") + dtype_name(t), t, {rows, cols});
    std::vector<float> x(cols);
    std::vector<uint8_t> d(rows * row_bytes(t, cols));
    for (int64_t r = 0; r < rows; ++r) {
      for (float& v : x) v = nd(rng);
      quantize_row(t, x.data(), d.data() + r * row_bytes(t, cols), cols);
    }
    b.data.push_back(std::move(d));
  }
  w.add_tensor("vec", DType::F32, {5});
  b.data.push_back(std::vector<uint8_t>(20, 0x3f));
  const std::string p = tmp_path("rt.gguf");
  w.begin(p);
  for (size_t i = 0; i < b.data.size(); ++i) {
    if (i % 2) {
      w.write_tensor(b.data[i].data(), b.data[i].size());
    } else {  // in pieces
      const size_t h = b.data[i].size() / 3;
      w.write_tensor_data(b.data[i].data(), h);
      w.write_tensor_data(b.data[i].data() + h, b.data[i].size() - h);
    }
  }
  w.finish();
  b.bytes = slurp(p);
  return b;
}

void expect_error(const std::vector<uint8_t>& bytes, const std::string& needle = "") {
  try {
    gguf::File f(bytes.data(), bytes.size(), "hostile.gguf");
    ADD_FAILURE() << "parsed without error; expected: " << needle;
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("hostile.gguf: ", 0), 0u) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    if (!needle.empty()) {
      EXPECT_NE(m.find(needle), std::string::npos) << m;
    }
  }
}

void put_u64(std::vector<uint8_t>& b, size_t at, uint64_t v) { std::memcpy(&b[at], &v, 8); }
void put_u32(std::vector<uint8_t>& b, size_t at, uint32_t v) { std::memcpy(&b[at], &v, 4); }

// A file with one tensor and one key, laid out by hand.
std::vector<uint8_t> one_tensor(uint32_t type = 0, uint64_t ne0 = 8, uint64_t offset = 0,
                                uint64_t data_bytes = 32, uint32_t ndims = 1) {
  std::vector<uint8_t> b;
  auto u32 = [&](uint32_t v) { for (int i = 0; i < 4; ++i) b.push_back(uint8_t(v >> (8 * i))); };
  auto u64 = [&](uint64_t v) { for (int i = 0; i < 8; ++i) b.push_back(uint8_t(v >> (8 * i))); };
  auto str = [&](const std::string& s) { u64(s.size()); b.insert(b.end(), s.begin(), s.end()); };
  b.insert(b.end(), {'G', 'G', 'U', 'F'});
  u32(3);
  u64(1);
  u64(1);
  str("k");
  u32(4);
  u32(7);
  str("w");
  u32(ndims);
  for (uint32_t d = 0; d < ndims; ++d) u64(d == 0 ? ne0 : 1);
  u32(type);
  u64(offset);
  while (b.size() % 32) b.push_back(0);
  b.insert(b.end(), data_bytes, 0);
  return b;
}

}  // namespace

TEST(Gguf, RoundTripEveryType) {
  for (uint32_t align : {32u, 64u, 4096u}) {
    Built b = build(align);
    gguf::File f(b.bytes.data(), b.bytes.size(), "rt.gguf");
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.alignment(), align);
    EXPECT_EQ(f.data_offset() % align, 0u);
    EXPECT_EQ(f.find("u8")->u, 250u);
    EXPECT_EQ(f.find("i8")->i, -100);
    EXPECT_EQ(f.find("u16")->u, 65000u);
    EXPECT_EQ(f.find("i16")->i, -32000);
    EXPECT_EQ(f.find("u32")->u, 4000000000u);
    EXPECT_EQ(f.find("i32")->i, -2000000000);
    EXPECT_EQ(f.find("u64")->u, 18000000000000000000ull);
    EXPECT_EQ(f.find("i64")->i, -9000000000000000000ll);
    EXPECT_EQ(static_cast<float>(f.find("f32")->f), 0.02f);
    EXPECT_EQ(f.find("f64")->f, 3.141592653589793);
    EXPECT_EQ(f.find("bool")->u, 1u);
    EXPECT_EQ(f.find("str")->s, std::string("h\0llo", 5));
    EXPECT_EQ(f.find("strs")->arr.size(), 3u);
    EXPECT_EQ(f.find("strs")->arr[2].s, "ccc");
    EXPECT_EQ(f.find("ints")->arr[1].i, -2);
    EXPECT_EQ(f.find("empty")->arr.size(), 0u);
    EXPECT_EQ(f.find("empty")->elem, VType::F32);
    const Value* n = f.find("nested");
    ASSERT_EQ(n->arr.size(), 3u);
    EXPECT_EQ(n->arr[0].arr[1].i, 2);
    EXPECT_EQ(n->arr[2].arr[0].i, 3);
    EXPECT_EQ(f.metadata()[0].first, align == 32 ? "general.architecture" : "general.alignment");
    ASSERT_EQ(f.tensors().size(), b.data.size());
    for (size_t i = 0; i < b.data.size(); ++i) {
      const auto& t = f.tensors()[i];
      EXPECT_EQ(t.offset % align, 0u);
      ASSERT_EQ(t.nbytes, b.data[i].size());
      EXPECT_EQ(std::memcmp(t.view.data, b.data[i].data(), t.nbytes), 0) << t.name;
    }
    EXPECT_EQ(f.tensor("t.Q6_K")->view.dtype, DType::Q6_K);
    EXPECT_EQ(f.tensor("t.Q6_K")->ggml_type, 14u);
    EXPECT_EQ(f.tensor("t.BF16")->ggml_type, 30u);
    EXPECT_EQ(f.tensor("t.Q4_0")->view.shape, (std::vector<int64_t>{3, 256}));
    EXPECT_EQ(f.tensor("t.Q4_0")->ne, (std::vector<int64_t>{256, 3}));
    EXPECT_NE(f.find("nested")->show().find("[array x 3]"), std::string::npos);
  }
}

TEST(Gguf, MappedFileAndErrorsNameIt) {
  Built b = build();
  gguf::File f(tmp_path("rt.gguf"));
  EXPECT_EQ(f.tensors().size(), b.data.size());
  try {
    gguf::File g(tmp_path("does-not-exist.gguf"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does-not-exist.gguf"), std::string::npos);
  }
}

TEST(Gguf, TruncatedAnywhere) {
  Built b = build();
  for (size_t cut = 0; cut < b.bytes.size(); cut += (cut < 2048 ? 1 : 97)) {
    std::vector<uint8_t> t(b.bytes.begin(), b.bytes.begin() + cut);
    expect_error(t);
  }
}

TEST(Gguf, RandomCorruptionNeverCrashes) {
  Built b = build();
  std::mt19937 rng(1);
  const size_t header = 2048;  // metadata and infos live here
  for (int it = 0; it < 3000; ++it) {
    std::vector<uint8_t> t = b.bytes;
    const int flips = 1 + it % 4;
    for (int k = 0; k < flips; ++k) t[rng() % std::min(header, t.size())] ^= uint8_t(1u << (rng() % 8));
    try {
      gguf::File f(t.data(), t.size(), "hostile.gguf");
      for (const auto& ti : f.tensors()) {  // whatever parsed must lie inside
        const auto* p = static_cast<const uint8_t*>(ti.view.data);
        ASSERT_GE(p, t.data());
        ASSERT_LE(p + ti.nbytes, t.data() + t.size());
      }
    } catch (const Error&) {
    }
  }
}

TEST(Gguf, HostileHeaders) {
  std::vector<uint8_t> ok = one_tensor();
  { gguf::File f(ok.data(), ok.size(), "ok.gguf"); EXPECT_EQ(f.tensors().size(), 1u); }
  auto bad = ok;
  bad[0] = 'X';
  expect_error(bad, "bad magic");
  bad = ok;
  put_u32(bad, 4, 2);
  expect_error(bad, "version 2");
  bad = ok;
  put_u64(bad, 8, 1ull << 60);
  expect_error(bad, "tensor count");
  bad = ok;
  put_u64(bad, 16, 1ull << 60);
  expect_error(bad, "metadata count");
  bad = ok;
  put_u64(bad, 24, 1ull << 40);  // key length
  expect_error(bad, "length");
  bad = ok;
  put_u32(bad, 33, 99);  // value type
  expect_error(bad, "unknown metadata value type 99");
  expect_error(one_tensor(6), "unsupported ggml type 6");
  expect_error(one_tensor(0, 8, 64), "beyond the data section");
  expect_error(one_tensor(0, 8, 8), "not a multiple of the alignment");
  expect_error(one_tensor(8, 8), "not a whole number of Q8_0 blocks");
  expect_error(one_tensor(0, 8, 0, 31), "beyond the data section");
  expect_error(one_tensor(0, 8, 0, 32, 5), "dimensions");
  expect_error(one_tensor(0, 8, 0, 32, 0), "dimensions");
  expect_error(one_tensor(0, 1ull << 62), "overflow");
}

TEST(Gguf, HostileArraysAndDuplicates) {
  auto mk = [](auto fill) {
    std::vector<uint8_t> b;
    auto u32 = [&](uint32_t v) { for (int i = 0; i < 4; ++i) b.push_back(uint8_t(v >> (8 * i))); };
    auto u64 = [&](uint64_t v) { for (int i = 0; i < 8; ++i) b.push_back(uint8_t(v >> (8 * i))); };
    auto str = [&](const std::string& s) { u64(s.size()); b.insert(b.end(), s.begin(), s.end()); };
    b.insert(b.end(), {'G', 'G', 'U', 'F'});
    u32(3);
    fill(u32, u64, str);
    b.insert(b.end(), 64, 0);
    return b;
  };
  expect_error(mk([](auto u32, auto u64, auto str) {
                 u64(0); u64(1); str("a"); u32(9); u32(4); u64(1ull << 40);
               }), "claims");
  expect_error(mk([](auto u32, auto u64, auto str) {
                 u64(0); u64(1); str("a"); u32(9); u32(42); u64(1);
               }), "unknown array element type");
  expect_error(mk([](auto u32, auto u64, auto str) {  // arrays nested too deep
                 u64(0); u64(1); str("a"); u32(9);
                 for (int i = 0; i < 6; ++i) { u32(9); u64(1); }
                 u32(4); u64(1);
               }), "nested");
  expect_error(mk([](auto u32, auto u64, auto str) {
                 u64(0); u64(2); str("a"); u32(4); u32(1); str("a"); u32(4); u32(2);
               }), "appears twice");
  expect_error(mk([](auto u32, auto u64, auto str) {
                 u64(0); u64(1); str("general.alignment"); u32(4); u32(24);
               }), "power of two");
  expect_error(mk([](auto u32, auto u64, auto str) {
                 u64(0); u64(1); str("general.alignment"); u32(5); u32(32);
               }), "must be u32");
  expect_error(mk([](auto u32, auto u64, auto str) {
                 u64(0); u64(1); str("b"); u32(7); u32(0x02);
               }), "bool");
}

TEST(Gguf, OverlappingTensors) {
  gguf::Writer w;
  w.add_tensor("a", DType::F32, {16});
  w.add_tensor("b", DType::F32, {16});
  const std::string p = tmp_path("ov.gguf");
  w.begin(p);
  std::vector<float> z(16);
  w.write_tensor(z.data(), 64);
  w.write_tensor(z.data(), 64);
  w.finish();
  auto bytes = slurp(p);
  // b's offset (the last 8 bytes of its info) -> 32: overlaps a.
  gguf::File f(bytes.data(), bytes.size(), "x");
  const uint64_t off_pos = f.data_offset();
  (void)off_pos;
  // Find b's info: name "b" follows a's info; search for the 8-byte offset 64.
  for (size_t i = 24; i + 8 <= bytes.size(); ++i) {
    uint64_t v;
    std::memcpy(&v, &bytes[i], 8);
    if (v == 64 && i < f.data_offset()) {
      put_u64(bytes, i, 32);
      break;
    }
  }
  expect_error(bytes, "overlap");
}
