// Choosing a backend: which ones this binary has, and opening one for a model.
#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#include "dory/backend.h"
#include "dory/error.h"

namespace dory {

namespace {
// What --device cuda says in a build without a GPU backend. (The CUDA backend is not written
// yet; once it is, this names the CMake switch that builds it.)
constexpr const char* kNoCuda =
    "this dory has no CUDA backend (none is written yet: the GPU work is planned); "
    "--device cpu or auto run on the CPU";
}  // namespace

std::vector<std::string> compiled_backends() {
  return {"cpu"};
}

std::vector<std::string> backend_report() {
  return {"cpu: yes", std::string("cuda: no, ") + kNoCuda};
}

void check_device(const BackendOptions& opts) {
  if (opts.device == Device::Cuda) throw Error(std::string("--device cuda: ") + kNoCuda);
}

int default_host_threads() {
  return ThreadPool::default_threads();
}

std::shared_ptr<Backend> open_backend(std::shared_ptr<const Model> model,
                                      const BackendOptions& opts) {
  if (!model) throw Error("open_backend: no model");
  check_device(opts);  // Auto and Cpu: no GPU backend in this build, the CPU
  return std::make_shared<CpuBackend>(std::move(model), opts.threads);
}

}  // namespace dory
