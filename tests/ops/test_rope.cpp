// Rotary position embedding (rotate-half) against a double reference; the backward is the adjoint.
// Cpu/Rope.* and Cuda/Rope.* run the same cases on each backend (the GPU also against the CPU
// backend, bit for bit); OpsRope.* are CPU-only (plain FP32, finite differences, errors).
#include "op_test_util.h"

namespace pl::optest {
namespace {

constexpr int64_t kRopeB = 2, kRopeS = 7, kRopeNq = 4, kRopeNkv = 2, kRopeD = 16;
constexpr int64_t kRopeT = kRopeB * kRopeS, kWidth = (kRopeNq + 2 * kRopeNkv) * kRopeD, kRot = kRopeNq + kRopeNkv;

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

struct RopeShape {
  int64_t B, S, nq, nkv, d;
  double theta;
  int64_t T() const { return B * S; }
  int64_t width() const { return (nq + 2 * nkv) * d; }
};
constexpr RopeShape kShape{kRopeB, kRopeS, kRopeNq, kRopeNkv, kRopeD, 10000.0};

// sign +1: the forward rotation; -1: its transpose.
// positions: token t's position (--reset-position-ids), or empty: t % S.
std::vector<double> ref_rope(std::vector<double> x, const HostF32& c, const HostF32& s, double sign,
                             const RopeShape& r = kShape, const std::vector<int32_t>& positions = {}) {
  const int64_t half = r.d / 2;
  for (int64_t t = 0; t < r.T(); ++t) {
    const int64_t p = positions.empty() ? t % r.S : positions[static_cast<size_t>(t)];
    for (int64_t h = 0; h < r.nq + r.nkv; ++h) {
      double* v = x.data() + t * r.width() + h * r.d;
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
  make_tables(c, s, kRopeS, kRopeD);
  HostF32 x = random_f32({kRopeT, kWidth}, rng), y = x;
  rope_forward(cpu_ctx(false), y.t(), c.t(), s.t(), kRopeS, kRot, kRopeD, {});
  expect_close(y.v, ref_rope(x.d(), c, s, 1.0), 1e-6, "rope(x)");
  for (int64_t t = 0; t < kRopeT; ++t)
    for (int64_t i = kRot * kRopeD; i < kWidth; ++i) ASSERT_EQ(y[t * kWidth + i], x[t * kWidth + i]);
}

TEST(OpsRope, BackwardIsAdjointOfForward) {
  std::mt19937 rng(402);
  HostF32 c, s;
  make_tables(c, s, kRopeS, kRopeD);
  HostF32 x = random_f32({kRopeT, kWidth}, rng), y = random_f32({kRopeT, kWidth}, rng);
  HostF32 rx = x, ry = y;
  rope_forward(cpu_ctx(false), rx.t(), c.t(), s.t(), kRopeS, kRot, kRopeD, {});
  rope_backward(cpu_ctx(false), ry.t(), c.t(), s.t(), kRopeS, kRot, kRopeD, {});
  const double lhs = dot(rx.d(), y.d()), rhs = dot(x.d(), ry.d());
  EXPECT_NEAR(lhs, rhs, 1e-5 * std::abs(lhs) + 1e-5);
  expect_close(ry.v, ref_rope(y.d(), c, s, -1.0), 1e-6, "rope_backward(y)");
  // The rotation is orthogonal: backward(forward(x)) = x.
  rope_backward(cpu_ctx(false), rx.t(), c.t(), s.t(), kRopeS, kRot, kRopeD, {});
  expect_close(rx.v, x.d(), 1e-6, "backward(forward(x))");
}

TEST(OpsRope, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(403);
  HostF32 c, s;
  make_tables(c, s, kRopeS, kRopeD);
  HostF32 x = random_f32({kRopeT, kWidth}, rng), g = random_f32({kRopeT, kWidth}, rng);
  const std::vector<double> gd = g.d();
  const auto loss = [&](const std::vector<double>& xv) { return dot(ref_rope(xv, c, s, 1.0), gd); };
  const std::vector<double> fd = finite_diff(loss, x.d());
  HostF32 dg = g;
  rope_backward(cpu_ctx(false), dg.t(), c.t(), s.t(), kRopeS, kRot, kRopeD, {});
  expect_close(dg.v, fd, 1e-6, "rope_backward vs finite differences");
}

TEST(OpsRope, ErrorsNameTheOp) {
  HostF32 c, s, x({kRopeT, kWidth});
  make_tables(c, s, kRopeS, kRopeD);
  HostF32 c_bad({kRopeS, kRopeD});
  const OpContext ctx = cpu_ctx(false);
  expect_error_naming("rope_forward", [&] { rope_forward(ctx, x.t(), c_bad.t(), s.t(), kRopeS, kRot, kRopeD, {}); });
  expect_error_naming("rope_forward", [&] { rope_forward(ctx, x.t(), c.t(), s.t(), 5, kRot, kRopeD, {}); });
  expect_error_naming("rope_backward", [&] { rope_backward(ctx, x.t(), c.t(), s.t(), kRopeS, kRot, kRopeD + 1, {}); });
  expect_error_naming("rope_backward",
                      [&] { rope_backward(ctx, x.t(), c.t(), s.t(), kRopeS, kRopeNq + 2 * kRopeNkv + 1, kRopeD, {}); });
}

// Per-token positions (TokenPositions, --reset-position-ids: documents restarting at 0 inside a sample):
// each row rotated at its own position, forward and backward (the adjoint), against the double rotation; a
// position outside [0, S) is refused naming the op.
std::vector<int32_t> restarting_positions(int64_t B, int64_t S) {
  std::vector<int32_t> pos;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0, p = 0; i < S; ++i, ++p) {
      if (i == 3 - b || i == 5) p = 0;  // documents [0, 3-b), [3-b, 5), [5, S)
      pos.push_back(static_cast<int32_t>(p));
    }
  return pos;
}

TEST(OpsRope, PositionsRotateEachTokenAtItsPosition) {
  std::mt19937 rng(404);
  HostF32 c, s;
  make_tables(c, s, kRopeS, kRopeD);
  std::vector<int32_t> pos = restarting_positions(kRopeB, kRopeS);
  const TokenPositions given{pos.data(), nullptr};
  HostF32 x = random_f32({kRopeT, kWidth}, rng), y = x, g = x;
  rope_forward(cpu_ctx(false), y.t(), c.t(), s.t(), kRopeS, kRot, kRopeD, given);
  expect_close(y.v, ref_rope(x.d(), c, s, 1.0, kShape, pos), 1e-6, "rope(x) at the given positions");
  rope_backward(cpu_ctx(false), g.t(), c.t(), s.t(), kRopeS, kRot, kRopeD, given);
  expect_close(g.v, ref_rope(x.d(), c, s, -1.0, kShape, pos), 1e-6, "rope_backward(x) at the given positions");
  // Not the default: the restarted rows differ from t % S.
  HostF32 plain = x;
  rope_forward(cpu_ctx(false), plain.t(), c.t(), s.t(), kRopeS, kRot, kRopeD, {});
  EXPECT_NE(plain.v, y.v);
  pos[4] = static_cast<int32_t>(kRopeS);
  expect_error_naming("rope_forward", [&] { rope_forward(cpu_ctx(false), y.t(), c.t(), s.t(), kRopeS, kRot, kRopeD, given); });
}

// ---- on every backend (Cpu/ and Cuda/Rope.*) ------------------------------------------------------

class Rope : public OnBackend {};
PL_INSTANTIATE_BACKENDS(Rope);

// rope_forward / rope_backward with round_bf16 on BF16 inputs: BF16 outputs within BF16 rounding of the
// double rotation, and bit-identical between backends (the same fp32 expressions in the same order;
// whole rows, so the v heads are checked to be untouched too). Also an odd half (d = 10), T = 111 and
// Llama 3's theta.
TEST_P(Rope, RoundBf16) {
  PL_SEEDED_RNG(rng);
  for (const RopeShape& r : {kShape, RopeShape{3, 37, 3, 1, 10, 500000.0}})
    for (bool forward : {true, false}) {
      const std::string what = forward ? "rope_forward qkv" : "rope_backward dqkv";
      SCOPED_TRACE(what + " d=" + std::to_string(r.d));
      HostF32 c, s;
      make_tables(c, s, r.S, r.d, r.theta);
      const int64_t T = r.T(), W = r.width();
      std::vector<float> x = uniform_bf16(T * W, rng, -3.0f, 3.0f);
      const auto op = forward ? rope_forward : rope_backward;
      const auto run = [&](Backend& k) {
        std::vector<float> y = x;
        op(k.ctx(), k.put(y, {T, W}, DType::BF16), k.put(c.v, {r.S, r.d / 2}, DType::F32),
           k.put(s.v, {r.S, r.d / 2}, DType::F32), r.S, r.nq + r.nkv, r.d, {});
        return k.get(y);
      };
      const std::vector<float> y = run_exact(GetParam(), run, what);
      expect_bf16_representable(y, what);
      expect_bf16_close(y, ref_rope(std::vector<double>(x.begin(), x.end()), c, s, forward ? 1.0 : -1.0, r), what,
                        1.0 / 128, 1e-3);
    }
}

// The same with per-token positions (TokenPositions; the GPU reads the device copy): within BF16 rounding of the
// double rotation at those positions and bit-identical between backends.
TEST_P(Rope, PositionsRoundBf16) {
  PL_SEEDED_RNG(rng);
  const RopeShape r{3, 37, 3, 1, 10, 500000.0};
  for (bool forward : {true, false}) {
    const std::string what = forward ? "rope_forward qkv (positions)" : "rope_backward dqkv (positions)";
    SCOPED_TRACE(what);
    HostF32 c, s;
    make_tables(c, s, r.S, r.d, r.theta);
    const int64_t T = r.T(), W = r.width();
    std::vector<int32_t> pos = restarting_positions(r.B, r.S);
    std::vector<float> x = uniform_bf16(T * W, rng, -3.0f, 3.0f);
    const auto op = forward ? rope_forward : rope_backward;
    const auto run = [&](Backend& k) {
      std::vector<float> y = x;
      const Tensor dev_pos = k.put(pos, {T});
      const TokenPositions given{pos.data(), k.cuda() ? dev_pos.i32() : nullptr};
      op(k.ctx(), k.put(y, {T, W}, DType::BF16), k.put(c.v, {r.S, r.d / 2}, DType::F32),
         k.put(s.v, {r.S, r.d / 2}, DType::F32), r.S, r.nq + r.nkv, r.d, given);
      return k.get(y);
    };
    const std::vector<float> y = run_exact(GetParam(), run, what);
    expect_bf16_close(y, ref_rope(std::vector<double>(x.begin(), x.end()), c, s, forward ? 1.0 : -1.0, r, pos), what,
                      1.0 / 128, 1e-3);
  }
}

}  // namespace
}  // namespace pl::optest
