// Where a model runs: a backend (the CPU, or a GPU where the binary has one) holding the
// model's weights in its memory and doing its passes. Sessions of one backend share it.
#pragma once
#include <memory>

#include "dory/model.h"
#include "dory/options.h"

namespace dory {

class Backend;  // the interface: src/backend/backend.h

// Opens the backend opts.device names for `model`. Auto: the GPU when the binary has a
// GPU backend and a device is present, else the CPU. Throws Error when the device asked
// for is not there (a build without CUDA says how to build with it).
std::shared_ptr<Backend> open_backend(std::shared_ptr<const Model> model,
                                      const BackendOptions& opts = {});
// The same check open_backend makes of the device, before a model is loaded (a slow load
// should not come before "this build has no CUDA").
void check_device(const BackendOptions& opts);
// Host threads when none are asked for: the cores this process may use.
int default_host_threads();

}  // namespace dory
