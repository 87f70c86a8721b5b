// The telemetry ops on a quantized copy, on every backend, over every quantize case
// (quant_test_util.h): quant_stats against a direct computation from the copy's codes and scales and
// the values it was quantized from (CPU), and the GPU's quant_stats of the GPU's copy against the
// CPU's (amax and the counts exact, the error to 1e-9 relative: double sums in another order);
// columnwise_source (the values a columnwise copy is quantized from: xᵀ or RHT(xᵀ)) against an
// independent transpose/RHT (CPU) and bit-exact with the CPU on the GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "backend/quantize.h"
#include "op_test_util.h"
#include "quant_test_util.h"
#include "test_util.h"

namespace pl {
namespace {

using namespace qtest;

// quant_stats computed directly: amax the copy's slot (and max |ref| where ref has no NaN); the
// elements whose code is ±max; the blocks with a nonzero max |ref| whose scale is zero (NVFP4: an
// E4M3 zero, MXFP8: the floor code 0; per tensor: a nonzero element decoded to zero); ‖x̂ − x‖/‖x‖
// with x̂ the reference dequantization.
struct Direct {
  QuantStats s;
  bool ref_has_nan = false;
  float ref_amax = 0.0f;
  int64_t saturated = 0, normal_scale_blocks = 0;  // for the NVFP4 saturation claim below
};

Direct direct_stats(const QuantizedCopy& c, const std::vector<float>& ref) {
  Direct d;
  const int64_t blk = quant_block_size(c.format);
  const std::vector<float> deq = reference_dequantize(c);
  double err2 = 0.0, ref2 = 0.0;
  int64_t underflow = 0, counted = 0;
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t k0 = 0; k0 < c.cols; k0 += blk) {
      float bamax = 0.0f;
      bool all_zero = true;
      for (int64_t k = k0; k < k0 + blk; ++k) {
        const size_t i = static_cast<size_t>(r * c.cols + k);
        d.saturated += std::fabs(ref_code_value(c, r, k)) == ref_code_max(c.format);
        err2 += (static_cast<double>(deq[i]) - ref[i]) * (static_cast<double>(deq[i]) - ref[i]);
        ref2 += static_cast<double>(ref[i]) * ref[i];
        d.ref_has_nan = d.ref_has_nan || std::isnan(ref[i]);
        bamax = std::fmax(bamax, std::fabs(ref[i]));
        all_zero = all_zero && deq[i] == 0.0f;
      }
      d.ref_amax = std::fmax(d.ref_amax, bamax);
      if (c.format == QuantFormat::NVFP4 && ref_e4m3(block_scale_byte(c, r, k0)) >= 0x1p-6f) ++d.normal_scale_blocks;
      if (!(bamax > 0.0f)) continue;
      ++counted;
      if (c.format == QuantFormat::NVFP4)
        underflow += ref_e4m3(block_scale_byte(c, r, k0)) == 0.0f;
      else if (c.format == QuantFormat::MXFP8)
        underflow += block_scale_byte(c, r, k0) == 0;
      else
        underflow += all_zero;
    }
  d.s.amax = c.amax.f32()[0];
  d.s.saturated_fraction = static_cast<double>(d.saturated) / static_cast<double>(c.rows * c.cols);
  d.s.underflow_fraction = counted ? static_cast<double>(underflow) / static_cast<double>(counted) : 0.0;
  d.s.relative_error = ref2 > 0.0 ? std::sqrt(err2 / ref2) : 0.0;
  return d;
}

// a's relative error equals b's to 1e-9 relative, or both are the same non-finite value.
void expect_same_error(double a, double b, const std::string& what) {
  if (!std::isfinite(b))  // NaN/Inf inputs
    EXPECT_TRUE(a == b || (std::isnan(a) && std::isnan(b))) << what << ": " << a << " vs " << b;
  else
    EXPECT_NEAR(a, b, 1e-9 * b) << what;
}

class QuantStatsOp : public optest::OnBackend {};

TEST_P(QuantStatsOp, EveryQuantizeCaseMatchesADirectComputation) {
  for (QuantCase& qc : quant_cases()) {
    SCOPED_TRACE(qc.name());
    const QuantFormat f = qc.o.format;
    Quantized cpu;
    quantize_case(cpu, qc, Device::CPU);
    if (!on_cuda()) {
      for (auto [c, col] : made_copies(cpu, qc.o)) {
        const std::string name = col ? "columnwise" : "rowwise";
        const QuantStats s = quant_stats(cpu_ctx(true), *c, f, cpu.source(col));
        const Direct d = direct_stats(*c, floats_of(cpu.source(col)));
        EXPECT_EQ(num::float_bits(static_cast<float>(s.amax)), num::float_bits(static_cast<float>(d.s.amax))) << name;
        if (!d.ref_has_nan) {
          EXPECT_EQ(s.amax, d.ref_amax) << name << ": amax is max |source|";
        }
        EXPECT_EQ(s.saturated_fraction, d.s.saturated_fraction) << name;
        EXPECT_EQ(s.underflow_fraction, d.s.underflow_fraction) << name;
        expect_same_error(s.relative_error, d.s.relative_error, name + " relative error");
        // NVFP4 round-to-nearest: each block with a normal E4M3 scale (relative rounding <= 2^-4)
        // puts its largest element within [5.65, 6.4] before rounding, so on the code ±6: at least
        // one saturated element per 1x16 block, or per 16x16 tile (16 blocks).
        if (f == QuantFormat::NVFP4 && !qc.o.stochastic && !d.ref_has_nan && std::isfinite(d.ref_amax)) {
          EXPECT_GE(d.saturated * (qc.o.block_2d ? 16 : 1), d.normal_scale_blocks) << name;
        }
      }
      continue;
    }
    Quantized gpu;
    quantize_case(gpu, qc, Device::CUDA);
    const auto cc = made_copies(cpu, qc.o), gc = made_copies(gpu, qc.o);
    for (size_t i = 0; i < cc.size(); ++i) {
      const std::string name = cc[i].second ? "columnwise" : "rowwise";
      const QuantStats sc = quant_stats(cpu_ctx(true), *cc[i].first, f, cpu.source(cc[i].second));
      const QuantStats sg = quant_stats(test::cuda_ctx(), *gc[i].first, f, gpu.source(gc[i].second));
      EXPECT_EQ(num::float_bits(static_cast<float>(sc.amax)), num::float_bits(static_cast<float>(sg.amax))) << name;
      EXPECT_EQ(sc.saturated_fraction, sg.saturated_fraction) << name;
      EXPECT_EQ(sc.underflow_fraction, sg.underflow_fraction) << name;
      expect_same_error(sg.relative_error, sc.relative_error, name + " relative error (gpu vs cpu)");
    }
  }
}

// The telemetry of a linear layer's NVFP4 operands (Gaussian BF16 data, the default recipe: 16x16
// weight tiles, RHT on the columnwise copies, SR on dy) on this backend: each nonzero block's largest
// element lands on the code ±6 (its block scale is chosen so), so at least one element per block (16,
// or 256 for the 16x16 weight tiles) sits at ±max; Gaussian data puts ~11% of 1x16-block elements
// there. The error is that of 4-bit codes; no block scale underflows.
TEST_P(QuantStatsOp, Nvfp4GaussianOperandsHaveTheExpectedTelemetry) {
  const int64_t T = 64, in = 64, out = 32;  // tests/model/test_linear_layer.cpp's Fixture
  QuantizeOptions wo = options(QuantFormat::NVFP4, true, true), xo = options(QuantFormat::NVFP4, true, true),
                  go = options(QuantFormat::NVFP4, true, true);
  wo.block_2d = true;
  xo.rht_columnwise = go.rht_columnwise = true;
  go.stochastic = true;
  go.seed = 0x5EED;
  go.counter = 3;
  QuantCase cases[] = {{"w", test::random_bf16(out, in, 2, 0.05f), wo},
                       {"x", test::random_bf16(T, in, 1, 1.0f), xo},
                       {"dy", test::random_bf16(T, out, 3, 1e-3f), go}};
  for (QuantCase& qc : cases) {
    Quantized q;
    quantize_case(q, qc, GetParam());
    for (auto [c, col] : made_copies(q, qc.o)) {
      const std::string operand = qc.group + (col ? " columnwise" : " rowwise");
      SCOPED_TRACE(operand);
      const QuantStats s = quant_stats(on_cuda() ? test::cuda_ctx() : cpu_ctx(true), *c, qc.o.format, q.source(col));
      EXPECT_GT(s.amax, 0.0);
      EXPECT_GT(s.relative_error, 0.01);
      EXPECT_LT(s.relative_error, 0.2);
      EXPECT_GE(s.saturated_fraction, qc.o.block_2d ? 1.0 / 256 : 1.0 / 16);
      EXPECT_LE(s.saturated_fraction, 0.25);
      EXPECT_EQ(s.underflow_fraction, 0.0);
    }
  }
}

PL_INSTANTIATE_BACKENDS(QuantStatsOp);

// ---- columnwise_source --------------------------------------------------------------------------------

class ColumnwiseSource : public optest::OnBackend {};

// The source on this backend of x given as dtype (the CPU takes the same values as F32).
std::vector<float> source_on(Device d, Mat& x, DType dtype, bool rht) {
  if (d == Device::CUDA) {
    test::DeviceTensor dx = test::to_device(x.v, {x.rows, x.cols}, dtype);
    test::DeviceTensor out = test::device_tensor({x.cols, x.rows}, DType::F32);
    columnwise_source(test::cuda_ctx(), out.t, dx.t, rht);
    return test::to_host_floats(out.t);
  }
  Mat out(x.cols, x.rows);
  columnwise_source(cpu_ctx(true), out.t(), x.t(), rht);
  return out.v;
}

// CPU: the independent transpose/RHT; GPU: bit-exact (or both NaN) with the CPU.
void check_source(Device d, Mat& x, DType dtype, bool rht, const std::string& what) {
  if (d == Device::CUDA)
    expect_same_floats(source_on(Device::CPU, x, dtype, rht), source_on(d, x, dtype, rht), what + " (gpu vs cpu)");
  else
    expect_same_floats(reference_columnwise_source(x, rht).v, source_on(d, x, dtype, rht), what);
}

TEST_P(ColumnwiseSource, EveryColumnwiseQuantizeCaseIsTheTransposeOrItsRht) {
  for (QuantCase& qc : quant_cases()) {
    if (!qc.o.columnwise) continue;
    SCOPED_TRACE(qc.name());
    check_source(GetParam(), qc.x, qc.dtype, qc.o.rht_columnwise, "columnwise_source");
  }
}

TEST_P(ColumnwiseSource, IsExactForBf16AndF32Inputs) {
  for (DType dt : {DType::BF16, DType::F32}) {
    for (auto [r, c, rht] : {std::tuple<int64_t, int64_t, bool>{112, 48, true}, {112, 48, false}, {37, 53, false},
                             {256, 130, true}}) {
      Mat x = dt == DType::BF16 ? test_input(r, c, 61) : f32_input(r, c, 62);
      check_source(GetParam(), x, dt, rht,
                   std::string("columnwise_source ") + dtype_name(dt) + " [" + std::to_string(r) + ", " +
                       std::to_string(c) + "]" + (rht ? " rht" : ""));
    }
  }
}

PL_INSTANTIATE_BACKENDS(ColumnwiseSource);

TEST(OpsQuantStats, BadArgumentsAreOneLineErrors) {
  std::vector<Buffer> owner;
  QuantizedTensor q = allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, 32, 64, true, false);
  Mat wrong(32, 48);
  test::expect_one_line_error([&] { quant_stats(cpu_ctx(true), q.rowwise, QuantFormat::NVFP4, wrong.t()); },
                              {"quant_stats", "[32, 48]"});
  Mat out(32, 32);
  test::expect_one_line_error([&] { columnwise_source(cpu_ctx(true), out.t(), wrong.t(), false); },
                              {"columnwise_source", "transpose"});
  Mat rows(40, 48), out_t(48, 40);
  test::expect_one_line_error([&] { columnwise_source(cpu_ctx(true), out_t.t(), rows.t(), true); },
                              {"columnwise_source", "RHT"});
}

}  // namespace
}  // namespace pl
