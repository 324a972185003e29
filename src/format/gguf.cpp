#include "format/gguf.h"

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

#include "dory/error.h"

namespace dory::gguf {

namespace {

constexpr uint64_t kMaxStringLen = 1ull << 30;   // a 1 GiB key or string is not metadata
constexpr int kMaxDepth = 4;                      // arrays of arrays of ...
constexpr uint32_t kMaxDims = 4;                  // GGML_MAX_DIMS
constexpr uint64_t kMaxKeyLen = 65535;            // the spec: keys at most 2^16-1 bytes

int scalar_size(VType t) {
  switch (t) {
    case VType::U8: case VType::I8: case VType::BOOL: return 1;
    case VType::U16: case VType::I16: return 2;
    case VType::U32: case VType::I32: case VType::F32: return 4;
    case VType::U64: case VType::I64: case VType::F64: return 8;
    default: return 0;
  }
}

bool valid_vtype(uint32_t t) { return t <= 12; }

// Reads the little-endian fields of a byte range, never past its end.
struct Cursor {
  const uint8_t* p;
  uint64_t size, pos = 0;
  const std::string& name;

  [[noreturn]] void fail(const std::string& why) const {
    throw Error(name + ": " + why);
  }
  uint64_t left() const { return size - pos; }
  void need(uint64_t n, const char* what) const {
    if (n > left())
      fail(std::string("truncated GGUF file: ") + what + " at offset " + std::to_string(pos) +
           " needs " + std::to_string(n) + " bytes, only " + std::to_string(left()) + " left");
  }
  uint64_t uint(int n, const char* what) {
    need(n, what);
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; --k) v = (v << 8) | p[pos + k];
    pos += n;
    return v;
  }
  uint32_t u32(const char* what) { return static_cast<uint32_t>(uint(4, what)); }
  uint64_t u64(const char* what) { return uint(8, what); }
  std::string str(const char* what, uint64_t max_len = kMaxStringLen) {
    const uint64_t at = pos;
    const uint64_t n = u64(what);
    if (n > max_len)
      fail(std::string(what) + " at offset " + std::to_string(at) + " has length " +
           std::to_string(n) + ", more than the limit of " + std::to_string(max_len));
    if (n > left())
      fail(std::string("truncated GGUF file: ") + what + " at offset " + std::to_string(at) +
           " has length " + std::to_string(n) + " but only " + std::to_string(left()) +
           " bytes follow");
    std::string s(reinterpret_cast<const char*>(p + pos), n);
    pos += n;
    return s;
  }
};

Value read_value(Cursor& c, VType t, int depth, const std::string& key) {
  Value v;
  v.type = t;
  switch (t) {
    case VType::U8: case VType::U16: case VType::U32: case VType::U64: case VType::BOOL: {
      v.u = c.uint(scalar_size(t), "metadata value");
      v.i = static_cast<int64_t>(v.u);
      if (t == VType::BOOL && v.u > 1)
        c.fail("key '" + key + "': bool value " + std::to_string(v.u) + " is not 0 or 1");
      break;
    }
    case VType::I8: case VType::I16: case VType::I32: case VType::I64: {
      const int n = scalar_size(t);
      uint64_t raw = c.uint(n, "metadata value");
      if (n < 8) {  // sign-extend
        const uint64_t sign = 1ull << (8 * n - 1);
        raw = (raw ^ sign) - sign;
      }
      v.i = static_cast<int64_t>(raw);
      v.u = raw;
      break;
    }
    case VType::F32: {
      uint32_t raw = static_cast<uint32_t>(c.uint(4, "metadata value"));
      float f;
      std::memcpy(&f, &raw, 4);
      v.f = f;
      break;
    }
    case VType::F64: {
      uint64_t raw = c.uint(8, "metadata value");
      std::memcpy(&v.f, &raw, 8);
      break;
    }
    case VType::STRING: v.s = c.str("string value"); break;
    case VType::ARRAY: {
      if (depth >= kMaxDepth)
        c.fail("key '" + key + "': arrays nested more than " + std::to_string(kMaxDepth) + " deep");
      const uint32_t et = c.u32("array element type");
      if (!valid_vtype(et))
        c.fail("key '" + key + "': unknown array element type " + std::to_string(et));
      v.elem = static_cast<VType>(et);
      const uint64_t at = c.pos;
      const uint64_t n = c.u64("array length");
      // Every element takes at least this many bytes, so a count the rest of
      // the file cannot hold is refused before anything is allocated.
      const uint64_t min_bytes = v.elem == VType::STRING ? 8 : v.elem == VType::ARRAY ? 12
                                                                                    : scalar_size(v.elem);
      if (n > c.left() / min_bytes)
        c.fail("key '" + key + "': array at offset " + std::to_string(at) + " claims " +
               std::to_string(n) + " elements of " + vtype_name(v.elem) + ", more than the " +
               std::to_string(c.left()) + " bytes left can hold");
      v.arr.reserve(n);
      for (uint64_t k = 0; k < n; ++k) v.arr.push_back(read_value(c, v.elem, depth + 1, key));
      break;
    }
  }
  return v;
}

std::string fmt_double(double d) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", d);
  return buf;
}

}  // namespace

const char* vtype_name(VType t) {
  switch (t) {
    case VType::U8: return "u8";
    case VType::I8: return "i8";
    case VType::U16: return "u16";
    case VType::I16: return "i16";
    case VType::U32: return "u32";
    case VType::I32: return "i32";
    case VType::F32: return "f32";
    case VType::BOOL: return "bool";
    case VType::STRING: return "string";
    case VType::ARRAY: return "array";
    case VType::U64: return "u64";
    case VType::I64: return "i64";
    case VType::F64: return "f64";
  }
  return "?";
}

uint32_t ggml_type_id(DType t) { return dtype_traits(t).ggml_id; }

bool dtype_from_ggml(uint32_t id, DType* out) {
  const DTypeTraits* d = dtype_from_ggml_id(id);
  if (d) *out = d->type;
  return d != nullptr;
}

Value Value::strings(const std::vector<std::string>& v) {
  std::vector<Value> a;
  a.reserve(v.size());
  for (const auto& s : v) a.push_back(str(s));
  return array(VType::STRING, std::move(a));
}

Value Value::i32s(const std::vector<int32_t>& v) {
  std::vector<Value> a;
  a.reserve(v.size());
  for (int32_t x : v) a.push_back(i32(x));
  return array(VType::I32, std::move(a));
}

bool Value::is_int() const {
  switch (type) {
    case VType::U8: case VType::I8: case VType::U16: case VType::I16: case VType::U32:
    case VType::I32: case VType::U64: case VType::I64: return true;
    default: return false;
  }
}

std::string Value::show(size_t max_items) const {
  switch (type) {
    case VType::U8: case VType::U16: case VType::U32: case VType::U64: return std::to_string(u);
    case VType::I8: case VType::I16: case VType::I32: case VType::I64: return std::to_string(i);
    case VType::BOOL: return u ? "true" : "false";
    case VType::F32: {
      char buf[64];
      auto r = std::to_chars(buf, buf + sizeof buf, static_cast<float>(f));
      return std::string(buf, r.ptr);
    }
    case VType::F64: return fmt_double(f);
    case VType::STRING: {
      std::string s = "\"";
      const size_t lim = 80;
      for (size_t k = 0; k < this->s.size() && k < lim; ++k) {
        const unsigned char ch = static_cast<unsigned char>(this->s[k]);
        if (ch == '\n') s += "\\n";
        else if (ch < 0x20 || ch == 0x7f) s += '?';
        else s += static_cast<char>(ch);
      }
      s += this->s.size() > lim ? "\"... (" + std::to_string(this->s.size()) + " bytes)" : "\"";
      return s;
    }
    case VType::ARRAY: {
      std::string s = std::string("[") + vtype_name(elem) + " x " + std::to_string(arr.size()) + "]";
      if (arr.size() <= max_items) {
        s += " [";
        for (size_t k = 0; k < arr.size(); ++k) s += (k ? ", " : "") + arr[k].show(max_items);
        s += "]";
      } else {
        s += " [";
        for (size_t k = 0; k < 3; ++k) s += (k ? ", " : "") + arr[k].show(max_items);
        s += ", ...]";
      }
      return s;
    }
  }
  return "?";
}

File::File(const std::string& path) : map_(std::make_unique<MappedFile>(path)), name_(path) {
  parse(map_->data(), map_->size());
}

File::File(const uint8_t* data, uint64_t size, const std::string& name) : name_(name) {
  parse(data, size);
}

const Value* File::find(const std::string& key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const TensorInfo* File::tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

void File::parse(const uint8_t* data, uint64_t size) {
  size_ = size;
  static const uint8_t empty[1] = {0};
  Cursor c{data ? data : empty, data ? size : 0, 0, name_};
  if (size < 4 || std::memcmp(data, "GGUF", 4) != 0)
    c.fail("not a GGUF file (bad magic: the file does not start with \"GGUF\")");
  c.pos = 4;
  version_ = c.u32("version");
  if (version_ != 3)
    c.fail("GGUF version " + std::to_string(version_) + " is not supported (only version 3)");
  const uint64_t n_tensors = c.u64("tensor count");
  const uint64_t n_kv = c.u64("metadata count");
  // A key/value needs at least 8 (key length) + 4 (type) + 1 bytes; a tensor
  // info 8 + 4 + 8 + 4 + 8.
  if (n_kv > c.left() / 13)
    c.fail("metadata count " + std::to_string(n_kv) + " is absurd for a file of " +
           std::to_string(size) + " bytes");
  if (n_tensors > c.left() / 32)
    c.fail("tensor count " + std::to_string(n_tensors) + " is absurd for a file of " +
           std::to_string(size) + " bytes");

  kv_.reserve(n_kv);
  for (uint64_t k = 0; k < n_kv; ++k) {
    const uint64_t at = c.pos;
    std::string key = c.str("metadata key", kMaxKeyLen);
    if (key.empty()) c.fail("metadata key at offset " + std::to_string(at) + " is empty");
    if (kv_index_.count(key)) c.fail("metadata key '" + key + "' appears twice");
    const uint32_t t = c.u32("metadata value type");
    if (!valid_vtype(t))
      c.fail("key '" + key + "': unknown metadata value type " + std::to_string(t));
    Value v = read_value(c, static_cast<VType>(t), 0, key);
    kv_index_[key] = kv_.size();
    kv_.emplace_back(std::move(key), std::move(v));
  }
  if (const Value* a = find("general.alignment")) {
    if (a->type != VType::U32)
      c.fail(std::string("key 'general.alignment' must be u32, found ") + vtype_name(a->type));
    if (a->u == 0 || (a->u & (a->u - 1)) != 0 || a->u > (1u << 20))
      c.fail("key 'general.alignment' is " + std::to_string(a->u) +
             "; it must be a power of two (at most 1 MiB)");
    alignment_ = static_cast<uint32_t>(a->u);
  }

  tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    TensorInfo ti;
    const uint64_t at = c.pos;
    ti.name = c.str("tensor name", kMaxKeyLen);
    auto bad = [&](const std::string& why) {
      c.fail("tensor '" + ti.name + "' (info at offset " + std::to_string(at) + "): " + why);
    };
    if (tensor_index_.count(ti.name)) bad("the name appears twice");
    const uint32_t nd = c.u32("tensor dimension count");
    if (nd == 0 || nd > kMaxDims)
      bad("has " + std::to_string(nd) + " dimensions (1 to " + std::to_string(kMaxDims) + " allowed)");
    uint64_t numel = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      const uint64_t n = c.u64("tensor dimension");
      if (n > (1ull << 40) || (n && numel > (1ull << 42) / n)) {
        bad("dimension " + std::to_string(d) + " = " + std::to_string(n) +
            " makes the element count overflow (absurdly large)");
      }
      numel *= n;
      ti.ne.push_back(static_cast<int64_t>(n));
    }
    ti.ggml_type = c.u32("tensor type");
    DType dt;
    if (!dtype_from_ggml(ti.ggml_type, &dt))
      bad("unsupported ggml type " + std::to_string(ti.ggml_type) +
          " (supported: F32=0, F16=1, Q4_0=2, Q8_0=8, Q4_K=12, Q5_K=13, Q6_K=14, BF16=30)");
    if (!dtype_row_ok(dt, ti.ne[0]))
      bad("row length ne[0] = " + std::to_string(ti.ne[0]) + " is not a whole number of " +
          dtype_name(dt) + " blocks of " + std::to_string(dtype_block_elems(dt)));
    ti.offset = c.u64("tensor offset");
    if (ti.offset % alignment_ != 0)
      bad("data offset " + std::to_string(ti.offset) + " is not a multiple of the alignment " +
          std::to_string(alignment_));
    uint64_t rows = 1;
    for (size_t d = 1; d < ti.ne.size(); ++d) rows *= static_cast<uint64_t>(ti.ne[d]);
    ti.nbytes = rows * row_bytes(dt, ti.ne[0]);  // numel <= 2^42: no overflow
    ti.view.name = ti.name;
    ti.view.dtype = dt;
    ti.view.shape.assign(ti.ne.rbegin(), ti.ne.rend());
    tensor_index_[ti.name] = tensors_.size();
    tensors_.push_back(std::move(ti));
  }

  const uint64_t a = alignment_;
  const uint64_t info_end = c.pos;
  data_offset_ = (info_end + a - 1) / a * a;
  if (n_tensors > 0 && data_offset_ > size)
    c.fail("truncated GGUF file: the data section would start at offset " +
           std::to_string(data_offset_) + ", past the end (" + std::to_string(size) + " bytes)");
  const uint64_t data_size = data_offset_ <= size ? size - data_offset_ : 0;
  std::vector<size_t> order(tensors_.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  for (TensorInfo& ti : tensors_) {
    if (ti.offset > data_size || ti.nbytes > data_size - ti.offset)
      c.fail("tensor '" + ti.name + "': data [" + std::to_string(ti.offset) + ", +" +
             std::to_string(ti.nbytes) + ") lies beyond the data section (" +
             std::to_string(data_size) + " bytes): file truncated or offset wrong");
    ti.view.data = data + data_offset_ + ti.offset;
  }
  std::sort(order.begin(), order.end(),
            [&](size_t x, size_t y) { return tensors_[x].offset < tensors_[y].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorInfo& p = tensors_[order[k - 1]];
    const TensorInfo& q = tensors_[order[k]];
    if (q.offset < p.offset + p.nbytes && q.nbytes > 0 && p.nbytes > 0)
      c.fail("tensors '" + p.name + "' and '" + q.name + "' overlap in the data section");
  }
}

// ---------------------------------------------------------------- writer

Writer::~Writer() {
  if (f_) std::fclose(f_);
}

void Writer::set(const std::string& key, Value v) {
  for (auto& [k, val] : kv_)
    if (k == key) {
      val = std::move(v);
      return;
    }
  kv_.emplace_back(key, std::move(v));
}

void Writer::set_alignment(uint32_t a) {
  if (a == 0 || (a & (a - 1)) != 0) throw Error("GGUF alignment must be a power of two");
  alignment_ = a;
  set("general.alignment", Value::u32(a));
}

void Writer::add_tensor(const std::string& name, DType t, const std::vector<int64_t>& shape) {
  if (f_) throw std::logic_error("gguf::Writer: add_tensor after begin");
  if (shape.empty() || shape.size() > kMaxDims)
    throw Error("tensor '" + name + "': GGUF tensors have 1 to 4 dimensions");
  if (!dtype_row_ok(t, shape.back()))
    throw Error("tensor '" + name + "': row of " + std::to_string(shape.back()) +
                " elements is not whole " + dtype_name(t) + " blocks");
  TensorInfo ti;
  ti.name = name;
  ti.ggml_type = ggml_type_id(t);
  ti.ne.assign(shape.rbegin(), shape.rend());
  ti.nbytes = tensor_bytes(t, shape);
  const uint64_t a = alignment_;
  data_size_ = (data_size_ + a - 1) / a * a;
  ti.offset = data_size_;
  data_size_ += ti.nbytes;
  infos_.push_back(std::move(ti));
}

void Writer::put(const void* p, size_t n) {
  if (n && std::fwrite(p, 1, n, f_) != n)
    throw Error(path_ + ": write failed: " + std::strerror(errno));
  pos_ += n;
}

void Writer::put_str(const std::string& s) {
  const uint64_t n = s.size();
  put(&n, 8);
  put(s.data(), s.size());
}

void Writer::put_value(const Value& v, bool with_type) {
  if (with_type) {
    const uint32_t t = static_cast<uint32_t>(v.type);
    put(&t, 4);
  }
  switch (v.type) {
    case VType::U8: case VType::I8: case VType::BOOL: { uint8_t x = static_cast<uint8_t>(v.u); put(&x, 1); break; }
    case VType::U16: case VType::I16: { uint16_t x = static_cast<uint16_t>(v.u); put(&x, 2); break; }
    case VType::U32: case VType::I32: { uint32_t x = static_cast<uint32_t>(v.u); put(&x, 4); break; }
    case VType::U64: case VType::I64: put(&v.u, 8); break;
    case VType::F32: { float x = static_cast<float>(v.f); put(&x, 4); break; }
    case VType::F64: put(&v.f, 8); break;
    case VType::STRING: put_str(v.s); break;
    case VType::ARRAY: {
      const uint32_t et = static_cast<uint32_t>(v.elem);
      put(&et, 4);
      const uint64_t n = v.arr.size();
      put(&n, 8);
      for (const Value& e : v.arr) {
        if (e.type != v.elem)
          throw std::logic_error("gguf::Writer: array element type differs from the array's");
        put_value(e, false);
      }
      break;
    }
  }
}

void Writer::pad_to(uint64_t a) {
  static const uint8_t zeros[64] = {};
  uint64_t n = (a - pos_ % a) % a;
  while (n) {
    const uint64_t k = std::min<uint64_t>(n, sizeof zeros);
    put(zeros, k);
    n -= k;
  }
}

void Writer::begin(const std::string& path) {
  path_ = path;
  f_ = std::fopen(path.c_str(), "wb");
  if (!f_) throw Error(path + ": cannot create: " + std::strerror(errno));
  pos_ = 0;
  put("GGUF", 4);
  const uint32_t version = 3;
  put(&version, 4);
  const uint64_t nt = infos_.size(), nkv = kv_.size();
  put(&nt, 8);
  put(&nkv, 8);
  for (const auto& [k, v] : kv_) {
    put_str(k);
    put_value(v, true);
  }
  for (const TensorInfo& ti : infos_) {
    put_str(ti.name);
    const uint32_t nd = static_cast<uint32_t>(ti.ne.size());
    put(&nd, 4);
    for (int64_t d : ti.ne) {
      const uint64_t u = static_cast<uint64_t>(d);
      put(&u, 8);
    }
    put(&ti.ggml_type, 4);
    put(&ti.offset, 8);
  }
  pad_to(alignment_);
  next_ = 0;
}

void Writer::write_tensor(const void* data, uint64_t nbytes) {
  if (!f_) throw std::logic_error("gguf::Writer: write_tensor before begin");
  if (next_ >= infos_.size()) throw std::logic_error("gguf::Writer: more tensors than declared");
  const TensorInfo& ti = infos_[next_];
  if (nbytes != ti.nbytes || cur_ != 0)
    throw std::logic_error("gguf::Writer: tensor '" + ti.name + "' has " + std::to_string(nbytes) +
                           " bytes, declared " + std::to_string(ti.nbytes));
  if (nbytes == 0) {
    ++next_;
    return;
  }
  write_tensor_data(data, nbytes);
}

void Writer::write_tensor_data(const void* data, uint64_t n) {
  if (!f_) throw std::logic_error("gguf::Writer: write_tensor_data before begin");
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (n) {
    while (next_ < infos_.size() && infos_[next_].nbytes == 0) ++next_;
    if (next_ >= infos_.size()) throw std::logic_error("gguf::Writer: more data than declared");
    const TensorInfo& ti = infos_[next_];
    if (cur_ == 0) pad_to(alignment_);
    const uint64_t k = std::min(n, ti.nbytes - cur_);
    put(p, k);
    p += k;
    n -= k;
    cur_ += k;
    if (cur_ == ti.nbytes) {
      ++next_;
      cur_ = 0;
    }
  }
}

void Writer::finish() {
  if (!f_) throw std::logic_error("gguf::Writer: finish before begin");
  while (next_ < infos_.size() && infos_[next_].nbytes == 0 && cur_ == 0) ++next_;
  if (next_ != infos_.size())
    throw std::logic_error("gguf::Writer: " + std::to_string(infos_.size() - next_) +
                           " declared tensors were not written");
  std::FILE* f = f_;
  f_ = nullptr;
  if (std::fflush(f) != 0 || std::ferror(f)) {
    std::fclose(f);
    throw Error(path_ + ": write failed: " + std::strerror(errno));
  }
  if (std::fclose(f) != 0) throw Error(path_ + ": write failed: " + std::strerror(errno));
}

}  // namespace dory::gguf
