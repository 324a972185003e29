// cuBLAS for the prompts' BF16 products, loaded at run time (cublas.cpp says why and how).
#pragma once
#include <cstdint>
#include <string>

namespace dory::cuda {

// Whether libcublas could be loaded (and why not, into *why).
bool cublas_available(std::string* why = nullptr);
// Row-major Y [T][rows] = X [T][cols] W^T: W and X bf16, Y float, float accumulation, on
// `stream` (a cudaStream_t). Throws when cuBLAS is not there or fails.
void cublas_gemm_bf16(const void* w, int64_t rows, int64_t cols, const void* x, int64_t T, float* y,
                      void* stream);

}  // namespace dory::cuda
