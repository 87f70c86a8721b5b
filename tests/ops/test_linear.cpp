// Linear layer GEMMs against double references: y = x wᵀ, dx = dy w, dw += dyᵀ x. Cpu/Linear.* and
// Cuda/Linear.* run the same cases on each backend (OpenBLAS, cuBLASLt; the GPU also against the CPU
// backend); OpsLinear.* are CPU-only (plain FP32, errors), CudaLinear.* GPU-only.
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

constexpr int64_t kLinearT = 37, kIn = 48, kOut = 29;

TEST(OpsLinear, ForwardMatchesDouble) {
  std::mt19937 rng(101);
  HostF32 x = random_f32({kLinearT, kIn}, rng), w = random_f32({kOut, kIn}, rng), y({kLinearT, kOut}, 7.0f);
  linear_forward(cpu_ctx(false), y.t(), x.t(), w.t());
  expect_close(y.v, ref_matmul_nt(x, w), 1e-5, "y");
}

TEST(OpsLinear, BackwardInputMatchesDoubleAndOverwrites) {
  std::mt19937 rng(102);
  HostF32 dy = random_f32({kLinearT, kOut}, rng), w = random_f32({kOut, kIn}, rng), dx({kLinearT, kIn}, 7.0f);
  linear_backward_input(cpu_ctx(false), dx.t(), dy.t(), w.t());
  expect_close(dx.v, ref_dx(dy, w), 1e-5, "dx");
}

TEST(OpsLinear, BackwardWeightAccumulates) {
  std::mt19937 rng(103);
  HostF32 dy = random_f32({kLinearT, kOut}, rng), x = random_f32({kLinearT, kIn}, rng);
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

// ---- on every backend (Cpu/ and Cuda/Linear.*) ----------------------------------------------------

class Linear : public OnBackend {};
PL_INSTANTIATE_BACKENDS(Linear);

struct LinearShape {
  int64_t T, in, out;
  std::string name(const char* op) const {
    return std::string(op) + " T=" + std::to_string(T) + " in=" + std::to_string(in) + " out=" + std::to_string(out);
  }
};
const LinearShape kLinearShapes[] = {{kLinearT, kIn, kOut}, {64, 256, 128}, {37, 40, 24}, {7, 19, 5}, {128, 512, 384}};

HostF32 bf16_normal(std::vector<int64_t> dims, float scale, uint32_t seed) {
  HostF32 h(std::move(dims));
  h.v = randn_bf16(h.size(), scale, seed);
  return h;
}

// The GEMMs with round_bf16 on BF16 operands (FP32 accumulation). Every backend: y and dx are BF16
// values, and every output is within the GEMM bound of gemm_test_util.h of the exact (double) result:
// that bound covers one BF16 rounding and any FP32 summation order on each side. The CPU: y and dx also
// within BF16 rounding of double, dw identical with and without rounding. The GPU (cuBLASLt): within
// the same bound of the CPU backend (OpenBLAS).
void check_gemm(const std::vector<float>& got, const std::vector<double>& ref, const std::vector<double>& mag,
                bool bf16_out, bool cpu, const std::string& what) {
  if (bf16_out) expect_bf16_representable(got, what);
  if (bf16_out && cpu) expect_bf16_close(got, ref, what);
  expect_gemm_close(got, std::vector<float>(ref.begin(), ref.end()), mag, bf16_out ? kBf16OutRel : kF32OutRel,
                    kBf16AccRel, what + " vs double");
}
const auto kBf16Bound = [](const std::vector<double>& mag, const std::string& what) {
  return [&mag, what](const std::vector<float>& gpu, const std::vector<float>& cpu) {
    expect_gemm_close(gpu, cpu, mag, kBf16OutRel, kBf16AccRel, what);
  };
};

TEST_P(Linear, ForwardRoundBf16) {
  for (const LinearShape& s : kLinearShapes) {
    const std::string what = s.name("linear_forward");
    // x lives at row 1 of a [T+1, in] buffer, so its pointer is not 256-byte aligned (exercises the
    // alignment preferences of the algorithm cache).
    HostF32 xbig = bf16_normal({s.T + 1, s.in}, 1.0f, 11), w = bf16_normal({s.out, s.in}, 0.05f, 12), x({s.T, s.in});
    x.v.assign(xbig.v.begin() + s.in, xbig.v.end());
    const std::vector<double> mag = abs_products(x.v, w.v, s.T, s.out, s.in);
    const std::vector<float> y = run_checked(GetParam(), [&](Backend& k) {
      std::vector<float> out(s.T * s.out, 7.0f);
      linear_forward(k.ctx(), k.put(out, {s.T, s.out}, DType::BF16),
                     k.put(xbig.v, {s.T + 1, s.in}, DType::BF16).rows(1, s.T), k.put(w.v, {s.out, s.in}, DType::BF16));
      return k.get(out);
    }, kBf16Bound(mag, what));
    check_gemm(y, ref_matmul_nt(x, w), mag, true, !on_cuda(), what);
  }
}

TEST_P(Linear, BackwardInputRoundBf16) {
  for (const LinearShape& s : kLinearShapes) {
    const std::string what = s.name("linear_backward_input");
    HostF32 dy = bf16_normal({s.T, s.out}, 1.0f, 21), w = bf16_normal({s.out, s.in}, 0.05f, 22);
    // dx[t][i] = Σ_o dy[t][o]·w[o][i]: b = wᵀ [in, out]
    const std::vector<double> mag = abs_products(dy.v, transpose(w.v, s.out, s.in), s.T, s.in, s.out);
    const std::vector<float> dx = run_checked(GetParam(), [&](Backend& k) {
      std::vector<float> out(s.T * s.in, 7.0f);
      linear_backward_input(k.ctx(), k.put(out, {s.T, s.in}, DType::BF16), k.put(dy.v, {s.T, s.out}, DType::BF16),
                            k.put(w.v, {s.out, s.in}, DType::BF16));
      return k.get(out);
    }, kBf16Bound(mag, what));
    check_gemm(dx, ref_dx(dy, w), mag, true, !on_cuda(), what);
  }
}

// dw is an FP32 accumulator: two accumulations (two micro-batches) onto a gradient already there.
TEST_P(Linear, BackwardWeightAccumulates) {
  for (const LinearShape& s : kLinearShapes) {
    const std::string what = s.name("linear_backward_weight");
    HostF32 dy = bf16_normal({s.T, s.out}, 1.0f, 31), x = bf16_normal({s.T, s.in}, 1.0f, 32);
    HostF32 dy2 = bf16_normal({s.T, s.out}, 1.0f, 33), dw0({s.out, s.in});
    std::mt19937 rng(34);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    for (float& v : dw0.v) v = nd(rng);
    // dw[o][i] = dw0 + Σ_t dy[t][o]·x[t][i] + Σ_t dy2[t][o]·x[t][i]: a = [dy | dy2]ᵀ, b = [x | x]ᵀ.
    std::vector<float> a2 = transpose(dy.v, s.T, s.out), b2 = transpose(x.v, s.T, s.in);
    const std::vector<float> a2b = transpose(dy2.v, s.T, s.out);
    std::vector<float> a(static_cast<size_t>(s.out * 2 * s.T)), b(static_cast<size_t>(s.in * 2 * s.T));
    for (int64_t o = 0; o < s.out; ++o)
      for (int64_t t = 0; t < s.T; ++t) {
        a[o * 2 * s.T + t] = a2[o * s.T + t];
        a[o * 2 * s.T + s.T + t] = a2b[o * s.T + t];
      }
    for (int64_t i = 0; i < s.in; ++i)
      for (int64_t t = 0; t < s.T; ++t) b[i * 2 * s.T + t] = b[i * 2 * s.T + s.T + t] = b2[i * s.T + t];
    const std::vector<double> mag = abs_products(a, b, s.out, s.in, 2 * s.T, &dw0.v);
    const auto run = [&](Backend& k, bool round) {
      std::vector<float> dw = dw0.v;
      const Tensor tdw = k.put(dw, {s.out, s.in}, DType::F32), tx = k.put(x.v, {s.T, s.in}, DType::BF16);
      linear_backward_weight(k.ctx(round), tdw, k.put(dy.v, {s.T, s.out}, DType::BF16), tx);
      linear_backward_weight(k.ctx(round), tdw, k.put(dy2.v, {s.T, s.out}, DType::BF16), tx);
      return k.get(dw);
    };
    const std::vector<float> dw = run_checked(GetParam(), [&](Backend& k) { return run(k, true); },
                                              [&](const std::vector<float>& gpu, const std::vector<float>& cpu) {
      expect_gemm_close(gpu, cpu, mag, kF32OutRel, kBf16AccRel, what);
    });
    std::vector<double> ref = ref_dw(dw0, dy, x);
    const std::vector<double> second = ref_dw(HostF32({s.out, s.in}), dy2, x);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += second[i];
    check_gemm(dw, ref, mag, false, !on_cuda(), what);
    // An FP32 accumulator: a rounded dw would hold only BF16 values (the plain-FP32 run of the CPU, on
    // SGEMM, sums in another order than oneDNN, so it is no bitwise reference here).
    const auto not_bf16 = std::count_if(dw.begin(), dw.end(), [](float v) { return num::round_bf16(v) != v; });
    EXPECT_GT(not_bf16, static_cast<long>(dw.size() / 2)) << what << ": dw must not be rounded";
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
