#pragma once
// Helpers shared by the hand-written CUDA ops (embedding, rmsnorm, rope, swiglu, elementwise,
// cross_entropy, optimizer): argument checks that fail with one line naming the op, the argument,
// its shape, dtype and device; bf16 loads/stores through the shared numerics (so rounding is the
// CPU's num::round_bf16); a grow-only device scratch.
// Plain C++17 + CUDA (no fmt, no core/error.h): included by .cu files only.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "core/tensor.h"
#include "numerics/bf16.h"

namespace pl::cuda {

// ---- argument checks --------------------------------------------------------------------------

inline std::string describe(const Tensor& t) { return t.shape_str() + " (" + device_name(t.device) + ")"; }

inline void require(bool ok, const char* op, const std::string& message) {
  if (!ok) throw_error(std::string(op) + ": " + message);
}

// t must be a CUDA tensor of dtype `dtype` with exactly `ndim` dimensions (any when ndim < 0) and
// storage when it has elements.
inline void check_arg(const char* op, const char* name, const Tensor& t, DType dtype, int ndim = -1) {
  const bool ok = t.device == Device::CUDA && t.dtype == dtype && (ndim < 0 || t.ndim == ndim) &&
                  (t.data != nullptr || t.numel() == 0);
  if (ok) return;
  std::string want = ndim < 0 ? std::string("a") : std::string("a ") + std::to_string(ndim) + "-D";
  want += std::string(" ") + dtype_name(dtype) + " cuda tensor with storage";
  require(false, op, std::string(name) + " " + describe(t) + " must be " + want);
}

// As check_arg, with two admissible dtypes (e.g. a param that is BF16 weights or F32).
inline void check_arg2(const char* op, const char* name, const Tensor& t, DType a, DType b) {
  if (t.dtype == b) return check_arg(op, name, t, b);
  if (t.dtype == a) return check_arg(op, name, t, a);
  require(false, op, std::string(name) + " " + describe(t) + " must be a " + dtype_name(a) + " or " +
                         dtype_name(b) + " cuda tensor");
}

// ---- bf16 storage --------------------------------------------------------------------------------
// BF16 tensors hold raw bf16 bits (uint16_t); conversions are the shared numerics, bit-exact with
// the CPU backend's round_bf16.
__device__ __forceinline__ float load_bf16(const uint16_t* p, int64_t i) { return num::bf16_bits_to_float(p[i]); }
__device__ __forceinline__ void store_bf16(uint16_t* p, int64_t i, float v) { p[i] = num::float_to_bf16_bits(v); }

inline const uint16_t* bf16_in(const Tensor& t) { return static_cast<const uint16_t*>(t.data); }
inline uint16_t* bf16_out(const Tensor& t) { return static_cast<uint16_t*>(t.data); }
inline const float* f32_in(const Tensor& t) { return static_cast<const float*>(t.data); }
inline float* f32_out(const Tensor& t) { return static_cast<float*>(t.data); }
inline const int32_t* i32_in(const Tensor& t) { return static_cast<const int32_t*>(t.data); }

// ---- launch shapes ---------------------------------------------------------------------------------
// Elementwise kernels use grid-stride loops; the grid is capped so any n fits the grid limits.
inline unsigned grid_capped(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < (int64_t{1} << 20) ? blocks : (int64_t{1} << 20));
}

// ---- grow-only device scratch ----------------------------------------------------------------------
// One per call site, kept in a function-static: it allocates only when a larger size is asked for
// (so after the first training step no allocation happens) and is never freed per call. Growing frees
// the old buffer first, so inside the device arena the new one can take the old space (the arena
// reuses freed blocks, core/tensor.h): a scratch that grows does not leak arena space. That is safe
// with work still queued: everything runs on the default stream, in order.
class DeviceScratch {
 public:
  void* get(size_t bytes) {
    if (bytes > buf_.bytes()) {
      buf_ = Buffer();
      buf_ = Buffer(bytes, Device::CUDA);
    }
    return buf_.data();
  }

 private:
  Buffer buf_;
};

inline size_t align_up(size_t bytes, size_t alignment = 256) { return (bytes + alignment - 1) / alignment * alignment; }

}  // namespace pl::cuda
