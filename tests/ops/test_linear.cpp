// Linear layer GEMMs (OpenBLAS) against double references: y = x wᵀ, dx = dy w, dw += dyᵀ x.
#include "op_test_util.h"

namespace pl::optest {
namespace {

// y[T,out] = x[T,in] · w[out,in]ᵀ in double.
std::vector<double> ref_matmul_nt(const HostF32& x, const HostF32& w) {
  const int64_t T = x.dims[0], in = x.dims[1], out = w.dims[0];
  std::vector<double> y(static_cast<size_t>(T * out));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0.0;
      for (int64_t i = 0; i < in; ++i) s += double(x[t * in + i]) * w[o * in + i];
      y[t * out + o] = s;
    }
  return y;
}

// dx[T,in] = dy[T,out] · w[out,in]
std::vector<double> ref_dx(const HostF32& dy, const HostF32& w) {
  const int64_t T = dy.dims[0], out = w.dims[0], in = w.dims[1];
  std::vector<double> dx(static_cast<size_t>(T * in), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) dx[t * in + i] += double(dy[t * out + o]) * w[o * in + i];
  return dx;
}

// dw[out,in] = prefill + dy[T,out]ᵀ · x[T,in]
std::vector<double> ref_dw(const HostF32& prefill, const HostF32& dy, const HostF32& x) {
  const int64_t T = x.dims[0], out = dy.dims[1], in = x.dims[1];
  std::vector<double> dw = prefill.d();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) dw[o * in + i] += double(dy[t * out + o]) * x[t * in + i];
  return dw;
}

constexpr int64_t kT = 37, kIn = 48, kOut = 29;

TEST(OpsLinear, ForwardMatchesDouble) {
  std::mt19937 rng(101);
  HostF32 x = random_f32({kT, kIn}, rng), w = random_f32({kOut, kIn}, rng), y({kT, kOut}, 7.0f);
  linear_forward(cpu_ctx(false), y.t(), x.t(), w.t());
  expect_close(y.v, ref_matmul_nt(x, w), 1e-5, "y");
}

TEST(OpsLinear, BackwardInputMatchesDoubleAndOverwrites) {
  std::mt19937 rng(102);
  HostF32 dy = random_f32({kT, kOut}, rng), w = random_f32({kOut, kIn}, rng), dx({kT, kIn}, 7.0f);
  linear_backward_input(cpu_ctx(false), dx.t(), dy.t(), w.t());
  expect_close(dx.v, ref_dx(dy, w), 1e-5, "dx");
}

TEST(OpsLinear, BackwardWeightAccumulates) {
  std::mt19937 rng(103);
  HostF32 dy = random_f32({kT, kOut}, rng), x = random_f32({kT, kIn}, rng);
  HostF32 prefill = random_f32({kOut, kIn}, rng, -3.0f, 3.0f);
  HostF32 dw = prefill;
  linear_backward_weight(cpu_ctx(false), dw.t(), dy.t(), x.t());
  expect_close(dw.v, ref_dw(prefill, dy, x), 1e-5, "dw");
  // Twice accumulates twice.
  linear_backward_weight(cpu_ctx(false), dw.t(), dy.t(), x.t());
  std::vector<double> twice = ref_dw(prefill, dy, x);
  const std::vector<double> once = ref_dw(HostF32({kOut, kIn}), dy, x);
  for (size_t i = 0; i < twice.size(); ++i) twice[i] += once[i];
  expect_close(dw.v, twice, 1e-5, "dw after two calls");
}

TEST(OpsLinear, RoundBf16) {
  std::mt19937 rng(104);
  HostF32 x = random_f32({kT, kIn}, rng, -1, 1, true), w = random_f32({kOut, kIn}, rng, -1, 1, true);
  HostF32 dy = random_f32({kT, kOut}, rng, -1, 1, true);
  HostF32 y({kT, kOut}), dx({kT, kIn});
  linear_forward(cpu_ctx(true), y.t(), x.t(), w.t());
  linear_backward_input(cpu_ctx(true), dx.t(), dy.t(), w.t());
  expect_bf16_representable(y.v, "y");
  expect_bf16_representable(dx.v, "dx");
  expect_bf16_close(y.v, ref_matmul_nt(x, w), "y");
  expect_bf16_close(dx.v, ref_dx(dy, w), "dx");
  // dw is an fp32 accumulator: identical with and without rounding.
  HostF32 dw_round({kOut, kIn}, 0.25f), dw_plain({kOut, kIn}, 0.25f);
  linear_backward_weight(cpu_ctx(true), dw_round.t(), dy.t(), x.t());
  linear_backward_weight(cpu_ctx(false), dw_plain.t(), dy.t(), x.t());
  EXPECT_TRUE(bitwise_equal(dw_round.v, dw_plain.v));
}

TEST(OpsLinear, ShapeErrorsNameTheOp) {
  HostF32 x({4, 64}), w({32, 48}), y({4, 32}), w2({32, 64}), y_bad({4, 31}), dw({32, 64});
  const OpContext ctx = cpu_ctx(false);
  expect_error_naming("linear_forward", [&] { linear_forward(ctx, y.t(), x.t(), w.t()); });
  expect_error_naming("linear_forward", [&] { linear_forward(ctx, y_bad.t(), x.t(), w2.t()); });
  expect_error_naming("linear_backward_input", [&] { linear_backward_input(ctx, x.t(), y_bad.t(), w2.t()); });
  expect_error_naming("linear_backward_weight", [&] { linear_backward_weight(ctx, dw.t(), y.t(), w.t()); });
  HostI32 xi({4, 64});
  expect_error_naming("linear_forward", [&] { linear_forward(ctx, y.t(), xi.t(), w2.t()); });
}

}  // namespace
}  // namespace pl::optest
