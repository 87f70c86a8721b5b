// SwiGLU forward/backward against double references and finite differences.
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

}  // namespace
}  // namespace pl::optest
