#pragma once
// Megatron's --profile window for the CUDA profilers: cudaProfilerStart / cudaProfilerStop
// (cuda_profiler_api.h), which is what `nsys profile --capture-range=cudaProfilerApi` and
// `ncu --profile-from-start off` wait for. The trainer calls them at the --profile-step-start /
// --profile-step-end iterations (config/train_config.h says which). A failure is one pl::Error line
// naming the call and CUDA's error string. On the CPU both are no-ops.
#include "core/tensor.h"

namespace pl {

void profiler_start(Device device);
void profiler_stop(Device device);

}  // namespace pl
