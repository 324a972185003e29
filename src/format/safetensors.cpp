#include "format/safetensors.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <vector>

#include "dory/error.h"

namespace dory {

namespace {
constexpr uint64_t kMaxHeader = 100ull << 20;  // the format's own limit is 100 MB
}

SafeTensorsFile::SafeTensorsFile(const std::string& path)
    : map_(std::make_unique<MappedFile>(path)), name_(path) {
  parse(map_->data(), map_->size());
}

SafeTensorsFile::SafeTensorsFile(const uint8_t* data, uint64_t size, const std::string& name)
    : name_(name) {
  parse(data, size);
}

void SafeTensorsFile::parse(const uint8_t* bytes, uint64_t size) {
  size_ = size;
  const std::string& path = name_;
  if (size < 8) throw Error(path + ": truncated safetensors file (" + std::to_string(size) +
                            " bytes, no header length)");
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | bytes[i];
  if (hlen > kMaxHeader)
    throw Error(path + ": safetensors header length " + std::to_string(hlen) +
                " is larger than the 100 MB limit (not a safetensors file?)");
  if (hlen > size - 8)
    throw Error(path + ": truncated safetensors file: header says " + std::to_string(hlen) +
                " header bytes, file has " + std::to_string(size - 8) + " after the length");
  const char* hbeg = reinterpret_cast<const char*>(bytes + 8);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(hbeg, hbeg + hlen);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": safetensors header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) throw Error(path + ": safetensors header is not a JSON object");

  const uint64_t data_size = size - 8 - hlen;
  const uint8_t* data = bytes + 8 + hlen;
  struct Range {
    uint64_t b, e;
    const std::string* name;
  };
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") continue;
    const auto& t = it.value();
    auto bad = [&](const std::string& why) {
      return Error(path + ": tensor '" + name + "': " + why);
    };
    if (!t.is_object()) throw bad("header entry is not an object");
    if (!t.contains("dtype") || !t["dtype"].is_string()) throw bad("missing dtype");
    if (!t.contains("shape") || !t["shape"].is_array()) throw bad("missing shape");
    if (!t.contains("data_offsets") || !t["data_offsets"].is_array() ||
        t["data_offsets"].size() != 2)
      throw bad("missing data_offsets [begin, end]");
    TensorView v;
    v.name = name;
    const std::string dt = t["dtype"].get<std::string>();
    if (!parse_safetensors_dtype(dt, &v.dtype))
      throw bad("unsupported dtype '" + dt + "' (expected BF16, F16 or F32)");
    uint64_t numel = 1;
    for (const auto& d : t["shape"]) {
      if (!d.is_number_unsigned()) throw bad("shape has a non-integer or negative dimension");
      uint64_t di = d.get<uint64_t>();
      if (di > (1ull << 40) || (di && numel > (1ull << 40) / di))
        throw bad("shape " + t["shape"].dump() + " is absurdly large");
      numel *= di;
      v.shape.push_back(static_cast<int64_t>(di));
    }
    const auto& off = t["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw bad("data_offsets are not non-negative integers");
    const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (b > e) throw bad("data_offsets begin " + std::to_string(b) + " > end " + std::to_string(e));
    if (e > data_size)
      throw bad("data_offsets end " + std::to_string(e) + " lies beyond the data section (" +
                std::to_string(data_size) + " bytes): file truncated or header wrong");
    const uint64_t want = numel * dtype_size(v.dtype);
    if (e - b != want)
      throw bad("data_offsets span " + std::to_string(e - b) + " bytes but shape " +
                shape_str(v.shape) + " of " + dt + " needs " + std::to_string(want));
    v.data = data + b;
    auto [pos, inserted] = tensors_.emplace(name, std::move(v));
    (void)inserted;
    ranges.push_back({b, e, &pos->first});
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.b < b.b; });
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].b < ranges[i - 1].e)
      throw Error(path + ": tensors '" + *ranges[i - 1].name + "' and '" + *ranges[i].name +
                  "' overlap in the data section");
}

}  // namespace dory
