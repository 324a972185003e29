// cuBLAS for the prompts' BF16 products, loaded at run time (dlopen): the binary keeps no
// link-time dependency on the library (hundreds of MB, not on every machine that has a GPU
// driver), and where it is missing the backend's own tensor-core kernels run. On by default
// since the A/B against k_lin_tc (scripts/dev/gpu_int8_ab.sh, docs/cuda.md; DORY_CUDA_CUBLAS=0
// turns it off).
// Why a library here: a GEMM at this size is what cuBLAS's Hopper kernels (wgmma, TMA) do best,
// and writing those by hand is the alternative in docs/cuda.md's list.
#include "backend/cuda/cublas.h"

#include <cublas_v2.h>
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "dory/error.h"

namespace dory::cuda {
namespace {

// The C API's signatures (cublasGemmEx has C++ overloads, so no decltype of it).
using CreateFn = cublasStatus_t (*)(cublasHandle_t*);
using SetStreamFn = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
using GemmFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                  const void*, const void*, cudaDataType, int, const void*, cudaDataType, int,
                                  const void*, void*, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);

struct Lib {
  void* so = nullptr;
  cublasHandle_t handle = nullptr;
  CreateFn create = nullptr;
  SetStreamFn set_stream = nullptr;
  GemmFn gemm = nullptr;
  std::string why;  // why it is not there
};

Lib& lib() {
  static Lib L;
  static std::once_flag once;
  std::call_once(once, [] {
    // The loader's path first, then the toolkit's usual folders ($CUDA_HOME, /usr/local/cuda).
    std::vector<std::string> names;
    for (const char* v : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}) names.push_back(v);
    for (const char* env : {"CUDA_HOME", "CUDA_PATH"})
      if (const char* d = std::getenv(env))
        for (const char* sub : {"/lib64/libcublas.so", "/lib/libcublas.so"}) names.push_back(std::string(d) + sub);
    for (const char* f : {"/usr/local/cuda/lib64/libcublas.so", "/usr/local/cuda/lib/libcublas.so"}) names.push_back(f);
    for (const std::string& name : names) {
      L.so = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (L.so) break;
    }
    if (!L.so) {
      L.why = "libcublas.so not found (LD_LIBRARY_PATH, $CUDA_HOME, /usr/local/cuda)";
      return;
    }
    L.create = reinterpret_cast<decltype(L.create)>(dlsym(L.so, "cublasCreate_v2"));
    L.set_stream = reinterpret_cast<decltype(L.set_stream)>(dlsym(L.so, "cublasSetStream_v2"));
    L.gemm = reinterpret_cast<decltype(L.gemm)>(dlsym(L.so, "cublasGemmEx"));
    if (!L.create || !L.set_stream || !L.gemm) {
      L.why = "libcublas lacks cublasCreate_v2 / cublasSetStream_v2 / cublasGemmEx";
      L.gemm = nullptr;
      return;
    }
    if (L.create(&L.handle) != CUBLAS_STATUS_SUCCESS) {
      L.why = "cublasCreate failed";
      L.gemm = nullptr;
    }
  });
  return L;
}

}  // namespace

bool cublas_available(std::string* why) {
  Lib& L = lib();
  if (why) *why = L.why;
  return L.gemm != nullptr;
}

void cublas_gemm_bf16(const void* w, int64_t rows, int64_t cols, const void* x, int64_t T, float* y,
                      void* stream) {
  Lib& L = lib();
  if (!L.gemm) throw Error("CUDA: cuBLAS: " + L.why);
  if (L.set_stream(L.handle, static_cast<cudaStream_t>(stream)) != CUBLAS_STATUS_SUCCESS)
    throw Error("CUDA: cuBLAS: cublasSetStream failed");
  // Row-major Y [T][rows] = X [T][cols] W^T, W [rows][cols]: in cuBLAS's column-major terms
  // Y^T (rows x T, ld rows) = W^T (op T of a cols x rows matrix, ld cols) X^T (cols x T, ld cols).
  const float one = 1.0f, zero = 0.0f;
  const cublasStatus_t st =
      L.gemm(L.handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(T), static_cast<int>(cols),
             &one, w, CUDA_R_16BF, static_cast<int>(cols), x, CUDA_R_16BF, static_cast<int>(cols), &zero, y,
             CUDA_R_32F, static_cast<int>(rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) throw Error("CUDA: cuBLAS: cublasGemmEx failed (status " + std::to_string(st) + ")");
}

}  // namespace dory::cuda
