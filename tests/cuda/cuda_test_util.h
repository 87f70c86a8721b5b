#pragma once
// Helpers for the GPU conformance tests: skip without a device, move host data to device tensors of
// a given dtype (BF16 values rounded RNE with the shared numerics, as the CPU backend rounds) and back.
// Compiles in every build; the device calls only run after PL_REQUIRE_CUDA_DEVICE() passed.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "backend/ops.h"
#if defined(PL_WITH_CUDA)
#include "backend/cuda/device_state.h"
#endif
#include "core/tensor.h"
#include "numerics/bf16.h"

namespace pl::test {

#define PL_REQUIRE_CUDA_DEVICE()                                                        \
  do {                                                                                 \
    std::string why_;                                                                  \
    if (::pl::cuda_device_count(&why_) == 0) GTEST_SKIP() << "no CUDA device: " << why_; \
  } while (0)

// A context on the test process's one GPU device state, opened on first use and kept to the end of
// the process (released on purpose: tearing cuDNN and cuBLASLt down after the CUDA runtime's own
// exit-time teardown is not safe). Tests flip its switches (ForceEmulated) and restore them. Without
// a GPU the state is null: the argument checks still run (they come first), the ops then fail.
inline OpContext cuda_ctx() {
  static cuda::DeviceState* const state =
      cuda_device_count() > 0 ? open_device_state(Device::CUDA).release() : nullptr;
  OpContext c;
  c.device = Device::CUDA;
  c.gpu = state;
  return c;
}

#if defined(PL_WITH_CUDA)
// While alive, every quantized GEMM on the test GPU takes the emulated path even where the native one
// exists (DeviceState::force_emulated_gemm), so one GPU checks both paths.
struct ForceEmulated {
  explicit ForceEmulated(bool on) { cuda_ctx().gpu->force_emulated_gemm = on; }
  ~ForceEmulated() { cuda_ctx().gpu->force_emulated_gemm = false; }
  ForceEmulated(const ForceEmulated&) = delete;
  ForceEmulated& operator=(const ForceEmulated&) = delete;
};
#endif

// A device tensor that owns its memory.
struct DeviceTensor {
  Buffer buf;
  Tensor t;
};

inline DeviceTensor device_tensor(std::initializer_list<int64_t> shape, DType dtype) {
  Tensor probe(nullptr, shape, dtype, Device::CUDA);
  DeviceTensor d{Buffer(probe.bytes() > 0 ? probe.bytes() : 1, Device::CUDA), probe};
  d.t.data = d.buf.data();
  return d;
}

// host floats -> device tensor of dtype F32 or BF16 (values rounded to BF16 RNE).
inline DeviceTensor to_device(const std::vector<float>& host, std::initializer_list<int64_t> shape, DType dtype) {
  DeviceTensor d = device_tensor(shape, dtype);
  if (dtype == DType::BF16) {
    std::vector<uint16_t> bits(host.size());
    for (size_t i = 0; i < host.size(); ++i) bits[i] = num::float_to_bf16_bits(host[i]);
    copy_from_host(d.t, bits.data());
  } else {
    copy_from_host(d.t, host.data());
  }
  return d;
}

inline DeviceTensor to_device_i32(const std::vector<int32_t>& host, std::initializer_list<int64_t> shape) {
  DeviceTensor d = device_tensor(shape, DType::I32);
  copy_from_host(d.t, host.data());
  return d;
}

inline DeviceTensor to_device_u8(const std::vector<uint8_t>& host, std::initializer_list<int64_t> shape) {
  DeviceTensor d = device_tensor(shape, DType::U8);
  copy_from_host(d.t, host.data());
  return d;
}

// device tensor (F32 or BF16) -> host floats
inline std::vector<float> to_host_floats(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::BF16) {
    std::vector<uint16_t> bits(out.size());
    copy_to_host(bits.data(), t);
    for (size_t i = 0; i < out.size(); ++i) out[i] = num::bf16_bits_to_float(bits[i]);
  } else {
    copy_to_host(out.data(), t);
  }
  return out;
}

inline std::vector<uint8_t> to_host_bytes(const Tensor& t) {
  std::vector<uint8_t> out(t.bytes());
  copy_to_host(out.data(), t);
  return out;
}

// A host FP32 tensor view over a vector (the CPU side of a comparison).
inline Tensor host_view(std::vector<float>& v, std::initializer_list<int64_t> shape) {
  return Tensor(v.data(), shape, DType::F32, Device::CPU);
}

// Cheap BF16 pseudo-Gaussians for production-size tensors (a sum of four 16-bit uniforms of a 64-bit
// hash, variance 1) with one outlier (x40) every 9973 elements: mt19937 would take seconds there.
inline std::vector<float> fast_bf16(int64_t n, float scale, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint64_t z = seed + static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    float u = 0.0f;
    for (int k = 0; k < 4; ++k) u += static_cast<float>((z >> (16 * k)) & 0xFFFFu) * (1.0f / 65536.0f);
    float g = (u - 2.0f) * 1.7320508f * scale;
    if (i % 9973 == 17) g *= 40.0f;
    v[static_cast<size_t>(i)] = num::round_bf16(g);
  }
  return v;
}

}  // namespace pl::test
