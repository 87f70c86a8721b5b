// Causal GQA attention against a double reference (full softmax), its analytic gradient, and central
// finite differences of the double forward.
#include "op_test_util.h"

namespace pl::optest {
namespace {

struct Case {
  int64_t B, S, nq, nkv, d;
};

AttentionShape shape_of(const Case& c) { return AttentionShape{c.B, c.S, c.nq, c.nkv, c.d}; }
int64_t width(const Case& c) { return (c.nq + 2 * c.nkv) * c.d; }

struct Idx {
  Case c;
  int64_t q(int64_t b, int64_t i, int64_t h) const { return (b * c.S + i) * width(c) + h * c.d; }
  int64_t k(int64_t b, int64_t j, int64_t g) const { return (b * c.S + j) * width(c) + (c.nq + g) * c.d; }
  int64_t v(int64_t b, int64_t j, int64_t g) const {
    return (b * c.S + j) * width(c) + (c.nq + c.nkv + g) * c.d;
  }
  int64_t o(int64_t b, int64_t i, int64_t h) const { return (b * c.S + i) * c.nq * c.d + h * c.d; }
};

// Probabilities P[i][j] (j <= i) of head h in batch b, and log-sum-exp per row, in double.
void ref_probs(const std::vector<double>& x, const Case& c, int64_t b, int64_t h, std::vector<double>& P,
               std::vector<double>& lse) {
  const Idx I{c};
  const int64_t g = h / (c.nq / c.nkv);
  const double scale = 1.0 / std::sqrt(double(c.d));
  P.assign(static_cast<size_t>(c.S * c.S), 0.0);
  lse.assign(static_cast<size_t>(c.S), 0.0);
  for (int64_t i = 0; i < c.S; ++i) {
    double m = -1e300;
    for (int64_t j = 0; j <= i; ++j) {
      double s = 0.0;
      for (int64_t e = 0; e < c.d; ++e) s += x[I.q(b, i, h) + e] * x[I.k(b, j, g) + e];
      P[i * c.S + j] = s * scale;
      m = std::max(m, s * scale);
    }
    double sum = 0.0;
    for (int64_t j = 0; j <= i; ++j) sum += std::exp(P[i * c.S + j] - m);
    for (int64_t j = 0; j <= i; ++j) P[i * c.S + j] = std::exp(P[i * c.S + j] - m) / sum;
    lse[i] = m + std::log(sum);
  }
}

void ref_forward(const std::vector<double>& x, const Case& c, std::vector<double>& out,
                 std::vector<double>& lse) {
  const Idx I{c};
  out.assign(static_cast<size_t>(c.B * c.S * c.nq * c.d), 0.0);
  lse.assign(static_cast<size_t>(c.B * c.nq * c.S), 0.0);
  std::vector<double> P, l;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.nq; ++h) {
      ref_probs(x, c, b, h, P, l);
      const int64_t g = h / (c.nq / c.nkv);
      for (int64_t i = 0; i < c.S; ++i) {
        lse[(b * c.nq + h) * c.S + i] = l[i];
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t e = 0; e < c.d; ++e) out[I.o(b, i, h) + e] += P[i * c.S + j] * x[I.v(b, j, g) + e];
      }
    }
}

// Analytic gradient of L = <out, dout> w.r.t. qkv: dV = Pᵀ dO, dP = dO Vᵀ,
// dS = P ∘ (dP - rowsum(P ∘ dP)), dQ = scale dS K, dK = scale dSᵀ Q.
std::vector<double> ref_backward(const std::vector<double>& x, const std::vector<double>& dout,
                                 const Case& c) {
  const Idx I{c};
  const double scale = 1.0 / std::sqrt(double(c.d));
  std::vector<double> dx(x.size(), 0.0), P, l, dP(static_cast<size_t>(c.S * c.S));
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.nq; ++h) {
      ref_probs(x, c, b, h, P, l);
      const int64_t g = h / (c.nq / c.nkv);
      for (int64_t i = 0; i < c.S; ++i) {
        double rowsum = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          double s = 0.0;
          for (int64_t e = 0; e < c.d; ++e) s += dout[I.o(b, i, h) + e] * x[I.v(b, j, g) + e];
          dP[i * c.S + j] = s;
          rowsum += P[i * c.S + j] * s;
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double p = P[i * c.S + j], ds = p * (dP[i * c.S + j] - rowsum);
          for (int64_t e = 0; e < c.d; ++e) {
            dx[I.v(b, j, g) + e] += p * dout[I.o(b, i, h) + e];
            dx[I.q(b, i, h) + e] += scale * ds * x[I.k(b, j, g) + e];
            dx[I.k(b, j, g) + e] += scale * ds * x[I.q(b, i, h) + e];
          }
        }
      }
    }
  return dx;
}

class OpsAttention : public ::testing::TestWithParam<Case> {};

TEST_P(OpsAttention, ForwardMatchesDouble) {
  const Case c = GetParam();
  std::mt19937 rng(501);
  HostF32 qkv = random_f32({c.B * c.S, width(c)}, rng, -2, 2);
  HostF32 out({c.B * c.S, c.nq * c.d}, NAN), lse({c.B, c.nq, c.S}, NAN);
  attention_forward(cpu_ctx(false), out.t(), lse.t(), qkv.t(), shape_of(c));
  std::vector<double> rout, rlse;
  ref_forward(qkv.d(), c, rout, rlse);
  expect_close(out.v, rout, 1e-5, "out");
  expect_close(lse.v, rlse, 1e-6, "lse");
}

TEST_P(OpsAttention, BackwardMatchesDouble) {
  const Case c = GetParam();
  std::mt19937 rng(502);
  HostF32 qkv = random_f32({c.B * c.S, width(c)}, rng, -2, 2),
          dout = random_f32({c.B * c.S, c.nq * c.d}, rng);
  HostF32 out({c.B * c.S, c.nq * c.d}), lse({c.B, c.nq, c.S});
  HostF32 dqkv({c.B * c.S, width(c)}, NAN);  // must be fully overwritten
  attention_forward(cpu_ctx(false), out.t(), lse.t(), qkv.t(), shape_of(c));
  attention_backward(cpu_ctx(false), dqkv.t(), dout.t(), out.t(), lse.t(), qkv.t(), shape_of(c));
  expect_close(dqkv.v, ref_backward(qkv.d(), dout.d(), c), 1e-5, "dqkv");
}

TEST_P(OpsAttention, GradientMatchesFiniteDifferences) {
  const Case c = GetParam();
  std::mt19937 rng(503);
  HostF32 qkv = random_f32({c.B * c.S, width(c)}, rng, -2, 2),
          dout = random_f32({c.B * c.S, c.nq * c.d}, rng);
  const std::vector<double> gd = dout.d();
  const auto loss = [&](const std::vector<double>& xv) {
    std::vector<double> o, l;
    ref_forward(xv, c, o, l);
    return dot(o, gd);
  };
  const std::vector<double> fd = finite_diff(loss, qkv.d());
  expect_close(ref_backward(qkv.d(), gd, c), fd, 1e-7, "reference dqkv vs finite differences");
  HostF32 out({c.B * c.S, c.nq * c.d}), lse({c.B, c.nq, c.S}), dqkv({c.B * c.S, width(c)});
  attention_forward(cpu_ctx(false), out.t(), lse.t(), qkv.t(), shape_of(c));
  attention_backward(cpu_ctx(false), dqkv.t(), dout.t(), out.t(), lse.t(), qkv.t(), shape_of(c));
  expect_close(dqkv.v, fd, 1e-5, "op dqkv vs finite differences");
}

TEST_P(OpsAttention, RoundBf16) {
  const Case c = GetParam();
  std::mt19937 rng(504);
  HostF32 qkv = random_f32({c.B * c.S, width(c)}, rng, -2, 2, true);
  HostF32 dout = random_f32({c.B * c.S, c.nq * c.d}, rng, -1, 1, true);
  HostF32 out({c.B * c.S, c.nq * c.d}), lse({c.B, c.nq, c.S}), dqkv({c.B * c.S, width(c)});
  attention_forward(cpu_ctx(true), out.t(), lse.t(), qkv.t(), shape_of(c));
  attention_backward(cpu_ctx(true), dqkv.t(), dout.t(), out.t(), lse.t(), qkv.t(), shape_of(c));
  expect_bf16_representable(out.v, "out");
  expect_bf16_representable(dqkv.v, "dqkv");
  std::vector<double> rout, rlse;
  ref_forward(qkv.d(), c, rout, rlse);
  expect_bf16_close(out.v, rout, "out");
  expect_close(lse.v, rlse, 1e-6, "lse (fp32, not rounded)");
  // The backward reads the rounded out (as on the GPU), so D carries bf16 error: norm-wise tolerance.
  expect_bf16_close(dqkv.v, ref_backward(qkv.d(), dout.d(), c), "dqkv", 1.0 / 128, 1e-2);
}

TEST_P(OpsAttention, IndependentOfThreadCount) {
  const Case c = GetParam();
  std::mt19937 rng(505);
  HostF32 qkv = random_f32({c.B * c.S, width(c)}, rng, -2, 2),
          dout = random_f32({c.B * c.S, c.nq * c.d}, rng);
  HostF32 out[2] = {HostF32({c.B * c.S, c.nq * c.d}), HostF32({c.B * c.S, c.nq * c.d})};
  HostF32 lse[2] = {HostF32({c.B, c.nq, c.S}), HostF32({c.B, c.nq, c.S})};
  HostF32 dqkv[2] = {HostF32({c.B * c.S, width(c)}), HostF32({c.B * c.S, width(c)})};
  for (int r = 0; r < 2; ++r) {
    ScopedThreads threads(r + 1);
    attention_forward(cpu_ctx(true), out[r].t(), lse[r].t(), qkv.t(), shape_of(c));
    attention_backward(cpu_ctx(true), dqkv[r].t(), dout.t(), out[r].t(), lse[r].t(), qkv.t(), shape_of(c));
  }
  EXPECT_TRUE(bitwise_equal(out[0].v, out[1].v));
  EXPECT_TRUE(bitwise_equal(lse[0].v, lse[1].v));
  EXPECT_TRUE(bitwise_equal(dqkv[0].v, dqkv[1].v));
}

// GQA groups of 2 and 3, MHA, MQA; B > 1; sequence lengths that are not powers of two.
INSTANTIATE_TEST_SUITE_P(Shapes, OpsAttention,
                         ::testing::Values(Case{2, 7, 4, 2, 8}, Case{1, 13, 6, 2, 16}, Case{3, 5, 2, 2, 4},
                                           Case{2, 9, 4, 1, 8}));

TEST(OpsAttentionLong, ForwardBackwardMatchDouble) {
  const Case c{2, 130, 4, 2, 32};
  std::mt19937 rng(506);
  HostF32 qkv = random_f32({c.B * c.S, width(c)}, rng, -2, 2),
          dout = random_f32({c.B * c.S, c.nq * c.d}, rng);
  HostF32 out({c.B * c.S, c.nq * c.d}), lse({c.B, c.nq, c.S}), dqkv({c.B * c.S, width(c)});
  attention_forward(cpu_ctx(false), out.t(), lse.t(), qkv.t(), shape_of(c));
  attention_backward(cpu_ctx(false), dqkv.t(), dout.t(), out.t(), lse.t(), qkv.t(), shape_of(c));
  std::vector<double> rout, rlse;
  ref_forward(qkv.d(), c, rout, rlse);
  expect_close(out.v, rout, 1e-5, "out");
  expect_close(lse.v, rlse, 1e-6, "lse");
  expect_close(dqkv.v, ref_backward(qkv.d(), dout.d(), c), 1e-5, "dqkv");
}

TEST(OpsAttentionErrors, ErrorsNameTheOp) {
  const Case c{2, 7, 4, 2, 8};
  HostF32 qkv({c.B * c.S, width(c)}), out({c.B * c.S, c.nq * c.d}), lse({c.B, c.nq, c.S});
  HostF32 lse_bad({c.B, c.S, c.nq}), out_bad({c.B * c.S, c.nq * c.d + 1});
  const OpContext ctx = cpu_ctx(false);
  expect_error_naming("attention_forward",
                      [&] { attention_forward(ctx, out.t(), lse_bad.t(), qkv.t(), shape_of(c)); });
  expect_error_naming("attention_forward",
                      [&] { attention_forward(ctx, out_bad.t(), lse.t(), qkv.t(), shape_of(c)); });
  expect_error_naming("attention_forward", [&] {
    attention_forward(ctx, out.t(), lse.t(), qkv.t(), AttentionShape{2, 7, 4, 3, 8});
  });
  expect_error_naming("attention_backward", [&] {
    attention_backward(ctx, qkv.t(), out_bad.t(), out.t(), lse.t(), qkv.t(), shape_of(c));
  });
}

}  // namespace
}  // namespace pl::optest
