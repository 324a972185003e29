#include "runtime/npy.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "dory/error.h"

namespace dory {

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? ", " : "");
    n *= shape[i];
  }
  dict += "), }";
  const size_t pre = 10;  // magic(6) + version(2) + header length(2)
  size_t total = pre + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw Error(path + ": cannot write: " + std::strerror(errno));
  const uint16_t hlen = static_cast<uint16_t>(dict.size());
  const char head[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  f.write(head, 8);
  const char hl[2] = {static_cast<char>(hlen & 0xff), static_cast<char>(hlen >> 8)};
  f.write(hl, 2);
  f.write(dict.data(), dict.size());
  f.write(reinterpret_cast<const char*>(data), n * sizeof(float));
  if (!f) throw Error(path + ": write failed");
}

std::vector<float> read_npy_f32(const std::string& path, std::vector<int64_t>* shape) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open");
  char head[10];
  if (!f.read(head, 10) || std::memcmp(head, "\x93NUMPY", 6) != 0)
    throw Error(path + ": not a .npy file");
  const size_t hlen = static_cast<uint8_t>(head[8]) | (static_cast<uint8_t>(head[9]) << 8);
  std::string dict(hlen, '\0');
  if (!f.read(dict.data(), hlen)) throw Error(path + ": truncated .npy header");
  if (dict.find("'<f4'") == std::string::npos) throw Error(path + ": not float32 little-endian");
  shape->clear();
  size_t p = dict.find("'shape': (");
  if (p == std::string::npos) throw Error(path + ": no shape in .npy header");
  p += 10;
  int64_t n = 1;
  while (p < dict.size() && dict[p] != ')') {
    if (dict[p] >= '0' && dict[p] <= '9') {
      size_t q = p;
      int64_t d = std::stoll(dict.substr(p), &q);
      shape->push_back(d);
      n *= d;
      p += q;
    } else {
      ++p;
    }
  }
  std::vector<float> v(n);
  if (!f.read(reinterpret_cast<char*>(v.data()), n * sizeof(float)))
    throw Error(path + ": truncated .npy data");
  return v;
}

}  // namespace dory
