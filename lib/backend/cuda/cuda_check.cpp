#include "backend/cuda/cuda_check.h"

#include <fmt/format.h>

#include "backend/cuda/device_state.h"
#include "core/error.h"

namespace pl::cuda {

void check_launch(const DeviceState& state, const char* op, const std::string& what) {
  check(cudaGetLastError(), op, what);
  if (state.sync_every_launch) sync_after_launch(op, what);
}

void sync_after_launch(const char* op, const std::string& what) {
  const cudaError_t st = cudaDeviceSynchronize();
  if (st == cudaSuccess) return;
  throw_error(std::string(op) + " " + what + ": asynchronous CUDA fault found by --cuda-sync-every-launch right after "
              "this op: " + cudaGetErrorName(st) + ": " + cudaGetErrorString(st));
}

void throw_error(const std::string& message) { throw Error(message); }

void check(cudaError_t st, const char* op, const std::string& what) {
  if (st == cudaSuccess) return;
  throw_error(std::string(op) + " " + what + ": CUDA error " + cudaGetErrorName(st) + ": " + cudaGetErrorString(st));
}

void check(cublasStatus_t st, const char* op, const std::string& what) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  throw_error(std::string(op) + " " + what + ": cuBLASLt error " + cublasLtGetStatusName(st) + ": " +
              cublasLtGetStatusString(st));
}

void check(cudnnStatus_t st, const char* op, const std::string& what) {
  if (st == CUDNN_STATUS_SUCCESS) return;
  throw_error(std::string(op) + " " + what + ": cuDNN error " + std::to_string(static_cast<int>(st)) + ": " +
              cudnnGetErrorString(st));
}

std::string dims(int64_t a, int64_t b) { return fmt::format("[{}, {}]", a, b); }
std::string dims(int64_t a, int64_t b, int64_t c) { return fmt::format("[{}, {}, {}]", a, b, c); }

}  // namespace pl::cuda
