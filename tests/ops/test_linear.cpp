// Linear layer GEMMs (OpenBLAS) against double references: y = x wᵀ, dx = dy w, dw += dyᵀ x.
#include "gemm_test_util.h"
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

// ---- CUDA: the same op on the GPU (cuBLASLt) against the CPU backend (gemm_test_util.h) ---------

struct LinearShape {
  int64_t T, in, out;
};
const LinearShape kLinearShapes[] = {{64, 256, 128}, {37, 40, 24}, {7, 19, 5}, {128, 512, 384}};

TEST(CudaLinear, ForwardMatchesCpu) {
  PL_REQUIRE_CUDA_DEVICE();
  for (const LinearShape& s : kLinearShapes) {
    const std::string what = "linear_forward T=" + std::to_string(s.T) + " in=" + std::to_string(s.in) +
                             " out=" + std::to_string(s.out);
    // x lives at row 1 of a [T+1, in] buffer, so its pointer is not 256-byte aligned (exercises the
    // alignment preferences of the algorithm cache).
    std::vector<float> xbig = randn_bf16(static_cast<size_t>((s.T + 1) * s.in), 1.0f, 11);
    std::vector<float> x(xbig.begin() + s.in, xbig.end());
    std::vector<float> w = randn_bf16(static_cast<size_t>(s.out * s.in), 0.05f, 12);
    std::vector<float> y(static_cast<size_t>(s.T * s.out));
    linear_forward(cpu_ctx(true), host_view(y, {s.T, s.out}), host_view(x, {s.T, s.in}),
                   host_view(w, {s.out, s.in}));

    DeviceTensor dxbig = to_device(xbig, {s.T + 1, s.in}, DType::BF16);
    DeviceTensor dw = to_device(w, {s.out, s.in}, DType::BF16);
    DeviceTensor dy = device_tensor({s.T, s.out}, DType::BF16);
    linear_forward(cuda_ctx(), dy.t, dxbig.t.rows(1, s.T), dw.t);
    expect_gemm_close(to_host_floats(dy.t), y, abs_products(x, w, s.T, s.out, s.in), kBf16OutRel, kBf16AccRel, what);
  }
}

TEST(CudaLinear, BackwardInputMatchesCpu) {
  PL_REQUIRE_CUDA_DEVICE();
  for (const LinearShape& s : kLinearShapes) {
    const std::string what = "linear_backward_input T=" + std::to_string(s.T) + " in=" + std::to_string(s.in) +
                             " out=" + std::to_string(s.out);
    std::vector<float> dy = randn_bf16(static_cast<size_t>(s.T * s.out), 1.0f, 21);
    std::vector<float> w = randn_bf16(static_cast<size_t>(s.out * s.in), 0.05f, 22);
    std::vector<float> dx(static_cast<size_t>(s.T * s.in));
    linear_backward_input(cpu_ctx(true), host_view(dx, {s.T, s.in}), host_view(dy, {s.T, s.out}),
                          host_view(w, {s.out, s.in}));

    DeviceTensor ddy = to_device(dy, {s.T, s.out}, DType::BF16);
    DeviceTensor dw = to_device(w, {s.out, s.in}, DType::BF16);
    DeviceTensor ddx = device_tensor({s.T, s.in}, DType::BF16);
    linear_backward_input(cuda_ctx(), ddx.t, ddy.t, dw.t);
    // dx[t][i] = Σ_o dy[t][o]·w[o][i]: b = wᵀ [in, out]
    expect_gemm_close(to_host_floats(ddx.t), dx, abs_products(dy, transpose(w, s.out, s.in), s.T, s.in, s.out),
                 kBf16OutRel, kBf16AccRel, what);
  }
}

TEST(CudaLinear, BackwardWeightAccumulatesLikeCpu) {
  PL_REQUIRE_CUDA_DEVICE();
  for (const LinearShape& s : kLinearShapes) {
    const std::string what = "linear_backward_weight T=" + std::to_string(s.T) + " in=" + std::to_string(s.in) +
                             " out=" + std::to_string(s.out);
    std::vector<float> dy = randn_bf16(static_cast<size_t>(s.T * s.out), 1.0f, 31);
    std::vector<float> x = randn_bf16(static_cast<size_t>(s.T * s.in), 1.0f, 32);
    std::vector<float> dy2 = randn_bf16(static_cast<size_t>(s.T * s.out), 1.0f, 33);
    std::mt19937 rng(34);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::vector<float> dw0(static_cast<size_t>(s.out * s.in));
    for (float& v : dw0) v = nd(rng);  // an FP32 accumulator already holding a gradient

    // Two accumulations (two micro-batches) on both backends.
    std::vector<float> dw = dw0;
    linear_backward_weight(cpu_ctx(true), host_view(dw, {s.out, s.in}), host_view(dy, {s.T, s.out}),
                           host_view(x, {s.T, s.in}));
    linear_backward_weight(cpu_ctx(true), host_view(dw, {s.out, s.in}), host_view(dy2, {s.T, s.out}),
                           host_view(x, {s.T, s.in}));

    DeviceTensor ddy = to_device(dy, {s.T, s.out}, DType::BF16);
    DeviceTensor ddy2 = to_device(dy2, {s.T, s.out}, DType::BF16);
    DeviceTensor dx = to_device(x, {s.T, s.in}, DType::BF16);
    DeviceTensor ddw = to_device(dw0, {s.out, s.in}, DType::F32);
    linear_backward_weight(cuda_ctx(), ddw.t, ddy.t, dx.t);
    linear_backward_weight(cuda_ctx(), ddw.t, ddy2.t, dx.t);

    // dw[o][i] = dw0 + Σ_t dy[t][o]·x[t][i] + Σ_t dy2[t][o]·x[t][i]: a = [dy | dy2]ᵀ, b = [x | x]ᵀ.
    std::vector<float> a2 = transpose(dy, s.T, s.out), b2 = transpose(x, s.T, s.in);
    const std::vector<float> a2b = transpose(dy2, s.T, s.out);
    std::vector<float> a(static_cast<size_t>(s.out * 2 * s.T)), b(static_cast<size_t>(s.in * 2 * s.T));
    for (int64_t o = 0; o < s.out; ++o)
      for (int64_t t = 0; t < s.T; ++t) {
        a[o * 2 * s.T + t] = a2[o * s.T + t];
        a[o * 2 * s.T + s.T + t] = a2b[o * s.T + t];
      }
    for (int64_t i = 0; i < s.in; ++i)
      for (int64_t t = 0; t < s.T; ++t) b[i * 2 * s.T + t] = b[i * 2 * s.T + s.T + t] = b2[i * s.T + t];
    expect_gemm_close(to_host_floats(ddw.t), dw, abs_products(a, b, s.out, s.in, 2 * s.T, &dw0), kF32OutRel, kBf16AccRel,
                 what);
  }
}

TEST(CudaLinear, RejectsWrongDtypes) {
  PL_REQUIRE_CUDA_DEVICE();
  DeviceTensor x = device_tensor({8, 16}, DType::F32);  // must be bf16
  DeviceTensor w = device_tensor({16, 16}, DType::BF16);
  DeviceTensor y = device_tensor({8, 16}, DType::BF16);
  EXPECT_THROW(linear_forward(cuda_ctx(), y.t, x.t, w.t), Error);
}

}  // namespace
}  // namespace pl::optest
