// add (with aliasing and rounding) and fill_zero.
// On the CPU (Ops*) and, against the CPU backend, on the GPU (Cuda*, skipped without a device).
#include "op_test_util.h"

namespace pl::optest {
namespace {

TEST(OpsElementwise, AddIsExactFp32Sum) {
  std::mt19937 rng(701);
  HostF32 a = random_f32({13, 29}, rng), b = random_f32({13, 29}, rng), out({13, 29});
  add(cpu_ctx(false), out.t(), a.t(), b.t());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], static_cast<float>(double(a[i]) + double(b[i])));
}

TEST(OpsElementwise, AddAliasingAndRounding) {
  std::mt19937 rng(702);
  HostF32 a = random_f32({1000}, rng, -1, 1, true), b = random_f32({1000}, rng, -1, 1, true);
  HostF32 a0 = a, b0 = b;
  add(cpu_ctx(true), a.t(), a.t(), b.t());  // out aliases a
  expect_bf16_representable(a.v, "a + b");
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], num::round_bf16(a0[i] + b0[i])) << i;
  add(cpu_ctx(false), b.t(), a0.t(), b.t());  // out aliases b
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(b[i], a0[i] + b0[i]) << i;
}

TEST(OpsElementwise, FillZero) {
  std::mt19937 rng(703);
  HostF32 x = random_f32({(1 << 19) + 37}, rng);  // more than one 1 MiB chunk, with a tail
  fill_zero(cpu_ctx(true), x.t());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(num::float_bits(x[i]), 0u) << i;
  HostI32 ids({17}, 5);
  fill_zero(cpu_ctx(false), ids.t());
  for (int32_t v : ids.v) ASSERT_EQ(v, 0);
}

TEST(OpsElementwise, ErrorsNameTheOp) {
  HostF32 a({4, 8}), b({8, 4}), out({4, 8});
  expect_error_naming("add", [&] { add(cpu_ctx(false), out.t(), a.t(), b.t()); });
  expect_error_naming("add", [&] { add(cpu_ctx(false), b.t(), a.t(), a.t()); });
}

// ---- CUDA: the same op on the GPU against the CPU backend (CudaElementwise) ---------------------

TEST(CudaElementwise, Add) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  const int64_t R = 37, C = 29;
  std::vector<float> a = uniform_bf16(R * C, rng, -4.0f, 4.0f);
  std::vector<float> b = uniform_bf16(R * C, rng, -4.0f, 4.0f);
  b[0] = -a[0];  // an exact zero
  std::vector<float> out(R * C);
  add(cpu_ctx(true), host_view(out, {R, C}), host_view(a, {R, C}), host_view(b, {R, C}));
  DeviceTensor d_out = device_tensor({R, C}, DType::BF16);
  DeviceTensor d_a = to_device(a, {R, C}, DType::BF16);
  DeviceTensor d_b = to_device(b, {R, C}, DType::BF16);
  add(cuda_ctx(), d_out.t, d_a.t, d_b.t);
  expect_bits_equal(to_host_floats(d_out.t), out, "add out");
  add(cuda_ctx(), d_a.t, d_a.t, d_b.t);  // out aliases a (the residual update)
  expect_bits_equal(to_host_floats(d_a.t), out, "add out aliasing a");

  DeviceTensor d_f32 = to_device(a, {R, C}, DType::F32);
  expect_error_containing([&] { add(cuda_ctx(), d_out.t, d_f32.t, d_b.t); }, {"add", "a [37, 29] f32", "bf16"});
}

TEST(CudaElementwise, FillZero) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  const int64_t n = 1237;
  std::vector<float> ones(n, 1.5f);
  for (DType dt : {DType::F32, DType::BF16}) {
    DeviceTensor d = to_device(ones, {n}, dt);
    fill_zero(cuda_ctx(), d.t);
    for (uint8_t byte : to_host_bytes(d.t)) ASSERT_EQ(byte, 0) << dtype_name(dt);
  }
  std::vector<int32_t> ids = uniform_ids(n, rng, 1000);
  DeviceTensor di = to_device_i32(ids, {n});
  fill_zero(cuda_ctx(), di.t);
  for (uint8_t byte : to_host_bytes(di.t)) ASSERT_EQ(byte, 0) << "i32";
}

}  // namespace
}  // namespace pl::optest
