#pragma once
// Helpers for the GPU conformance tests (the Cuda* cases of tests/ops/test_<op>.cpp and tests/cuda/):
// skip without a device, move host data to device tensors of a given dtype (BF16 values rounded RNE
// with the shared numerics, as the CPU backend rounds) and back, fresh seeds, and the comparisons of a
// GPU result with the CPU backend's. Compiles in every build; the device calls only run after
// PL_REQUIRE_CUDA_DEVICE() passed.
// A Cuda* case runs the op on the CPU backend (round_bf16 true, FP32 storage) and on the GPU on the
// same inputs (BF16 inputs are BF16-representable values, so both backends see the same numbers),
// mostly fresh random ones: the seed comes from std::random_device, or from PL_TEST_SEED when set,
// and is printed with every failure. Shapes are odd on purpose (T not a multiple of 32, widths not
// multiples of the block sizes). Each case states whether it is bit-exact (the GPU runs the CPU's
// float operations in the CPU's order, FMA contraction off, through the shared numerics) or within a
// stated tolerance (CUDA's expf/logf are within 1-2 ulp, not correctly rounded).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"
#if defined(PL_WITH_CUDA)
#include "backend/cuda/device_state.h"
#endif
#include "core/tensor.h"
#include "numerics/bf16.h"

#if defined(PL_WITH_CUDA)
#include "backend/cuda/gemm.h"
#endif

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

// While alive, the test GPU runs the reference quantize and expand kernels (DeviceState::
// reference_quantize_kernels, pretrain_llama --quantize-kernels reference) instead of the fast ones.
struct ReferenceQuantizeKernels {
  explicit ReferenceQuantizeKernels(bool on) { cuda_ctx().gpu->reference_quantize_kernels = on; }
  ~ReferenceQuantizeKernels() { cuda_ctx().gpu->reference_quantize_kernels = false; }
  ReferenceQuantizeKernels(const ReferenceQuantizeKernels&) = delete;
  ReferenceQuantizeKernels& operator=(const ReferenceQuantizeKernels&) = delete;
};
#endif

// While alive, the test GPU's attention backward is cuDNN's deterministic one (DeviceState::
// deterministic_attention), so two backward passes over the same inputs give the same bits: what tests
// comparing two GPU runs exactly need. Does nothing without a device.
struct DeterministicAttention {
  DeterministicAttention() { set(true); }
  ~DeterministicAttention() { set(false); }
  DeterministicAttention(const DeterministicAttention&) = delete;
  DeterministicAttention& operator=(const DeterministicAttention&) = delete;

 private:
  static void set(bool on) {
#if defined(PL_WITH_CUDA)
    if (cuda_ctx().gpu) cuda_ctx().gpu->deterministic_attention = on;
#else
    (void)on;
#endif
  }
};

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

// "Adjacent bf16" bound of the tolerance-based comparisons: two bf16 roundings of fp32 values that
// differ by a few fp32 ulp are equal or neighbours, and neighbours differ by one bf16 ulp
// <= 2^-7 * max(|a|, |b|).
constexpr double kBf16Ulp = 0x1p-7;

// A fresh seed per test, reported with every failure of the test (SCOPED_TRACE at the call site).
inline uint32_t fresh_seed() {
  if (const char* s = std::getenv("PL_TEST_SEED")) return static_cast<uint32_t>(std::strtoul(s, nullptr, 10));
  return std::random_device{}();
}
#define PL_SEEDED_RNG(rng)                                                             \
  const uint32_t seed_ = ::pl::test::fresh_seed();                                     \
  SCOPED_TRACE("seed " + std::to_string(seed_) + " (rerun with PL_TEST_SEED=" +        \
               std::to_string(seed_) + ")");                                           \
  std::mt19937 rng(seed_)

inline std::vector<float> uniform_bf16(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = num::round_bf16(d(rng));
  return v;
}

inline std::vector<float> uniform_f32(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline std::vector<int32_t> uniform_ids(size_t n, std::mt19937& rng, int32_t vocab) {
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = d(rng);
  return v;
}

// Bit-for-bit equality of two float vectors (so -0 vs +0 and NaN payloads count).
inline void expect_bits_equal(const std::vector<float>& gpu, const std::vector<float>& cpu, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < gpu.size(); ++i)
    if (num::float_bits(gpu[i]) != num::float_bits(cpu[i]) && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << gpu.size() << " elements differ; first at " << first
                     << ": gpu " << gpu[first] << " cpu " << cpu[first];
}

// |gpu - cpu| <= rel * max(|gpu|, |cpu|) + abs_tol[i] for every element, and at most max_frac of the
// elements differ at all (the bounds allow a rounding to land on a neighbour; a systematic error
// that stays within them would still change many elements).
inline void expect_close_to_cpu(const std::vector<float>& gpu, const std::vector<float>& cpu, double rel,
                                const std::vector<double>& abs_tol, double max_frac, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  ASSERT_EQ(abs_tol.size(), cpu.size()) << what;
  size_t differ = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const double a = gpu[i], b = cpu[i];
    if (num::float_bits(gpu[i]) != num::float_bits(cpu[i])) ++differ;
    const double tol = rel * std::max(std::abs(a), std::abs(b)) + abs_tol[i];
    if (!(std::abs(a - b) <= tol)) {
      ADD_FAILURE() << what << ": element " << i << ": gpu " << a << " cpu " << b << " (|diff| " << std::abs(a - b)
                    << " > tol " << tol << ")";
      return;
    }
  }
  EXPECT_LE(static_cast<double>(differ), max_frac * static_cast<double>(gpu.size()))
      << what << ": " << differ << " of " << gpu.size() << " elements differ";
}

inline void expect_close_to_cpu(const std::vector<float>& gpu, const std::vector<float>& cpu, double rel,
                                double abs_tol, double max_frac, const std::string& what) {
  expect_close_to_cpu(gpu, cpu, rel, std::vector<double>(cpu.size(), abs_tol), max_frac, what);
}

// Runs f, expects a pl::Error whose message contains every one of `parts`.
template <class F>
void expect_error_containing(F&& f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing '" << *parts.begin() << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg;
  }
}

}  // namespace pl::test
