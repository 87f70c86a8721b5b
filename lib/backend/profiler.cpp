#include "backend/profiler.h"

#if defined(PL_WITH_CUDA)
#include "backend/cuda/cuda_profiler.h"
#endif

namespace pl {

#if defined(PL_WITH_CUDA)

void profiler_start(Device device) {
  if (device == Device::CUDA) cuda::profiler_start();
}

void profiler_stop(Device device) {
  if (device == Device::CUDA) cuda::profiler_stop();
}

#else

// A build without the CUDA backend never runs on a GPU (opening one fails first): nothing to bracket.
void profiler_start(Device) {}
void profiler_stop(Device) {}

#endif

}  // namespace pl
