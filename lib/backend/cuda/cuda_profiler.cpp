#include "backend/cuda/cuda_profiler.h"

#include <cuda_profiler_api.h>

#include "backend/cuda/cuda_check.h"

namespace pl::cuda {

// Both calls act on the current device's context; the run has made its GPU current before training.
void profiler_start() { check(cudaProfilerStart(), "cudaProfilerStart", "(--profile-step-start)"); }

void profiler_stop() { check(cudaProfilerStop(), "cudaProfilerStop", "(--profile-step-end)"); }

}  // namespace pl::cuda
