#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace dory {

enum class DType : uint8_t { F32, F16, BF16 };

const char* dtype_name(DType t);
int dtype_size(DType t);
// Parses a safetensors dtype string ("BF16", "F16", "F32"); false if unsupported.
bool parse_safetensors_dtype(const std::string& s, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float f16_to_f32(uint16_t h);

// A typed, row-major view into mapped memory (or owned storage elsewhere).
struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;

  int64_t numel() const;
  int64_t rows() const { return shape.empty() ? 1 : shape[0]; }
  int64_t cols() const { return shape.size() < 2 ? (shape.empty() ? 1 : shape[0]) : shape[1]; }
  uint64_t nbytes() const { return static_cast<uint64_t>(numel()) * dtype_size(dtype); }
  // Converts element range [i0, i0+n) to float.
  void to_f32(int64_t i0, int64_t n, float* out) const;
  std::vector<float> to_f32() const;
};

std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace dory
