// Rotary position embedding (rotate-half) against a double reference; the backward is the adjoint.
// On the CPU (Ops*) and, against the CPU backend, on the GPU (Cuda*, skipped without a device).
#include "op_test_util.h"

namespace pl::optest {
namespace {

constexpr int64_t kB = 2, kS = 7, kNq = 4, kNkv = 2, kD = 16;
constexpr int64_t kT = kB * kS, kWidth = (kNq + 2 * kNkv) * kD, kRot = kNq + kNkv;

// cos/sin tables [S, d/2] of Llama's angles pos * theta^(-2i/d).
void make_tables(HostF32& c, HostF32& s, int64_t S, int64_t d, double theta = 10000.0) {
  c = HostF32({S, d / 2});
  s = HostF32({S, d / 2});
  for (int64_t p = 0; p < S; ++p)
    for (int64_t i = 0; i < d / 2; ++i) {
      const double ang = double(p) * std::pow(theta, -2.0 * double(i) / double(d));
      c[p * (d / 2) + i] = float(std::cos(ang));
      s[p * (d / 2) + i] = float(std::sin(ang));
    }
}

// sign +1: the forward rotation; -1: its transpose.
std::vector<double> ref_rope(std::vector<double> x, const HostF32& c, const HostF32& s, double sign) {
  const int64_t half = kD / 2;
  for (int64_t t = 0; t < kT; ++t) {
    const int64_t p = t % kS;
    for (int64_t h = 0; h < kRot; ++h) {
      double* v = x.data() + t * kWidth + h * kD;
      for (int64_t i = 0; i < half; ++i) {
        const double cs = c[p * half + i], sn = sign * s[p * half + i];
        const double x1 = v[i], x2 = v[i + half];
        v[i] = x1 * cs - x2 * sn;
        v[i + half] = x2 * cs + x1 * sn;
      }
    }
  }
  return x;
}

TEST(OpsRope, ForwardMatchesDoubleAndLeavesVUntouched) {
  std::mt19937 rng(401);
  HostF32 c, s;
  make_tables(c, s, kS, kD);
  HostF32 x = random_f32({kT, kWidth}, rng), y = x;
  rope_forward(cpu_ctx(false), y.t(), c.t(), s.t(), kS, kRot, kD);
  expect_close(y.v, ref_rope(x.d(), c, s, 1.0), 1e-6, "rope(x)");
  for (int64_t t = 0; t < kT; ++t)
    for (int64_t i = kRot * kD; i < kWidth; ++i) ASSERT_EQ(y[t * kWidth + i], x[t * kWidth + i]);
}

TEST(OpsRope, BackwardIsAdjointOfForward) {
  std::mt19937 rng(402);
  HostF32 c, s;
  make_tables(c, s, kS, kD);
  HostF32 x = random_f32({kT, kWidth}, rng), y = random_f32({kT, kWidth}, rng);
  HostF32 rx = x, ry = y;
  rope_forward(cpu_ctx(false), rx.t(), c.t(), s.t(), kS, kRot, kD);
  rope_backward(cpu_ctx(false), ry.t(), c.t(), s.t(), kS, kRot, kD);
  const double lhs = dot(rx.d(), y.d()), rhs = dot(x.d(), ry.d());
  EXPECT_NEAR(lhs, rhs, 1e-5 * std::abs(lhs) + 1e-5);
  expect_close(ry.v, ref_rope(y.d(), c, s, -1.0), 1e-6, "rope_backward(y)");
  // The rotation is orthogonal: backward(forward(x)) = x.
  rope_backward(cpu_ctx(false), rx.t(), c.t(), s.t(), kS, kRot, kD);
  expect_close(rx.v, x.d(), 1e-6, "backward(forward(x))");
}

TEST(OpsRope, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(403);
  HostF32 c, s;
  make_tables(c, s, kS, kD);
  HostF32 x = random_f32({kT, kWidth}, rng), g = random_f32({kT, kWidth}, rng);
  const std::vector<double> gd = g.d();
  const auto loss = [&](const std::vector<double>& xv) { return dot(ref_rope(xv, c, s, 1.0), gd); };
  const std::vector<double> fd = finite_diff(loss, x.d());
  HostF32 dg = g;
  rope_backward(cpu_ctx(false), dg.t(), c.t(), s.t(), kS, kRot, kD);
  expect_close(dg.v, fd, 1e-6, "rope_backward vs finite differences");
}

TEST(OpsRope, RoundBf16) {
  std::mt19937 rng(404);
  HostF32 c, s;
  make_tables(c, s, kS, kD);
  HostF32 x = random_f32({kT, kWidth}, rng, -1, 1, true), y = x;
  rope_forward(cpu_ctx(true), y.t(), c.t(), s.t(), kS, kRot, kD);
  expect_bf16_representable(y.v, "rope(x)");
  expect_bf16_close(y.v, ref_rope(x.d(), c, s, 1.0), "rope(x)", 1.0 / 128, 1e-3);
  HostF32 g = x;
  rope_backward(cpu_ctx(true), g.t(), c.t(), s.t(), kS, kRot, kD);
  expect_bf16_representable(g.v, "rope_backward(x)");
  expect_bf16_close(g.v, ref_rope(x.d(), c, s, -1.0), "rope_backward(x)", 1.0 / 128, 1e-3);
}

TEST(OpsRope, ErrorsNameTheOp) {
  HostF32 c, s, x({kT, kWidth});
  make_tables(c, s, kS, kD);
  HostF32 c_bad({kS, kD});
  const OpContext ctx = cpu_ctx(false);
  expect_error_naming("rope_forward", [&] { rope_forward(ctx, x.t(), c_bad.t(), s.t(), kS, kRot, kD); });
  expect_error_naming("rope_forward", [&] { rope_forward(ctx, x.t(), c.t(), s.t(), 5, kRot, kD); });
  expect_error_naming("rope_backward", [&] { rope_backward(ctx, x.t(), c.t(), s.t(), kS, kRot, kD + 1); });
  expect_error_naming("rope_backward",
                      [&] { rope_backward(ctx, x.t(), c.t(), s.t(), kS, kNq + 2 * kNkv + 1, kD); });
}

// ---- CUDA: the same op on the GPU against the CPU backend (CudaRope) ----------------------------

// Exact: the same fp32 expressions in the same order. An odd half (d = 10), T = 111, Llama 3's theta.
void rope_case(bool forward) {
  PL_SEEDED_RNG(rng);
  const int64_t B = 3, S = 37, nq = 3, nkv = 1, d = 10, T = B * S, W = (nq + 2 * nkv) * d;
  HostF32 c, s;
  make_tables(c, s, S, d, 500000.0);
  std::vector<float> qkv = uniform_bf16(T * W, rng, -3.0f, 3.0f), cpu = qkv;
  DeviceTensor d_qkv = to_device(qkv, {T, W}, DType::BF16);
  DeviceTensor d_cos = to_device(c.v, {S, d / 2}, DType::F32), d_sin = to_device(s.v, {S, d / 2}, DType::F32);
  const auto op = forward ? rope_forward : rope_backward;
  op(cpu_ctx(true), host_view(cpu, {T, W}), c.t(), s.t(), S, nq + nkv, d);
  op(cuda_ctx(), d_qkv.t, d_cos.t, d_sin.t, S, nq + nkv, d);
  // The whole row, so the v heads (not rotated) are checked to be untouched too.
  expect_bits_equal(to_host_floats(d_qkv.t), cpu, forward ? "rope_forward qkv" : "rope_backward dqkv");
}

TEST(CudaRope, Forward) {
  PL_REQUIRE_CUDA_DEVICE();
  rope_case(true);
}

TEST(CudaRope, Backward) {
  PL_REQUIRE_CUDA_DEVICE();
  rope_case(false);
}

}  // namespace
}  // namespace pl::optest
