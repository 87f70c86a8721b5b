// SwiGLU forward/backward against double references and finite differences.
// On the CPU (Ops*) and, against the CPU backend, on the GPU (Cuda*, skipped without a device).
#include "op_test_util.h"

namespace pl::optest {
namespace {

constexpr int64_t kT = 11, kF = 37;

double silu(double g) { return g / (1.0 + std::exp(-g)); }

std::vector<double> ref_forward(const std::vector<double>& fc1, int64_t T, int64_t f) {
  std::vector<double> out(static_cast<size_t>(T * f));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < f; ++i) out[t * f + i] = silu(fc1[t * 2 * f + i]) * fc1[t * 2 * f + f + i];
  return out;
}

std::vector<double> ref_backward(const std::vector<double>& fc1, const std::vector<double>& dout, int64_t T,
                                 int64_t f) {
  std::vector<double> d(fc1.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < f; ++i) {
      const double g = fc1[t * 2 * f + i], u = fc1[t * 2 * f + f + i], go = dout[t * f + i];
      const double sig = 1.0 / (1.0 + std::exp(-g));
      d[t * 2 * f + i] = go * u * (sig + g * sig * (1.0 - sig));
      d[t * 2 * f + f + i] = go * silu(g);
    }
  return d;
}

TEST(OpsSwiglu, ForwardMatchesDouble) {
  std::mt19937 rng(601);
  HostF32 fc1 = random_f32({kT, 2 * kF}, rng, -6, 6), out({kT, kF});
  // Extremes: exp(-g) overflows fp32 for g = -100; the result must stay finite.
  fc1[0] = -100.0f;
  fc1[1] = 100.0f;
  swiglu_forward(cpu_ctx(false), out.t(), fc1.t());
  expect_close(out.v, ref_forward(fc1.d(), kT, kF), 1e-6, "out");
}

TEST(OpsSwiglu, BackwardMatchesDoubleAndFiniteDifferences) {
  std::mt19937 rng(602);
  HostF32 fc1 = random_f32({kT, 2 * kF}, rng, -6, 6), dout = random_f32({kT, kF}, rng);
  fc1[0] = -100.0f;
  fc1[1] = 100.0f;
  HostF32 dfc1({kT, 2 * kF}, NAN);
  swiglu_backward(cpu_ctx(false), dfc1.t(), dout.t(), fc1.t());
  const std::vector<double> ref = ref_backward(fc1.d(), dout.d(), kT, kF);
  expect_close(dfc1.v, ref, 1e-6, "dfc1");
  const std::vector<double> gd = dout.d();
  const auto loss = [&](const std::vector<double>& x) { return dot(ref_forward(x, kT, kF), gd); };
  const std::vector<double> fd = finite_diff(loss, fc1.d());
  expect_close(ref, fd, 1e-7, "reference dfc1 vs finite differences");
  expect_close(dfc1.v, fd, 1e-5, "op dfc1 vs finite differences");
}

TEST(OpsSwiglu, RoundBf16) {
  std::mt19937 rng(603);
  HostF32 fc1 = random_f32({kT, 2 * kF}, rng, -6, 6, true), dout = random_f32({kT, kF}, rng, -1, 1, true);
  HostF32 out({kT, kF}), dfc1({kT, 2 * kF});
  swiglu_forward(cpu_ctx(true), out.t(), fc1.t());
  swiglu_backward(cpu_ctx(true), dfc1.t(), dout.t(), fc1.t());
  expect_bf16_representable(out.v, "out");
  expect_bf16_representable(dfc1.v, "dfc1");
  expect_bf16_close(out.v, ref_forward(fc1.d(), kT, kF), "out");
  expect_bf16_close(dfc1.v, ref_backward(fc1.d(), dout.d(), kT, kF), "dfc1");
}

TEST(OpsSwiglu, ErrorsNameTheOp) {
  HostF32 fc1({4, 16}), out({4, 9}), dfc1_bad({4, 17}), dout({4, 8});
  const OpContext ctx = cpu_ctx(false);
  expect_error_naming("swiglu_forward", [&] { swiglu_forward(ctx, out.t(), fc1.t()); });
  expect_error_naming("swiglu_backward", [&] { swiglu_backward(ctx, dfc1_bad.t(), dout.t(), fc1.t()); });
}

// ---- CUDA: the same op on the GPU against the CPU backend (CudaSwiglu) --------------------------

// Tolerance. The same fp32 expressions as the CPU except exp: CUDA's expf is within 2 ulp, glibc's
// within 0.5 ulp, so each fp32 result is within a few ulp of the CPU's and its bf16 rounding is the
// same or the adjacent value: |diff| <= 2^-7 max(|a|,|b|), at most 1% of the elements differing.
TEST(CudaSwiglu, Forward) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  const int64_t T = 57, f = 219;
  std::vector<float> fc1 = uniform_bf16(T * 2 * f, rng, -6.0f, 6.0f);
  std::vector<float> out(T * f);
  swiglu_forward(cpu_ctx(true), host_view(out, {T, f}), host_view(fc1, {T, 2 * f}));
  DeviceTensor d_out = device_tensor({T, f}, DType::BF16);
  DeviceTensor d_fc1 = to_device(fc1, {T, 2 * f}, DType::BF16);
  swiglu_forward(cuda_ctx(), d_out.t, d_fc1.t);
  expect_close_to_cpu(to_host_floats(d_out.t), out, kBf16Ulp, 0.0, 0.01, "swiglu_forward out");
}

// Tolerance. As the forward, plus: d silu/dg = sig (1 + g (1 - sig)) cancels near g = -1.28, where a
// 2-ulp exp difference moves the factor by ~|g| 2^-22 absolute; times |dout·up| <= 2 that is < 1e-6.
// |diff| <= 2^-7 max(|a|,|b|) + 1e-6, at most 1% of the elements differing.
TEST(CudaSwiglu, Backward) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  const int64_t T = 57, f = 219;
  std::vector<float> fc1 = uniform_bf16(T * 2 * f, rng, -6.0f, 6.0f);
  std::vector<float> dout = uniform_bf16(T * f, rng, -1.0f, 1.0f);
  std::vector<float> dfc1(T * 2 * f);
  swiglu_backward(cpu_ctx(true), host_view(dfc1, {T, 2 * f}), host_view(dout, {T, f}), host_view(fc1, {T, 2 * f}));
  DeviceTensor d_dfc1 = device_tensor({T, 2 * f}, DType::BF16);
  DeviceTensor d_dout = to_device(dout, {T, f}, DType::BF16);
  DeviceTensor d_fc1 = to_device(fc1, {T, 2 * f}, DType::BF16);
  swiglu_backward(cuda_ctx(), d_dfc1.t, d_dout.t, d_fc1.t);
  expect_close_to_cpu(to_host_floats(d_dfc1.t), dfc1, kBf16Ulp, 1e-6, 0.01, "swiglu_backward dfc1");
}

}  // namespace
}  // namespace pl::optest
