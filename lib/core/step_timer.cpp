#include "core/step_timer.h"

#include <cstdio>

#include "core/error.h"

#if defined(PL_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace pl {

#if defined(PL_WITH_CUDA)
namespace {
void check(cudaError_t st, const char* what) {
  PL_CHECK(st == cudaSuccess, "{} failed: {}", what, cudaGetErrorString(st));
}
}  // namespace
#endif

StepTimer::StepTimer(Device device) : device_(device) {
#if defined(PL_WITH_CUDA)
  if (device_ == Device::CUDA) {
    cudaEvent_t a, b;
    check(cudaEventCreate(&a), "cudaEventCreate (step timer)");
    check(cudaEventCreate(&b), "cudaEventCreate (step timer)");
    start_event_ = a;
    stop_event_ = b;
  }
#endif
}

StepTimer::~StepTimer() {
#if defined(PL_WITH_CUDA)
  // A destructor must not throw: a failure is reported on stderr, one line.
  for (void* e : {start_event_, stop_event_})
    if (e) {
      const cudaError_t st = cudaEventDestroy(static_cast<cudaEvent_t>(e));
      if (st != cudaSuccess)
        std::fprintf(stderr, "pretrain_llama: warning: cudaEventDestroy failed: %s\n", cudaGetErrorString(st));
    }
#endif
}

void StepTimer::start() {
#if defined(PL_WITH_CUDA)
  if (device_ == Device::CUDA) {
    check(cudaEventRecord(static_cast<cudaEvent_t>(start_event_)), "cudaEventRecord (step start)");
    return;
  }
#endif
  t0_ = std::chrono::steady_clock::now();
}

double StepTimer::stop_seconds() {
#if defined(PL_WITH_CUDA)
  if (device_ == Device::CUDA) {
    auto* a = static_cast<cudaEvent_t>(start_event_);
    auto* b = static_cast<cudaEvent_t>(stop_event_);
    check(cudaEventRecord(b), "cudaEventRecord (step stop)");
    check(cudaEventSynchronize(b), "cudaEventSynchronize (step stop)");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    return ms / 1000.0;
  }
#endif
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

DeviceMemoryInfo device_memory_info(Device device) {
  DeviceMemoryInfo m;
#if defined(PL_WITH_CUDA)
  if (device == Device::CUDA) check(cudaMemGetInfo(&m.free, &m.total), "cudaMemGetInfo");
#else
  (void)device;
#endif
  return m;
}

}  // namespace pl
