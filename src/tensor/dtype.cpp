#include "tensor/dtype.h"

#include <cmath>

namespace dory {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
  }
  return "?";
}

int dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }

bool parse_safetensors_dtype(const std::string& s, DType* out) {
  if (s == "F32") *out = DType::F32;
  else if (s == "F16") *out = DType::F16;
  else if (s == "BF16") *out = DType::BF16;
  else return false;
  return true;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v;
  if (exp == 0) v = std::ldexp(static_cast<float>(man), -24);  // zero / subnormal
  else if (exp == 31) v = man ? NAN : INFINITY;
  else v = std::ldexp(static_cast<float>(man | 0x400), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void TensorView::to_f32(int64_t i0, int64_t n, float* out) const {
  const auto* b = static_cast<const uint8_t*>(data);
  switch (dtype) {
    case DType::F32:
      std::memcpy(out, b + i0 * 4, n * 4);
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, b + (i0 + i) * 2, 2);
        out[i] = bf16_to_f32(h);
      }
      break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, b + (i0 + i) * 2, 2);
        out[i] = f16_to_f32(h);
      }
      break;
  }
}

std::vector<float> TensorView::to_f32() const {
  std::vector<float> v(numel());
  to_f32(0, numel(), v.data());
  return v;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  s += ']';
  return s;
}

}  // namespace dory
