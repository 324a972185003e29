// Choosing a backend: which ones this binary has, and opening one for a model.
#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#ifdef DORY_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "dory/backend.h"
#include "dory/error.h"

namespace dory {

#ifndef DORY_HAVE_CUDA
namespace {
// What --device cuda says in a build without the CUDA backend.
constexpr const char* kNoCuda =
    "this dory was built without the CUDA backend (install the CUDA toolkit, then cmake -S . -B build "
    "-DDORY_CUDA=ON; see the README's \"GPU\" section); --device cpu or auto run on the CPU";
}  // namespace
#endif

std::vector<std::string> compiled_backends() {
#ifdef DORY_HAVE_CUDA
  return {"cuda", "cpu"};
#else
  return {"cpu"};
#endif
}

std::vector<std::string> backend_report() {
#ifdef DORY_HAVE_CUDA
  return {"cpu: yes", "cuda: yes, " + cuda_device_report()};
#else
  return {"cpu: yes", std::string("cuda: no, ") + kNoCuda};
#endif
}

void check_device(const BackendOptions& opts) {
#ifdef DORY_HAVE_CUDA
  if (opts.device == Device::Cuda && cuda_device_count() == 0)
    throw Error("--device cuda: no CUDA device found (is the NVIDIA driver loaded and a GPU visible?)");
#else
  if (opts.device == Device::Cuda) throw Error(std::string("--device cuda: ") + kNoCuda);
#endif
}

void Backend::probe(std::span<const int64_t>, float*) {
  throw Error(std::string("--skill-dynamic: the ") + name() +
              " backend does not read hidden states token by token yet (run it with --device cpu)");
}

int default_host_threads() { return ThreadPool::default_threads(); }

std::shared_ptr<Backend> open_backend(std::shared_ptr<const Model> model, const BackendOptions& opts) {
  if (!model) throw Error("open_backend: no model");
  check_device(opts);
#ifdef DORY_HAVE_CUDA
  // Auto: the GPU when one is there.
  if (opts.device == Device::Cuda || (opts.device == Device::Auto && cuda_device_count() > 0))
    return std::make_shared<CudaBackend>(std::move(model), opts.threads);
#endif
  return std::make_shared<CpuBackend>(std::move(model), opts.threads);
}

}  // namespace dory
