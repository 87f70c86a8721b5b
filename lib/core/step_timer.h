#pragma once
// Wall time of a piece of work on a device: CUDA events recorded on the default stream around it
// (so queued GPU work is included, not just the host's launches), a steady clock on the CPU. Defined
// in timers.cpp, beside Megatron's timers, which measure the same way.
#include <chrono>

#include "core/tensor.h"

namespace pl {

class StepTimer {
 public:
  explicit StepTimer(Device device);
  ~StepTimer();
  StepTimer(const StepTimer&) = delete;
  StepTimer& operator=(const StepTimer&) = delete;
  void start();
  double stop_seconds();  // waits for the device to reach the stop event

 private:
  Device device_;
  void* start_event_ = nullptr;
  void* stop_event_ = nullptr;
  std::chrono::steady_clock::time_point t0_;
};

// Device memory in use and total, from the driver (cudaMemGetInfo); {0, 0} on the CPU.
struct DeviceMemoryInfo {
  size_t free = 0, total = 0;
};
DeviceMemoryInfo device_memory_info(Device device);

}  // namespace pl
