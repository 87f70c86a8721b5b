// Fused softmax cross-entropy: losses and the in-place logits gradient, and the fp32 summation schedule
// of numerics/reduce.h written out (the CUDA backend sums in the same order; only its expf differs).
#include "op_test_util.h"

namespace pl::optest {
namespace {

// Per-token losses -log softmax(x)[y] in double.
std::vector<double> ref_losses(const std::vector<double>& x, const std::vector<int32_t>& y, int64_t T,
                               int64_t V) {
  std::vector<double> l(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    double m = -1e300;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, x[t * V + j]);
    double s = 0.0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(x[t * V + j] - m);
    l[t] = std::log(s) + m - x[t * V + y[t]];
  }
  return l;
}

// grad_scale * (softmax - onehot) = d(grad_scale * Σ losses) / dlogits
std::vector<double> ref_grad(const std::vector<double>& x, const std::vector<int32_t>& y, int64_t T,
                             int64_t V, double scale) {
  std::vector<double> g(x.size());
  for (int64_t t = 0; t < T; ++t) {
    double m = -1e300;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, x[t * V + j]);
    double s = 0.0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(x[t * V + j] - m);
    for (int64_t j = 0; j < V; ++j)
      g[t * V + j] = scale * (std::exp(x[t * V + j] - m) / s - (j == y[t] ? 1.0 : 0.0));
  }
  return g;
}

constexpr int64_t kT = 6, kV = 37;

TEST(OpsCrossEntropy, LossesAndGradientMatchDouble) {
  std::mt19937 rng(801);
  HostF32 logits = random_f32({kT, kV}, rng, -4, 4);
  // A large offset in one row: max-subtraction keeps exp finite.
  for (int64_t j = 0; j < kV; ++j) logits[2 * kV + j] += 1000.0f;
  HostI32 tgt = random_i32({kT}, rng, 0, kV);
  const std::vector<double> x = logits.d();
  HostF32 losses({kT});
  const float scale = 1.0f / kT;
  cross_entropy_forward_backward(cpu_ctx(false), losses.t(), logits.t(), tgt.t(), scale);
  expect_close(losses.v, ref_losses(x, tgt.v, kT, kV), 1e-5, "losses");
  // Row 2 sits at |x| ~ 1000, where an fp32 logit carries only ~6e-5 absolute precision;
  // its softmax is still exact in fp32 because of the max-subtraction.
  expect_close(logits.v, ref_grad(x, tgt.v, kT, kV, scale), 1e-5, "dlogits");
}

TEST(OpsCrossEntropy, GradientMatchesFiniteDifferences) {
  std::mt19937 rng(802);
  HostF32 logits = random_f32({kT, kV}, rng, -4, 4);
  HostI32 tgt = random_i32({kT}, rng, 0, kV);
  const double scale = 0.37;
  const auto loss = [&](const std::vector<double>& xv) {
    double s = 0.0;
    for (double l : ref_losses(xv, tgt.v, kT, kV)) s += l;
    return scale * s;
  };
  const std::vector<double> x = logits.d();
  const std::vector<double> fd = finite_diff(loss, x);
  expect_close(ref_grad(x, tgt.v, kT, kV, scale), fd, 1e-7, "reference dlogits vs finite differences");
  HostF32 losses({kT});
  cross_entropy_forward_backward(cpu_ctx(false), losses.t(), logits.t(), tgt.t(), float(scale));
  expect_close(logits.v, fd, 1e-5, "op dlogits vs finite differences");
}

TEST(OpsCrossEntropy, ZeroGradScaleLeavesLogits) {
  std::mt19937 rng(803);
  HostF32 logits = random_f32({kT, kV}, rng, -4, 4), before = logits, losses({kT});
  HostI32 tgt = random_i32({kT}, rng, 0, kV);
  cross_entropy_forward_backward(cpu_ctx(true), losses.t(), logits.t(), tgt.t(), 0.0f);
  EXPECT_TRUE(bitwise_equal(logits.v, before.v));
  expect_close(losses.v, ref_losses(before.d(), tgt.v, kT, kV), 1e-5, "losses");
}

TEST(OpsCrossEntropy, RoundBf16AndLargeVocab) {
  std::mt19937 rng(804);
  const int64_t T = 4, V = 50000;
  HostF32 logits = random_f32({T, V}, rng, -8, 8, true), losses({T});
  HostI32 tgt = random_i32({T}, rng, 0, V);
  const std::vector<double> x = logits.d();
  const float scale = 1.0f / 1024;
  cross_entropy_forward_backward(cpu_ctx(true), losses.t(), logits.t(), tgt.t(), scale);
  expect_bf16_representable(logits.v, "dlogits");
  expect_close(losses.v, ref_losses(x, tgt.v, T, V), 1e-5, "losses (fp32, not rounded)");
  expect_bf16_close(logits.v, ref_grad(x, tgt.v, T, V, scale), "dlogits");
}

// Σ exp(x - m) in 512 lanes (logit j -> lane j % 512, in order, from +0), combined by the stride tree
// (s = 256..1: lane[k] += lane[k + s]); loss = log(Σ) - (x[y] - m).
TEST(OpsCrossEntropy, FollowsTheDocumentedFp32Schedule) {
  std::mt19937 rng(805);
  const int64_t T = 3, V = 5003;  // V not a multiple of 512
  HostF32 logits = random_f32({T, V}, rng, -12, 12, true), losses({T});
  HostI32 tgt = random_i32({T}, rng, 0, V);
  const std::vector<float> x = logits.v;
  cross_entropy_forward_backward(cpu_ctx(true), losses.t(), logits.t(), tgt.t(), 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    const float* row = &x[static_cast<size_t>(t * V)];
    float m = row[0];
    for (int64_t j = 1; j < V; ++j) m = row[j] > m ? row[j] : m;
    float lane[512] = {};
    for (int64_t j = 0; j < V; ++j) lane[j % 512] = lane[j % 512] + std::exp(row[j] - m);
    for (int s = 256; s >= 1; s /= 2)
      for (int k = 0; k < s; ++k) lane[k] = lane[k] + lane[k + s];
    const float want = std::log(lane[0]) - (row[tgt.v[static_cast<size_t>(t)]] - m);
    EXPECT_EQ(num::float_bits(losses[static_cast<size_t>(t)]), num::float_bits(want)) << "row " << t;
  }
}

TEST(OpsCrossEntropy, ErrorsNameTheOp) {
  HostF32 logits({kT, kV}), losses({kT}), losses_bad({kT + 1});
  HostI32 tgt({kT});
  const std::string op = "cross_entropy_forward_backward";
  tgt.v[3] = kV;
  expect_error_naming(
      op, [&] { cross_entropy_forward_backward(cpu_ctx(false), losses.t(), logits.t(), tgt.t(), 1.0f); });
  tgt.v[3] = -1;
  expect_error_naming(
      op, [&] { cross_entropy_forward_backward(cpu_ctx(false), losses.t(), logits.t(), tgt.t(), 1.0f); });
  tgt.v[3] = 0;
  expect_error_naming(
      op, [&] { cross_entropy_forward_backward(cpu_ctx(false), losses_bad.t(), logits.t(), tgt.t(), 1.0f); });
}

}  // namespace
}  // namespace pl::optest
