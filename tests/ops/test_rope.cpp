// Rotary position embedding (rotate-half) against a double reference; the backward is the adjoint.
#include "op_test_util.h"

namespace pl::optest {
namespace {

constexpr int64_t kB = 2, kS = 7, kNq = 4, kNkv = 2, kD = 16;
constexpr int64_t kT = kB * kS, kWidth = (kNq + 2 * kNkv) * kD, kRot = kNq + kNkv;

// cos/sin tables [S, d/2] of Llama's angles pos * theta^(-2i/d).
void make_tables(HostF32& c, HostF32& s, int64_t S, int64_t d) {
  c = HostF32({S, d / 2});
  s = HostF32({S, d / 2});
  for (int64_t p = 0; p < S; ++p)
    for (int64_t i = 0; i < d / 2; ++i) {
      const double ang = double(p) * std::pow(10000.0, -2.0 * double(i) / double(d));
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

}  // namespace
}  // namespace pl::optest
