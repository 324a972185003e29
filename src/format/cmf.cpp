#include "format/cmf.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <limits>
#include <set>

#include <openssl/evp.h>

#include "dory/error.h"
#include "tensor/dtype.h"

namespace dory::cmf {

namespace {

uint64_t fmix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}

uint64_t u64le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint32_t u32le(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
uint16_t u16le(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
float f16(const uint8_t* p) {
  return f16_to_f32(u16le(p));
}

// Standard base64 of little-endian f16 values (a skill router's mean and basis). OpenSSL's
// decoder does the base64; it pads its output to a multiple of 3 bytes, so the '='
// padding is taken back off.
std::vector<float> f16_base64(const std::string& b64, const std::string& what) {
  if (b64.size() % 4 != 0) throw Error(what + ": not base64 (length " + std::to_string(b64.size()) + ")");
  std::vector<unsigned char> raw(b64.size() / 4 * 3 + 1);
  const int n = EVP_DecodeBlock(raw.data(), reinterpret_cast<const unsigned char*>(b64.data()),
                                static_cast<int>(b64.size()));
  if (n < 0) throw Error(what + ": not base64");
  size_t len = static_cast<size_t>(n);
  for (size_t i = b64.size(); i > 0 && b64[i - 1] == '='; --i) --len;
  if (len % 2) throw Error(what + ": " + std::to_string(len) + " bytes, not whole f16 values");
  std::vector<float> out(len / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = f16(raw.data() + 2 * i);
  return out;
}

Selection parse_selection(const nlohmann::json& j, const std::string& id) {
  const std::string what = "skill '" + id + "': selection";
  Selection s;
  const std::string metric = j.value("metric", std::string("mse"));
  if (metric != "mse" && metric != "mse_unit")
    throw Error(what + ": metric '" + metric + "' is not one of mse, mse_unit");
  s.unit = metric == "mse_unit";
  if (!j.contains("phi_layer") || !j["phi_layer"].is_number_integer() || j["phi_layer"].get<int64_t>() < 0)
    throw Error(what + ": phi_layer must be a layer index");
  s.phi_layer = j["phi_layer"].get<int64_t>();
  if (!j.contains("rank") || !j["rank"].is_number_integer() || j["rank"].get<int64_t>() < 0)
    throw Error(what + ": rank must be a count");
  s.rank = j["rank"].get<int64_t>();
  if (!j.contains("mean") || !j["mean"].is_string()) throw Error(what + ": no mean");
  s.mean = f16_base64(j["mean"].get<std::string>(), what + ".mean");
  if (s.mean.empty()) throw Error(what + ": empty mean");
  if (s.rank > 0) {
    if (!j.contains("basis") || !j["basis"].is_string()) throw Error(what + ": no basis");
    s.basis = f16_base64(j["basis"].get<std::string>(), what + ".basis");
  }
  if (static_cast<int64_t>(s.basis.size()) != s.rank * static_cast<int64_t>(s.mean.size()))
    throw Error(what + ": basis has " + std::to_string(s.basis.size()) + " values, rank x hidden is " +
                std::to_string(s.rank * static_cast<int64_t>(s.mean.size())));
  return s;
}

std::string hex16(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    const int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    if (n < 0 || i + n >= s.size()) return false;  // a bad lead byte, or the sequence is cut
    for (int k = 1; k <= n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    i += n + 1;
  }
  return true;
}

// The ladder of a q4tp / q2tp row: t[0] = 2^lo, t[c] = t[c-1] * 2^step, sequentially in f32.
void ladder(float lo, float step, float t[32]) {
  t[0] = std::exp2f(lo);
  const float m = std::exp2f(step);
  for (int c = 1; c < 32; ++c) t[c] = t[c - 1] * m;
}

// The 5-bit scale code g of a row's code slice (LSB-first).
int code5(const uint8_t* slice, int64_t g) {
  const int64_t bit = 5 * g, byte = bit / 8, sh = bit % 8;
  unsigned v = slice[byte];
  if (sh > 3) v |= unsigned(slice[byte + 1]) << 8;
  return static_cast<int>((v >> sh) & 31);
}

}  // namespace

uint64_t hash64(const void* data, size_t len) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t acc = 0;
  const size_t words = (len + 7) / 8;
  for (size_t i = 0; i < words; ++i) {
    uint8_t w[8] = {};
    std::memcpy(w, p + 8 * i, std::min<size_t>(8, len - 8 * i));
    acc ^= fmix64(u64le(w)) ^ (uint64_t(i) * 0x9E3779B97F4A7C15ull);
  }
  acc ^= static_cast<uint64_t>(len);
  return fmix64(acc);
}

const char* dtype_name(int id) {
  static const char* const names[] = {"f32", "f16",    "bf16", "q8_row", "q4_block", "mix8_4",
                                      "u8",  "q4_col", "vbit", "q8_2f",  "vbit_ro",  "q4_tiled",
                                      "q1",  "q1s",    "q1t",  "q4tp",   "q2tp"};
  return id >= 0 && id <= kQ2tp ? names[id] : "unknown";
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t expected_bytes(int dtype, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const bool two_d = shape.size() == 2;
  const int64_t rows = two_d ? shape[0] : 0, cols = two_d ? shape[1] : 0;
  auto need_2d = [&](bool cols32) {
    if (!two_d)
      throw Error(std::string(dtype_name(dtype)) + " needs a 2-D shape, found " +
                  std::to_string(shape.size()) + "-D");
    if (cols32 && cols % 32)
      throw Error(std::string(dtype_name(dtype)) + " needs columns in groups of 32, found " +
                  std::to_string(cols));
  };
  switch (dtype) {
    case kF32:
      return 4 * n;
    case kF16:
    case kBF16:
      return 2 * n;
    case kQ8Row:
      need_2d(false);
      return n + 2 * rows;
    case kQ4Block:
      return 18 * ((n + 31) / 32);
    case kU8:
      return n;
    case kQ8_2f:
      need_2d(false);
      return n + 2 * rows + 2 * cols;
    case kQ4Tiled:
      need_2d(true);
      return 18 * (n / 32);
    case kQ1:
      need_2d(true);
      return 6 * (n / 32);
    case kQ4tp: {
      need_2d(true);
      const int64_t gpr = cols / 32;
      return rows * (16 * gpr + 4 + (5 * gpr + 7) / 8);
    }
    case kQ2tp: {
      need_2d(true);
      const int64_t gpr = cols / 32;
      return rows * (8 * gpr + 4 + (5 * gpr + 7) / 8);
    }
    case kVbit:
    case kVbitRo:
    case kQ1t:
      need_2d(true);
      return -1;
    case kQ1s:
      need_2d(true);
      return -1;
    default:
      throw Error("dtype " + std::to_string(dtype) + " (" + dtype_name(dtype) + ") has no layout");
  }
}

std::unique_ptr<File> File::open(const std::string& path) {
  auto f = std::unique_ptr<File>(new File());
  f->path_ = path;
  f->map_ = std::make_unique<MappedFile>(path);
  f->base_ = f->map_->data();
  f->size_ = f->map_->size();
  f->parse_all();
  return f;
}

std::unique_ptr<File> File::parse(std::vector<uint8_t> bytes, const std::string& name) {
  auto f = std::unique_ptr<File>(new File());
  f->path_ = name;
  f->bytes_ = std::move(bytes);
  f->base_ = f->bytes_.data();
  f->size_ = f->bytes_.size();
  f->parse_all();
  return f;
}

const Tensor* File::find(const std::string& name) const {
  for (const Tensor& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

std::string_view File::header_json() const {
  return {reinterpret_cast<const char*>(base_ + sections_[0].off),
          static_cast<size_t>(sections_[0].len)};
}

std::string_view File::vocab() const {
  const Section& s = sections_[4];
  return {reinterpret_cast<const char*>(base_ + s.off), static_cast<size_t>(s.len)};
}

void File::parse_all() {
  auto bad = [&](const std::string& what) {
    return Error(path_ + ": not a valid CMF file: " + what);
  };
  if (size_ < 128)
    throw bad("it has " + std::to_string(size_) + " bytes, less than the 128-byte envelope");
  const uint8_t* e = base_;
  if (std::memcmp(e, "CMF\x01", 4) != 0) throw bad("the magic is not \"CMF\\x01\"");
  version_ = u32le(e + 4);
  if (version_ != 2) throw bad("version " + std::to_string(version_) + " (only CMF v2 exists)");
  features_ = u32le(e + 12);
  constexpr uint32_t known = kTensorDir | kBinaryMasks | kQuant2F | kLoopMasks | kSkillFile;
  if (features_ & ~known) {
    uint32_t unk = features_ & ~known;
    int bit = 0;
    while (!(unk & 1)) unk >>= 1, ++bit;
    throw bad("required feature bit " + std::to_string(bit) +
              (bit == 3 || bit == 4
                   ? " (delta masks / hot packs: reserved, refused as cortiq's reader does)"
                   : " is unknown"));
  }
  static const char* const names[] = {"header", "directory", "data", "masks", "vocab", "index"};
  sections_.clear();
  for (int i = 0; i < 6; ++i) {
    Section s{names[i], u64le(e + 16 + 16 * i), u64le(e + 24 + 16 * i)};
    if (s.off > size_ || s.len > size_ - s.off)
      throw bad(std::string("the ") + names[i] + " section (offset " + std::to_string(s.off) +
                ", " + std::to_string(s.len) + " bytes) runs past the end of the file (" +
                std::to_string(size_) + " bytes)");
    if (s.len != 0 && s.off < 128)
      throw bad(std::string("the ") + names[i] + " section (offset " + std::to_string(s.off) +
                ") overlaps the 128-byte envelope");
    for (const Section& o : sections_)
      if (s.len && o.len && s.off < o.off + o.len && o.off < s.off + s.len)
        throw bad(std::string("the ") + names[i] + " section overlaps the " + o.name + " section");
    sections_.push_back(s);
  }
  header_hash_ = u64le(e + 0x70);
  dir_hash_ = u64le(e + 0x78);
  const Section &hs = sections_[0], &ds = sections_[1], &data = sections_[2];
  if (hs.len == 0) throw bad("it has no header (header_len is 0)");
  if (ds.len == 0) throw bad("it has no tensor directory (dir_len is 0)");
  if (data.off % 4096)
    throw bad("data_off " + std::to_string(data.off) + " is not a multiple of 4096");

  // The directory.
  const uint8_t* d = base_ + ds.off;
  if (ds.len < 16)
    throw bad("the directory has " + std::to_string(ds.len) +
              " bytes, less than its 16-byte prefix");
  const uint64_t count = u64le(d), pool = u64le(d + 8);
  if (count > (ds.len - 16) / 56)
    throw bad("the directory claims " + std::to_string(count) + " records; " +
              std::to_string(ds.len) + " bytes hold at most " + std::to_string((ds.len - 16) / 56));
  if (pool < 16 + 56 * count || pool > ds.len)
    throw bad("the directory's name pool offset " + std::to_string(pool) + " is outside [" +
              std::to_string(16 + 56 * count) + ", " + std::to_string(ds.len) + "]");
  tensors_.clear();
  tensors_.reserve(count);
  std::set<std::string> seen;
  for (uint64_t i = 0; i < count; ++i) {
    const uint8_t* r = d + 16 + 56 * i;
    const uint32_t name_off = u32le(r);
    const uint16_t name_len = u16le(r + 4);
    Tensor t;
    t.dtype = r[6];
    const int ndim = r[7];
    const std::string rec = "directory record " + std::to_string(i);
    if (uint64_t(name_off) + name_len > ds.len - pool)
      throw bad(rec + ": its name lies outside the name pool");
    t.name.assign(reinterpret_cast<const char*>(d + pool + name_off), name_len);
    if (!valid_utf8(t.name)) throw bad(rec + ": its name is not UTF-8");
    if (t.name.empty()) throw bad(rec + ": its name is empty");
    const std::string who = rec + " ('" + t.name + "')";
    if (ndim > 6) throw bad(who + ": ndim " + std::to_string(ndim) + " is over 6");
    for (int k = 0; k < ndim; ++k) t.shape.push_back(u32le(r + 8 + 4 * k));
    for (int k = ndim; k < 6; ++k)
      if (u32le(r + 8 + 4 * k) != 0) throw bad(who + ": an unused dimension is not 0");
    {
      // Element counts (and the byte counts made from them) stay far inside int64: no file
      // holds 2^48 elements.
      int64_t n = 1;
      for (int64_t dim : t.shape) {
        if (dim != 0 && n > (int64_t(1) << 48) / dim)
          throw bad(who + ": shape " + shape_str(t.shape) + " has more elements than any file holds");
        n *= dim;
      }
    }
    t.off = u64le(r + 32);
    t.nbytes = u64le(r + 40);
    t.hash = u64le(r + 48);
    if (t.dtype > kQ2tp) throw bad(who + ": unknown dtype " + std::to_string(t.dtype));
    if (t.dtype == kMix8_4 || t.dtype == kQ4Col)
      throw bad(who + ": dtype " + std::to_string(t.dtype) + " (" + dtype_name(t.dtype) +
                ") is reserved, with no layout");
    if (t.off % 64)
      throw bad(who + ": its offset " + std::to_string(t.off) + " is not a multiple of 64");
    if (t.off > data.len || t.nbytes > data.len - t.off)
      throw bad(who + ": its bytes [" + std::to_string(t.off) + ", +" + std::to_string(t.nbytes) +
                ") run past the data section (" + std::to_string(data.len) + " bytes)");
    int64_t want;
    try {
      want = expected_bytes(t.dtype, t.shape);
    } catch (const Error& err) {
      throw bad(who + ": " + err.what());
    }
    if (want >= 0 && static_cast<uint64_t>(want) != t.nbytes)
      throw bad(who + ": " + dtype_name(t.dtype) + " of shape " + shape_str(t.shape) + " takes " +
                std::to_string(want) + " bytes, the record says " + std::to_string(t.nbytes));
    if (!seen.insert(t.name).second) throw bad(who + ": the name appears twice");
    t.data = base_ + data.off + t.off;
    tensors_.push_back(std::move(t));
  }
  // No two tensors' bytes may overlap (dead bytes between them are allowed).
  std::vector<const Tensor*> by_off;
  for (const Tensor& t : tensors_) by_off.push_back(&t);
  std::sort(by_off.begin(), by_off.end(),
            [](const Tensor* a, const Tensor* b) { return a->off < b->off; });
  for (size_t i = 1; i < by_off.size(); ++i)
    if (by_off[i - 1]->off + by_off[i - 1]->nbytes > by_off[i]->off && by_off[i - 1]->nbytes &&
        by_off[i]->nbytes)
      throw bad("tensors '" + by_off[i - 1]->name + "' and '" + by_off[i]->name +
                "' overlap in the data section");

  // The header.
  using nlohmann::json;
  json h;
  try {
    h = json::parse(header_json());
  } catch (const json::exception& ex) {
    throw bad(std::string("the header is not valid JSON: ") + ex.what());
  }
  if (!h.is_object()) throw bad("the header is not a JSON object");
  if (!h.contains("version") || !h["version"].is_number_integer() ||
      h["version"].get<int64_t>() != 2)
    throw bad("the header's \"version\" is not 2");
  if (!h.contains("arch") || !h["arch"].is_object()) throw bad("the header has no \"arch\" object");
  arch_json_ = h["arch"].dump();
  if (!h.contains("quant_type") || !h["quant_type"].is_string())
    throw bad("the header has no \"quant_type\" string");
  quant_type_ = h["quant_type"].get<std::string>();
  if (h.contains("tokenizer_config") && h["tokenizer_config"].is_object()) {
    const json& tc = h["tokenizer_config"];
    if (tc.contains("chat_template") && tc["chat_template"].is_string())
      chat_template_ = tc["chat_template"].get<std::string>();
    if (tc.contains("eos_token_ids") && tc["eos_token_ids"].is_array())
      for (const json& v : tc["eos_token_ids"])
        if (v.is_number_integer()) eos_ids_.push_back(v.get<int64_t>());
  }
  if (h.contains("section_hashes") && h["section_hashes"].is_object())
    for (const char* k : {"masks", "vocab", "index"})
      if (h["section_hashes"].contains(k) && h["section_hashes"][k].is_string()) {
        const std::string v = h["section_hashes"][k].get<std::string>();
        char* end = nullptr;
        const uint64_t x = std::strtoull(v.c_str(), &end, 16);
        if (v.size() != 16 || *end)
          throw bad(std::string("section_hashes.") + k + " is not 16 hex digits");
        section_hashes_.emplace_back(k, x);
      }
  if (h.contains("skills") && h["skills"].is_array())
    for (const json& s : h["skills"]) {
      if (!s.is_object() || !s.contains("id") || !s["id"].is_string())
        throw bad("a skill record has no \"id\"");
      Skill k;
      k.id = s["id"].get<std::string>();
      if (s.contains("name") && s["name"].is_string()) k.name = s["name"].get<std::string>();
      if (s.contains("layers") && s["layers"].is_array())
        for (const json& l : s["layers"])
          if (l.is_number_integer()) k.layers.push_back(l.get<int64_t>());
      k.routable = s.contains("selection") && s["selection"].is_object();
      if (k.routable) {
        try {
          k.selection = parse_selection(s["selection"], k.id);
        } catch (const Error& e) {
          k.selection_error = e.what();  // the file still runs; routing to it says this
        }
      }
      if (s.contains("base_dir_hash") && s["base_dir_hash"].is_string())
        k.base_dir_hash = s["base_dir_hash"].get<std::string>();
      skills_.push_back(std::move(k));
    }
}

double skill_error(const Selection& s, const std::vector<float>& phi_in) {
  const size_t H = s.mean.size();
  if (phi_in.size() != H)
    throw Error("skill router: its mean has " + std::to_string(H) + " values, the model's hidden size is " +
                std::to_string(phi_in.size()));
  std::vector<double> phi(phi_in.begin(), phi_in.end());
  double n2 = 0;
  for (double v : phi) n2 += v * v;
  if (s.unit && n2 > 0) {
    const double inv = 1.0 / std::sqrt(n2);
    for (double& v : phi) v *= inv;
    n2 = 1.0;
  }
  if (n2 <= 0) return std::numeric_limits<double>::infinity();
  std::vector<double> r(H);
  double e = 0;
  for (size_t i = 0; i < H; ++i) r[i] = phi[i] - s.mean[i], e += r[i] * r[i];
  for (int64_t k = 0; k < s.rank; ++k) {
    double d = 0;
    for (size_t i = 0; i < H; ++i) d += double(s.basis[k * H + i]) * r[i];
    e -= d * d;
  }
  return std::max(0.0, e) / n2;
}

File::VerifyResult File::verify(const std::function<void(uint64_t, uint64_t)>& progress) const {
  VerifyResult r;
  uint64_t total = sections_[0].len + sections_[1].len, done = 0;
  for (const auto& [k, v] : section_hashes_) {
    for (const Section& s : sections_)
      if (k == s.name) total += s.len;
  }
  for (const Tensor& t : tensors_) total += t.nbytes;
  auto check = [&](const std::string& what, const uint8_t* p, uint64_t n, uint64_t want) {
    if (want == 0) {
      ++r.unrecorded;
    } else {
      ++r.checked;
      const uint64_t got = hash64(p, n);
      if (got != want)
        r.problems.push_back(what + ": hash " + hex16(got) + ", recorded " + hex16(want));
    }
    done += n;
    if (progress) progress(done, total);
  };
  check("header", base_ + sections_[0].off, sections_[0].len, header_hash_);
  check("directory", base_ + sections_[1].off, sections_[1].len, dir_hash_);
  for (const auto& [k, v] : section_hashes_)
    for (const Section& s : sections_)
      if (k == s.name) check(std::string(s.name) + " section", base_ + s.off, s.len, v);
  for (const Tensor& t : tensors_) check("tensor '" + t.name + "'", t.data, t.nbytes, t.hash);
  return r;
}

bool is_cmf_name(const std::string& path) {
  return path.size() > 4 && path.compare(path.size() - 4, 4, ".cmf") == 0;
}

const std::vector<std::pair<std::string, std::string>>& arch_key_names() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"num_layers", "num_hidden_layers"},
      {"num_kv_heads", "num_key_value_heads"},
      {"num_loops", "n_recurrent_loops"},
      {"head_dim", "attention_head_dim"}};
  return names;
}

std::vector<std::string> shard_paths(const std::string& path) {
  // stem-NNNNN-of-MMMMM.cmf
  const size_t n = path.size();
  auto digits = [&](size_t at) {
    for (size_t i = at; i < at + 5; ++i)
      if (i >= n || path[i] < '0' || path[i] > '9') return false;
    return true;
  };
  if (n < 20 || !is_cmf_name(path) || path.compare(n - 13, 4, "-of-") != 0 || !digits(n - 9) ||
      !digits(n - 18) || path[n - 19] != '-')
    return {path};
  const int count = std::stoi(path.substr(n - 9, 5)), no = std::stoi(path.substr(n - 18, 5));
  if (count < 1 || no < 1 || no > count)
    throw Error(path + ": shard " + std::to_string(no) + " of " + std::to_string(count) +
                " is not a shard name");
  const std::string stem = path.substr(0, n - 19);
  std::vector<std::string> out;
  for (int i = 1; i <= count; ++i) {
    char tail[32];
    std::snprintf(tail, sizeof tail, "-%05d-of-%05d.cmf", i, count);
    out.push_back(stem + tail);
    if (std::FILE* f = std::fopen(out.back().c_str(), "rb"))
      std::fclose(f);
    else
      throw Error(path + ": shard " + std::to_string(i) + " of " + std::to_string(count) + " (" +
                  out.back() + ") is missing");
  }
  return out;
}

void File::release(const Tensor& t) const {
  if (map_) map_->release(t.data, t.nbytes);
}

int group_row(const Tensor& t, int64_t r, int8_t* q, float* scale) {
  if (t.shape.size() != 2 || t.shape[1] % 32 != 0 || r < 0 || r >= t.shape[0]) return 0;
  const int64_t rows = t.shape[0], cols = t.shape[1], gpr = cols / 32;
  const uint8_t* p = t.data;
  switch (t.dtype) {
    case kQ8Row: {
      const float s = f16(p + rows * cols + 2 * r);
      for (int64_t c = 0; c < cols; ++c) q[c] = static_cast<int8_t>(p[r * cols + c]);
      for (int64_t g = 0; g < gpr; ++g) scale[g] = s;
      return 8;
    }
    case kQ4Block:
    case kQ4Tiled: {
      // Groups run over the flattened tensor; with cols % 32 == 0 none crosses a row.
      const int64_t ng = rows * gpr;
      for (int64_t g = 0; g < gpr; ++g) {
        const int64_t G = r * gpr + g;
        const uint8_t* nib = t.dtype == kQ4Block ? p + 16 * G : p + 18 * G + 2;
        scale[g] = f16(t.dtype == kQ4Block ? p + 16 * ng + 2 * G : p + 18 * G);
        for (int k = 0; k < 32; ++k)
          q[32 * g + k] = static_cast<int8_t>((k % 2 ? nib[k / 2] >> 4 : nib[k / 2] & 15) - 8);
      }
      return 4;
    }
    case kQ4tp:
    case kQ2tp: {
      const int64_t stride = (5 * gpr + 7) / 8;
      const int64_t gbytes = t.dtype == kQ4tp ? 16 : 8;
      const uint8_t* params = p + rows * gpr * gbytes;
      const uint8_t* codes = params + 4 * rows + r * stride;
      float lad[32];
      ladder(f16(params + 4 * r), f16(params + 4 * r + 2), lad);
      for (int64_t g = 0; g < gpr; ++g) {
        const int code = code5(codes, g);
        const uint8_t* w = p + (r * gpr + g) * gbytes;
        for (int k = 0; k < 32; ++k) {
          if (t.dtype == kQ4tp) {
            q[32 * g + k] = static_cast<int8_t>((k % 2 ? w[k / 2] >> 4 : w[k / 2] & 15) - 8);
          } else {
            // (c - 1.5) * t = (2c - 3) * (t / 2): the halving is exact in f32.
            q[32 * g + k] = static_cast<int8_t>(2 * ((w[k / 4] >> (2 * (k % 4))) & 3) - 3);
          }
        }
        if (t.dtype == kQ4tp) scale[g] = lad[code];
        else scale[g] = code == 0 ? 0.0f : lad[code - 1] * 0.5f;
      }
      return 4;
    }
    default:
      return 0;
  }
}

void dequantize(const Tensor& t, float* out) {
  const int64_t n = t.numel();
  const uint8_t* p = t.data;
  const int64_t rows = t.shape.size() == 2 ? t.shape[0] : 0,
                cols = t.shape.size() == 2 ? t.shape[1] : 0;
  switch (t.dtype) {
    case kF32:
      std::memcpy(out, p, n * 4);
      return;
    case kF16:
      for (int64_t i = 0; i < n; ++i) out[i] = f16(p + 2 * i);
      return;
    case kBF16:
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(u16le(p + 2 * i));
      return;
    case kQ8Row:
      for (int64_t r = 0; r < rows; ++r) {
        const float s = f16(p + rows * cols + 2 * r);
        for (int64_t c = 0; c < cols; ++c)
          out[r * cols + c] = static_cast<float>(static_cast<int8_t>(p[r * cols + c])) * s;
      }
      return;
    case kQ8_2f: {
      const uint8_t* rs = p + rows * cols;
      const uint8_t* cs = rs + 2 * rows;
      for (int64_t r = 0; r < rows; ++r) {
        const float s = f16(rs + 2 * r);
        for (int64_t c = 0; c < cols; ++c)
          out[r * cols + c] =
              static_cast<float>(static_cast<int8_t>(p[r * cols + c])) * s * f16(cs + 2 * c);
      }
      return;
    }
    case kQ4Block: {
      const int64_t ng = (n + 31) / 32;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t g = i / 32, k = i % 32;
        const uint8_t b = p[16 * g + k / 2];
        const int nib = k % 2 ? b >> 4 : b & 15;
        out[i] = static_cast<float>(nib - 8) * f16(p + 16 * ng + 2 * g);
      }
      return;
    }
    case kQ4Tiled:
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t* tile = p + 18 * (i / 32);
        const int64_t k = i % 32;
        const uint8_t b = tile[2 + k / 2];
        out[i] = static_cast<float>((k % 2 ? b >> 4 : b & 15) - 8) * f16(tile);
      }
      return;
    case kQ1:
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t* tile = p + 6 * (i / 32);
        const int64_t k = i % 32;
        const float s = f16(tile);
        out[i] = (tile[2 + k / 8] >> (k % 8)) & 1 ? s : -s;
      }
      return;
    case kQ4tp:
    case kQ2tp: {
      const int64_t gpr = cols / 32, stride = (5 * gpr + 7) / 8;
      const int64_t wbytes = (t.dtype == kQ4tp ? 16 : 8) * gpr;
      const uint8_t* params = p + rows * wbytes;
      const uint8_t* codes = params + 4 * rows;
      float lad[32];
      for (int64_t r = 0; r < rows; ++r) {
        ladder(f16(params + 4 * r), f16(params + 4 * r + 2), lad);
        for (int64_t g = 0; g < gpr; ++g) {
          const int code = code5(codes + r * stride, g);
          const uint8_t* q = p + (r * gpr + g) * (wbytes / gpr);
          for (int k = 0; k < 32; ++k) {
            float v;
            if (t.dtype == kQ4tp) {
              const uint8_t b = q[k / 2];
              v = static_cast<float>((k % 2 ? b >> 4 : b & 15) - 8) * lad[code];
            } else {
              const int c = (q[k / 4] >> (2 * (k % 4))) & 3;
              // Rung 0 is exactly zero; rung c >= 1 uses the ladder's t[c - 1].
              v = code == 0 ? 0.0f : (static_cast<float>(c) - 1.5f) * lad[code - 1];
            }
            out[r * cols + g * 32 + k] = v;
          }
        }
      }
      return;
    }
    case kVbit:
    case kVbitRo:
    case kQ1s:
    case kQ1t:
      throw Error(
          "tensor '" + t.name + "': CMF dtype " + dtype_name(t.dtype) +
          " is not supported by dory.cpp (convert it with cortiq to q8_2f, q4tp or bf16 first)");
    default:
      throw Error("tensor '" + t.name + "': CMF dtype " + std::to_string(t.dtype) + " (" +
                  dtype_name(t.dtype) + ") holds no weights dory.cpp can read");
  }
}

std::vector<uint8_t> encode_q8_2f(const float* w, int64_t rows, int64_t cols) {
  std::vector<uint8_t> out(rows * cols + 2 * rows + 2 * cols);
  std::vector<float> col(cols);
  for (int64_t c = 0; c < cols; ++c) {
    double ss = 0;
    for (int64_t r = 0; r < rows; ++r) ss += double(w[r * cols + c]) * w[r * cols + c];
    uint16_t h = f32_to_f16(static_cast<float>(std::sqrt(ss / double(std::max<int64_t>(rows, 1)))));
    if (f16_to_f32(h) == 0.0f) h = f32_to_f16(1.0f);
    col[c] = f16_to_f32(h);
    out[rows * cols + 2 * rows + 2 * c] = static_cast<uint8_t>(h),
                                     out[rows * cols + 2 * rows + 2 * c + 1] =
                                         static_cast<uint8_t>(h >> 8);
  }
  for (int64_t r = 0; r < rows; ++r) {
    float amax = 0;
    for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(w[r * cols + c] / col[c]));
    uint16_t h = f32_to_f16(amax / 127.0f);
    if (f16_to_f32(h) == 0.0f) h = f32_to_f16(1.0f);
    const float rs = f16_to_f32(h);
    out[rows * cols + 2 * r] = static_cast<uint8_t>(h),
                          out[rows * cols + 2 * r + 1] = static_cast<uint8_t>(h >> 8);
    for (int64_t c = 0; c < cols; ++c) {
      const float q = std::nearbyint(w[r * cols + c] / col[c] / rs);
      out[r * cols + c] =
          static_cast<uint8_t>(static_cast<int8_t>(std::max(-127.0f, std::min(127.0f, q))));
    }
  }
  return out;
}

void Writer::add(const std::string& name, int dtype, const std::vector<int64_t>& shape,
                 std::vector<uint8_t> payload) {
  entries_.push_back({name, dtype, shape, std::move(payload)});
}

void Writer::write(const std::string& path) const {
  auto put = [](std::vector<uint8_t>& b, size_t at, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
  };
  std::vector<uint8_t> dir(16 + 56 * entries_.size());
  std::string pool;
  uint64_t data_len = 0;
  std::vector<uint64_t> offs;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    const uint64_t align = e.payload.size() >= (16u << 10) ? 4096 : 64;
    data_len = (data_len + align - 1) / align * align;
    offs.push_back(data_len);
    const size_t r = 16 + 56 * i;
    put(dir, r, pool.size(), 4);
    put(dir, r + 4, e.name.size(), 2);
    dir[r + 6] = static_cast<uint8_t>(e.dtype);
    dir[r + 7] = static_cast<uint8_t>(e.shape.size());
    for (size_t k = 0; k < e.shape.size(); ++k)
      put(dir, r + 8 + 4 * k, static_cast<uint64_t>(e.shape[k]), 4);
    put(dir, r + 32, data_len, 8);
    put(dir, r + 40, e.payload.size(), 8);
    put(dir, r + 48, hash64(e.payload.data(), e.payload.size()), 8);
    pool += e.name;
    data_len += e.payload.size();
  }
  put(dir, 0, entries_.size(), 8);
  put(dir, 8, dir.size(), 8);
  dir.insert(dir.end(), pool.begin(), pool.end());
  const uint64_t hoff = 128, doff = hoff + header_.size(),
                 data_off = (doff + dir.size() + 4095) / 4096 * 4096;
  const uint64_t voff = vocab_.empty() ? 0 : data_off + data_len;
  std::vector<uint8_t> env(128, 0);
  std::memcpy(env.data(), "CMF\x01", 4);
  put(env, 4, 2, 4);
  put(env, 12, kTensorDir, 4);
  put(env, 0x10, hoff, 8), put(env, 0x18, header_.size(), 8);
  put(env, 0x20, doff, 8), put(env, 0x28, dir.size(), 8);
  put(env, 0x30, data_off, 8), put(env, 0x38, data_len, 8);
  put(env, 0x50, voff, 8), put(env, 0x58, vocab_.size(), 8);
  put(env, 0x70, hash64(header_.data(), header_.size()), 8);
  put(env, 0x78, hash64(dir.data(), dir.size()), 8);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw Error(path + ": cannot create: " + std::strerror(errno));
  bool ok = true;
  auto w = [&](const void* p, size_t n) { ok = ok && std::fwrite(p, 1, n, f) == n; };
  auto zeros = [&](uint64_t n) {
    static const uint8_t z[4096] = {};
    while (n) {
      const uint64_t k = std::min<uint64_t>(n, sizeof z);
      w(z, k);
      n -= k;
    }
  };
  w(env.data(), env.size());
  w(header_.data(), header_.size());
  w(dir.data(), dir.size());
  zeros(data_off - (doff + dir.size()));
  uint64_t at = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    zeros(offs[i] - at);
    w(entries_[i].payload.data(), entries_[i].payload.size());
    at = offs[i] + entries_[i].payload.size();
  }
  w(vocab_.data(), vocab_.size());
  ok = std::fclose(f) == 0 && ok;
  if (!ok) throw Error(path + ": write failed: " + std::strerror(errno));
}

}  // namespace dory::cmf
