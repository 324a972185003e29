#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace dory {

// Element types of weight tensors. The float types come first (values fixed:
// F32, F16, BF16); the quantized ones are ggml's block types in ggml's exact
// byte layouts (tensor/quant.h), so GGUF data is used in place.
enum class DType : uint8_t { F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K };

// Everything the engine knows about a dtype, in one row of one table (dtype.cpp): the
// converters, the GGUF reader and writer, the safetensors reader and the kernels read it
// rather than switching on the type.
struct DTypeTraits {
  DType type;
  const char* name;         // "Q4_K": dory info, errors, --type lists
  int block_elems;          // 1 for the float types, 32 (Q8_0, Q4_0), 256 (K types)
  int block_bytes;          // bytes per block (per element for the float types)
  uint32_t ggml_id;         // the GGUF tensor type (ggml's enum)
  const char* safetensors;  // the safetensors dtype string, or nullptr: not in safetensors
  bool quantized;           // a block type: products quantize their input to int8
  // Whole blocks of n elements to float / from float (tensor/quant.h: ggml's bits).
  void (*dequantize)(const void* src, float* dst, int64_t n);
  void (*quantize)(const float* src, void* dst, int64_t n);
  // Which CPU kernels run it (kernels.h), for dory info and the docs.
  const char* kernels;
};
// The row of t; every DType has one.
const DTypeTraits& dtype_traits(DType t);
// The whole table, in DType order.
const std::vector<DTypeTraits>& all_dtypes();
// The type whose GGUF id / safetensors string is `id`; nullptr when none.
const DTypeTraits* dtype_from_ggml_id(uint32_t id);

const char* dtype_name(DType t);
// Bytes per element of a float type (4 or 2). Quantized types have no
// per-element size: it throws std::logic_error for them; use row_bytes().
int dtype_size(DType t);
bool dtype_is_quantized(DType t);
// Elements per block: 1 for the float types, 32 (Q8_0, Q4_0), 256 (K types).
int dtype_block_elems(DType t);
// Bytes per block: 4/2/2 for F32/F16/BF16; 34, 18, 144, 176, 210 for Q8_0, Q4_0,
// Q4_K, Q5_K, Q6_K.
int dtype_block_bytes(DType t);
// True when a row of `cols` elements is whole blocks of t.
bool dtype_row_ok(DType t, int64_t cols);
// Bytes of one row of `cols` elements (cols must be whole blocks: throws
// std::invalid_argument otherwise).
uint64_t row_bytes(DType t, int64_t cols);
// Bytes of a row-major tensor: product of the leading dims x row_bytes(last dim).
uint64_t tensor_bytes(DType t, const std::vector<int64_t>& shape);
// Parses a safetensors dtype string ("BF16", "F16", "F32"); false if unsupported.
bool parse_safetensors_dtype(const std::string& s, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float f16_to_f32(uint16_t h);
// IEEE half, round to nearest even; overflow gives +-inf, NaN stays NaN.
uint16_t f32_to_f16(float f);

// A typed, row-major view into mapped memory (or owned storage elsewhere).
struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;

  int64_t numel() const;
  int64_t rows() const { return shape.empty() ? 1 : shape[0]; }
  int64_t cols() const { return shape.size() < 2 ? (shape.empty() ? 1 : shape[0]) : shape[1]; }
  uint64_t nbytes() const { return tensor_bytes(dtype, shape); }
  // Converts element range [i0, i0+n) to float (for quantized types i0 and n
  // must be whole blocks).
  void to_f32(int64_t i0, int64_t n, float* out) const;
  std::vector<float> to_f32() const;
};

std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace dory
