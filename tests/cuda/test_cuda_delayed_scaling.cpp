// GPU conformance of FP8 delayed scaling: the delayed_scaling_update kernel and quantize with a given scale
// and an amax record give the CPU backend's bits (both run the shared numerics/delayed_scaling.h and
// fp8.h). Bit-exact. Skipped without a device.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/ops.h"
#include "backend/quantize.h"
#include "backend/device_memory.h"
#include "core/tensor.h"
#include "cuda/cuda_test_util.h"
#include "numerics/bf16.h"

namespace pl {
namespace {

OpContext cpu() {
  OpContext c;
  c.device = Device::CPU;
  return c;
}

std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

TEST(CudaDelayedScaling, UpdateKernelEqualsTheCpu) {
  PL_REQUIRE_CUDA_DEVICE();
  const int64_t len = 5, n = 300;  // more columns than one block of threads
  std::mt19937 rng(::testing::UnitTest::GetInstance()->random_seed());
  std::uniform_real_distribution<float> u(0.0f, 8.0f);
  std::vector<float> h(static_cast<size_t>(len * n)), s(static_cast<size_t>(n));
  for (float& x : h) x = u(rng);
  for (float& x : s) x = u(rng);
  for (int64_t j = 0; j < n; j += 7) h[static_cast<size_t>(j)] = 0.0f;  // not quantized this step: no roll
  h[3] = std::numeric_limits<float>::infinity();
  h[5] = std::numeric_limits<float>::quiet_NaN();
  h[static_cast<size_t>(2 * n + 11)] = std::numeric_limits<float>::infinity();
  const DelayedScalingRule rules[2] = {{.num_forward = 200, .forward_scaled_max = 224.0f, .backward_scaled_max = 57344.0f},
                                       {.num_forward = 100, .most_recent = true}};
  for (const DelayedScalingRule& rule : rules) {
    std::vector<float> hc = h, sc = s;
    delayed_scaling_update(cpu(), Tensor(hc.data(), {len, n}, DType::F32, Device::CPU),
                           Tensor(sc.data(), {n}, DType::F32, Device::CPU), rule);
    Buffer dev(static_cast<size_t>((len + 1) * n) * sizeof(float), Device::CUDA);
    const Tensor dh = dev.as({len, n}, DType::F32, 0), ds = dev.as({n}, DType::F32, len * n * sizeof(float));
    copy_from_host(dh, h.data());
    copy_from_host(ds, s.data());
    delayed_scaling_update(test::cuda_ctx(), dh, ds, rule);
    std::vector<float> hg(h.size()), sg(s.size());
    copy_to_host(hg.data(), dh);
    copy_to_host(sg.data(), ds);
    EXPECT_EQ(bits(hg), bits(hc));
    EXPECT_EQ(bits(sg), bits(sc));
  }
}

TEST(CudaDelayedScaling, QuantizeWithAGivenScaleEqualsTheCpu) {
  PL_REQUIRE_CUDA_DEVICE();
  const int64_t R = 33, C = 48;
  std::mt19937 rng(::testing::UnitTest::GetInstance()->random_seed());
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> x(static_cast<size_t>(R * C));
  for (float& v : x) v = num::round_bf16(nd(rng));
  for (const QuantFormat f : {QuantFormat::FP8_E4M3, QuantFormat::FP8_E5M2}) {
    float scale = 37.0f, record = 0.0f;  // a scale that saturates some codes
    std::vector<Buffer> host_owner, dev_owner;
    QuantizedTensor qc = allocate_quantized(host_owner, Device::CPU, f, R, C, true, true);
    quantize(cpu(), qc, Tensor(x.data(), {R, C}, DType::F32, Device::CPU),
             {.format = f, .rowwise = true, .columnwise = true, .scale = Tensor(&scale, {1}, DType::F32, Device::CPU),
              .amax_record = Tensor(&record, {1}, DType::F32, Device::CPU), .compact_scales = false});
    QuantizedTensor qg = allocate_quantized(dev_owner, Device::CUDA, f, R, C, true, true);
    Buffer dev(static_cast<size_t>(R * C + 2) * sizeof(float), Device::CUDA);
    const Tensor dx = dev.as({R, C}, DType::F32, 0), dscale = dev.as({1}, DType::F32, R * C * sizeof(float)),
                 drecord = dev.as({1}, DType::F32, (R * C + 1) * sizeof(float));
    copy_from_host(dx, x.data());
    copy_from_host(dscale, &scale);
    quantize(test::cuda_ctx(), qg, dx,
             {.format = f, .rowwise = true, .columnwise = true, .scale = dscale, .amax_record = drecord,
              .compact_scales = false});
    for (const auto& [c, g] : {std::pair{&qc.rowwise, &qg.rowwise}, std::pair{&qc.columnwise, &qg.columnwise}}) {
      std::vector<uint8_t> codes(static_cast<size_t>(R * C));
      copy_to_host(codes.data(), g->data);
      EXPECT_EQ(std::memcmp(codes.data(), c->data.u8(), codes.size()), 0) << quant_format_name(f);
      float inv = 0.0f;
      copy_to_host(&inv, g->scale_inv);
      EXPECT_EQ(inv, c->scale_inv.f32()[0]);
    }
    float grecord = 0.0f;
    copy_to_host(&grecord, drecord);
    EXPECT_EQ(grecord, record);
    EXPECT_GT(record, 0.0f);
  }
}

}  // namespace
}  // namespace pl
