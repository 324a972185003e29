// The CMF v2 reader (format/cmf.h) against docs/cmf.md: hash64's test vectors, the worked
// examples of the dtypes, a file built here field by field, and every field of the envelope
// and of a directory record lying in turn.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dory/error.h"
#include "format/cmf.h"
#include "tensor/dtype.h"

using namespace dory;

namespace {

void put64(std::vector<uint8_t>& b, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
}
void put32(std::vector<uint8_t>& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
}
void put16(std::vector<uint8_t>& b, size_t at, uint16_t v) {
  b[at] = static_cast<uint8_t>(v);
  b[at + 1] = static_cast<uint8_t>(v >> 8);
}

struct Spec {
  std::string name;
  int dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// A CMF v2 file as cortiq's writers lay it out: envelope, header at 128, directory, data at
// a 4096 boundary (tensors on 64), then the vocab section. Hashes recorded.
std::vector<uint8_t> build(const std::vector<Spec>& ts,
                           const std::string& vocab = "{\"model\":{}}") {
  std::string header =
      R"({"format":"cmf","version":2,"quant_type":"Q8_2F","arch":{"arch_name":"dory"},)"
      R"("tokenizer_config":{"chat_template":"{{x}}","eos_token_ids":[2]},)"
      R"("skills":[{"id":"sql","name":"SQL","layers":[3,4]}]})";
  std::vector<uint8_t> dir(16 + 56 * ts.size());
  std::string pool;
  std::vector<uint8_t> data;
  for (size_t i = 0; i < ts.size(); ++i) {
    const size_t r = 16 + 56 * i;
    put32(dir, r, static_cast<uint32_t>(pool.size()));
    put16(dir, r + 4, static_cast<uint16_t>(ts[i].name.size()));
    pool += ts[i].name;
    dir[r + 6] = static_cast<uint8_t>(ts[i].dtype);
    dir[r + 7] = static_cast<uint8_t>(ts[i].shape.size());
    for (size_t k = 0; k < ts[i].shape.size(); ++k)
      put32(dir, r + 8 + 4 * k, static_cast<uint32_t>(ts[i].shape[k]));
    while (data.size() % 64) data.push_back(0);
    put64(dir, r + 32, data.size());
    put64(dir, r + 40, ts[i].bytes.size());
    put64(dir, r + 48, cmf::hash64(ts[i].bytes.data(), ts[i].bytes.size()));
    data.insert(data.end(), ts[i].bytes.begin(), ts[i].bytes.end());
  }
  put64(dir, 0, ts.size());
  put64(dir, 8, dir.size());
  dir.insert(dir.end(), pool.begin(), pool.end());
  const uint64_t hoff = 128, doff = hoff + header.size(),
                 data_off = (doff + dir.size() + 4095) / 4096 * 4096;
  const uint64_t voff = data_off + data.size();
  std::vector<uint8_t> f(voff + vocab.size(), 0);
  std::memcpy(f.data(), "CMF\x01", 4);
  put32(f, 4, 2);
  put32(f, 12, 1);
  put64(f, 0x10, hoff), put64(f, 0x18, header.size());
  put64(f, 0x20, doff), put64(f, 0x28, dir.size());
  put64(f, 0x30, data_off), put64(f, 0x38, data.size());
  put64(f, 0x50, voff), put64(f, 0x58, vocab.size());
  put64(f, 0x70, cmf::hash64(header.data(), header.size()));
  put64(f, 0x78, cmf::hash64(dir.data(), dir.size()));
  std::memcpy(f.data() + hoff, header.data(), header.size());
  std::memcpy(f.data() + doff, dir.data(), dir.size());
  std::memcpy(f.data() + data_off, data.data(), data.size());
  std::memcpy(f.data() + voff, vocab.data(), vocab.size());
  return f;
}

std::vector<uint8_t> f16s(std::initializer_list<float> v) {
  std::vector<uint8_t> b;
  for (float x : v) {
    const uint16_t h = f32_to_f16(x);
    b.push_back(static_cast<uint8_t>(h)), b.push_back(static_cast<uint8_t>(h >> 8));
  }
  return b;
}

std::vector<float> decode(const cmf::File& f, const std::string& name) {
  const cmf::Tensor* t = f.find(name);
  EXPECT_NE(t, nullptr) << name;
  std::vector<float> out(t->numel());
  cmf::dequantize(*t, out.data());
  return out;
}

// A file with one tensor of each fixed-size dtype the engine decodes.
std::vector<Spec> sample() {
  std::vector<Spec> ts;
  ts.push_back({"a.f16", cmf::kF16, {3}, f16s({1.0f, -2.0f, 0.5f})});
  // q8_2f [2,3], the worked example of docs/cmf.md: q[1,2] = 0xFD, row_scale[1] = 0x2C00, col[2] =
  // 0x4000.
  std::vector<uint8_t> q82 = {1,    2,    3,    4,    5,    0xFD, 0x00, 0x3C,
                              0x00, 0x2C, 0x00, 0x3C, 0x00, 0x3C, 0x00, 0x40};
  ts.push_back({"b.q8_2f", cmf::kQ8_2f, {2, 3}, q82});
  // q4tp rows=1 cols=64, the worked example: params 00 C4 00 34, codes 24 02, byte 0 = 0xB3.
  std::vector<uint8_t> q4tp(38, 0x88);
  q4tp[0] = 0xB3;
  q4tp[32] = 0x00, q4tp[33] = 0xC4, q4tp[34] = 0x00, q4tp[35] = 0x34, q4tp[36] = 0x24,
  q4tp[37] = 0x02;
  ts.push_back({"c.q4tp", cmf::kQ4tp, {1, 64}, q4tp});
  // q4_block n = 40: element 33 is the high nibble of byte 16, its scale bytes 34-35.
  std::vector<uint8_t> q4b(36, 0x88);
  q4b[16] = 0xA8;  // low nibble 8 (element 32: 0), high nibble 10 (element 33: +2 scale)
  const auto s = f16s({0.25f, 1.5f});
  std::copy(s.begin(), s.end(), q4b.begin() + 32);
  ts.push_back({"d.q4_block", cmf::kQ4Block, {40}, q4b});
  return ts;
}

}  // namespace

TEST(Cmf, Hash64TestVectors) {
  EXPECT_EQ(cmf::hash64("", 0), 0u);
  EXPECT_EQ(cmf::hash64("CMF", 3), 0xb59aa39a074033ecull);
  EXPECT_EQ(cmf::hash64("0123456789abcdef", 16), 0x30d401310062ea9full);
  std::vector<uint8_t> all(256);
  for (int i = 0; i < 256; ++i) all[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(cmf::hash64(all.data(), all.size()), 0x9955bb876c0706bfull);
}

TEST(Cmf, WorkedExamplesDecode) {
  auto f = cmf::File::parse(build(sample()), "sample.cmf");
  EXPECT_EQ(f->tensors().size(), 4u);
  EXPECT_EQ(f->quant_type(), "Q8_2F");
  EXPECT_EQ(f->chat_template(), "{{x}}");
  ASSERT_EQ(f->eos_ids().size(), 1u);
  ASSERT_EQ(f->skills().size(), 1u);
  EXPECT_EQ(f->skills()[0].id, "sql");
  EXPECT_EQ(f->vocab(), "{\"model\":{}}");
  EXPECT_EQ(decode(*f, "a.f16"), (std::vector<float>{1.0f, -2.0f, 0.5f}));
  EXPECT_FLOAT_EQ(decode(*f, "b.q8_2f")[5], -0.375f);
  const auto t = decode(*f, "c.q4tp");
  EXPECT_FLOAT_EQ(t[0], -0.62499988f);
  EXPECT_FLOAT_EQ(t[1], 0.37499993f);
  const auto b = decode(*f, "d.q4_block");
  EXPECT_EQ(b[32], 0.0f);
  EXPECT_EQ(b[33], 3.0f);  // (10 - 8) * 1.5
  EXPECT_EQ(b[0], 0.0f);   // nibble 8 of group 0
  const auto v = f->verify();
  EXPECT_TRUE(v.problems.empty()) << v.problems[0];
  EXPECT_EQ(v.checked, 6);  // header, directory, 4 tensors
}

TEST(Cmf, TiledEqualsBlockOnRandomGroups) {
  std::mt19937 rng(7);
  const int groups = 6;
  std::vector<uint8_t> blk(18 * groups), til(18 * groups);
  for (int g = 0; g < groups; ++g) {
    const auto sc = f16s({0.01f * static_cast<float>(rng() % 100 + 1)});
    for (int k = 0; k < 16; ++k)
      blk[16 * g + k] = til[18 * g + 2 + k] = static_cast<uint8_t>(rng());
    blk[16 * groups + 2 * g] = til[18 * g] = sc[0];
    blk[16 * groups + 2 * g + 1] = til[18 * g + 1] = sc[1];
  }
  auto f = cmf::File::parse(
      build({{"b", cmf::kQ4Block, {2, 96}, blk}, {"t", cmf::kQ4Tiled, {2, 96}, til}}), "x.cmf");
  const auto a = decode(*f, "b"), c = decode(*f, "t");
  ASSERT_EQ(a.size(), c.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const int g = static_cast<int>(i / 32), k = static_cast<int>(i % 32);
    const uint8_t byte = blk[16 * g + k / 2];
    const float want = static_cast<float>((k % 2 ? byte >> 4 : byte & 15) - 8) *
                       f16_to_f32(static_cast<uint16_t>(blk[16 * groups + 2 * g] |
                                                        blk[16 * groups + 2 * g + 1] << 8));
    ASSERT_EQ(a[i], want) << i;  // the scalar reading of docs/cmf.md
    ASSERT_EQ(c[i], want) << i;
  }
}

TEST(Cmf, VerifyFindsAFlippedByte) {
  auto bytes = build(sample());
  const auto good = cmf::File::parse(bytes, "x.cmf");
  const uint64_t at = good->sections()[2].off + good->find("b.q8_2f")->off + 3;
  bytes[at] ^= 1;
  auto f = cmf::File::parse(bytes, "x.cmf");
  const auto v = f->verify();
  ASSERT_EQ(v.problems.size(), 1u);
  EXPECT_NE(v.problems[0].find("b.q8_2f"), std::string::npos);
}

TEST(Cmf, EveryLyingFieldIsOneLineError) {
  const auto good = build(sample());
  const auto ok = cmf::File::parse(good, "x.cmf");
  const uint64_t dir = ok->sections()[1].off;
  struct Lie {
    const char* what;
    size_t at;
    int width;
    uint64_t value;
  };
  const std::vector<Lie> lies = {
      {"magic", 0, 1, 'X'},
      {"version 1", 4, 4, 1},
      {"version 3", 4, 4, 3},
      {"reserved feature bit 3", 12, 4, 1 | 8},
      {"unknown feature bit 9", 12, 4, 1 | 512},
      {"header past the end", 0x10, 8, 1u << 30},
      {"header length 0", 0x18, 8, 0},
      {"header huge", 0x18, 8, ~0ull},
      {"directory past the end", 0x20, 8, good.size()},
      {"directory length 0", 0x28, 8, 0},
      {"data not 4096-aligned", 0x30, 8, 4097},
      {"data length huge", 0x38, 8, ~0ull / 2},
      {"vocab over the envelope", 0x50, 8, 64},
      {"vocab overlapping the data", 0x50, 8, ok->sections()[2].off},
      {"record count huge", dir, 8, 1u << 20},
      {"name pool inside the records", dir + 8, 8, 20},
      {"name offset", dir + 16, 4, 1000},
      {"name length", dir + 16 + 4, 2, 60000},
      {"dtype unknown", dir + 16 + 6, 1, 42},
      {"dtype reserved", dir + 16 + 6, 1, 5},
      {"ndim 7", dir + 16 + 7, 1, 7},
      {"unused dim set", dir + 16 + 8 + 4 * 5, 4, 9},
      {"shape vs bytes", dir + 16 + 8, 4, 4},
      {"offset not 64-aligned", dir + 16 + 32, 8, 8},
      {"offset past data", dir + 16 + 32, 8, 1u << 20},
      {"nbytes vs shape", dir + 16 + 40, 8, 7},
      {"q8_2f with a 3-D shape", dir + 16 + 56 + 7, 1, 3},
      {"q4tp cols not in 32s", dir + 16 + 2 * 56 + 12, 4, 48},
      {"overlapping tensors", dir + 16 + 56 + 32, 8, 0},
  };
  for (const Lie& l : lies) {
    auto b = good;
    for (int i = 0; i < l.width; ++i) b[l.at + i] = static_cast<uint8_t>(l.value >> (8 * i));
    try {
      cmf::File::parse(b, "x.cmf");
      ADD_FAILURE() << l.what << ": no error";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.find('\n'), std::string::npos) << l.what;
      EXPECT_EQ(m.rfind("x.cmf: not a valid CMF file: ", 0), 0u) << l.what << ": " << m;
    }
  }
  // Cut anywhere: the envelope, the header, the directory, the data.
  for (size_t cut :
       {size_t(0), size_t(64), size_t(130), size_t(ok->sections()[1].off + 20), good.size() - 1}) {
    std::vector<uint8_t> b(good.begin(), good.begin() + cut);
    EXPECT_THROW(cmf::File::parse(b, "x.cmf"), Error) << cut;
  }
  // Duplicate names, a non-UTF-8 name, a header that is not JSON.
  auto dup = sample();
  dup[1].name = dup[0].name;
  EXPECT_THROW(cmf::File::parse(build(dup), "x.cmf"), Error);
  auto bad_name = sample();
  bad_name[0].name = std::string("a\xff", 2);
  EXPECT_THROW(cmf::File::parse(build(bad_name), "x.cmf"), Error);
  auto b = good;
  b[ok->sections()[0].off] = '[';
  EXPECT_THROW(cmf::File::parse(b, "x.cmf"), Error);
}

TEST(Cmf, VariableWidthTypesSayWhatToDo) {
  std::vector<uint8_t> q1(6 * 2, 0);
  const auto s = f16s({0.5f});
  q1[0] = s[0], q1[1] = s[1], q1[2] = 0x01;
  auto f = cmf::File::parse(
      build({{"q1", cmf::kQ1, {1, 64}, q1}, {"v", cmf::kVbit, {1, 32}, std::vector<uint8_t>(40)}}),
      "x.cmf");
  const auto v = decode(*f, "q1");
  EXPECT_EQ(v[0], 0.5f);
  EXPECT_EQ(v[1], -0.5f);
  std::vector<float> out(32);
  try {
    cmf::dequantize(*f->find("v"), out.data());
    ADD_FAILURE() << "vbit decoded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not supported"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("convert"), std::string::npos);
  }
}
