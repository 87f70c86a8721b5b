#pragma once
// cudaProfilerStart / cudaProfilerStop, checked (backend/profiler.h is the dispatching side).
namespace pl::cuda {

void profiler_start();
void profiler_stop();

}  // namespace pl::cuda
