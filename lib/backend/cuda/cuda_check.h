#pragma once
// Checked CUDA / cuBLASLt / cuDNN calls. Every failure throws pl::Error with one line naming the op,
// its shapes (the `what` text) and the library's own status name and string. Plain C++ (no fmt), so
// .cu files compiled by nvcc include it.
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstdint>
#include <string>

namespace pl::cuda {

[[noreturn]] void throw_error(const std::string& message);  // throws pl::Error (cuda_check.cpp)

void check(cudaError_t st, const char* op, const std::string& what);
void check(cublasStatus_t st, const char* op, const std::string& what);
void check(cudnnStatus_t st, const char* op, const std::string& what);

// "[a, b]" for error messages.
std::string dims(int64_t a, int64_t b);
std::string dims(int64_t a, int64_t b, int64_t c);

// The synchronizing half of check_launch: cudaDeviceSynchronize, failing with the op and its shapes.
void sync_after_launch(const char* op, const std::string& what);

struct DeviceState;  // device_state.h
// After a kernel launch (or a library call that launches work): the launch error (bad configuration)
// names the kernel and its shape; with state.sync_every_launch (--cuda-sync-every-launch), so does an
// asynchronous fault, found by waiting for the device right after the op.
void check_launch(const DeviceState& state, const char* op, const std::string& what);

// Blocks of `threads` covering n items.
inline unsigned grid_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace pl::cuda
