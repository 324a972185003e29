#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dory {

// Writes a little-endian float32 .npy (format 1.0). Hand-written: the format
// is a short text header plus raw data, and Debian packages no C++ writer.
void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);

// Reads a float32 .npy back (tests).
std::vector<float> read_npy_f32(const std::string& path, std::vector<int64_t>* shape);

}  // namespace dory
