// A quantized linear layer's three GEMMs against double-precision products of the dequantized
// operands it must have used, and the RHT's effect on the weight gradient.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "backend/device_memory.h"
#include "backend/quantize.h"
#include "config/model_config.h"
#include "config/precision_recipe.h"
#include "core/error.h"
#include "model/linear_layer.h"
#include "log/plan_log.h"
#include "model/llama.h"
#include "model/memory_plan.h"
#include "model/precision_plan.h"
#include "matrix_util.h"
#include "numerics/bf16.h"

namespace pl {
namespace {

using test::Mat;
using test::random_bf16;
using test::rel_diff;
using test::transpose;
Mat nt(const Mat& a, const Mat& b) { return test::matmul_nt(a, b); }

// Quantizes m the way the layer does for one operand and returns the dequantized copy.
Mat dq(const Mat& m, QuantFormat f, bool columnwise, bool block_2d, bool rht) {
  std::vector<Buffer> owner;
  Mat src = m;
  QuantizedTensor q = allocate_quantized(owner, Device::CPU, f, m.rows, m.cols, !columnwise, columnwise);
  QuantizeOptions o{f};
  o.rowwise = !columnwise;
  o.columnwise = columnwise;
  o.block_2d = block_2d;
  o.rht_columnwise = rht;
  quantize(OpContext{}, q, src.t(), o);
  const QuantizedCopy& c = columnwise ? q.columnwise : q.rowwise;
  Mat out(c.rows, c.cols);
  dequantize(OpContext{}, out.t(), c, f);
  return out;
}

// A layer's plan as make_precision_plan makes it for format f (FP8: "hybrid", E5M2 dy, unless dy is given).
LinearPlan linear_plan(std::optional<QuantFormat> f, int64_t in, int64_t out, Nvfp4Options nv = {},
                       std::optional<QuantFormat> dy = {}) {
  LinearPlan p;
  p.in = in;
  p.out = out;
  if (!f) return p;
  p.x = p.w = f;
  p.dy = dy ? dy : (*f == QuantFormat::FP8_E4M3 ? QuantFormat::FP8_E5M2 : *f);
  if (*f == QuantFormat::NVFP4) {
    p.rht = nv.random_hadamard_transform;
    p.stochastic_rounding = nv.stochastic_rounding;
    p.weight_2d = nv.weight_2d_quantization;
  }
  return p;
}

struct Fixture {
  const int64_t T = 64, in = 64, out = 32;
  LinearPlan plan(QuantFormat f, Nvfp4Options nv, std::optional<QuantFormat> dy = {}) const {
    return linear_plan(f, in, out, nv, dy);
  }
  std::vector<Buffer> owner;
  std::vector<float> sa, sb;
  Mat x = random_bf16(T, in, 1, 1.0f), w = random_bf16(out, in, 2, 0.05f), dy = random_bf16(T, out, 3, 1e-3f);
  Fixture() : sa(static_cast<size_t>(LinearLayer::scratch_elements(T, in, out))), sb(sa.size()) {}
  std::vector<std::unique_ptr<LinearWorkspace>> workspaces;
  LinearLayer make(QuantFormat f, Nvfp4Options nv, std::optional<QuantFormat> dy = {}) {
    const LinearPlan p = plan(f, nv, dy);
    workspaces.push_back(std::make_unique<LinearWorkspace>(LinearWorkspace::allocate(owner, Device::CPU, p, T)));
    return LinearLayer(p, T, 0, Device::CPU, owner, workspaces.back().get(),
                       Tensor(sa.data(), {static_cast<int64_t>(sa.size())}, DType::F32),
                       Tensor(sb.data(), {static_cast<int64_t>(sb.size())}, DType::F32));
  }
};

TEST(ModelLinearLayer, Nvfp4GemmsUseTheRecipeOperands) {
  Fixture fx;
  Nvfp4Options nv;
  nv.stochastic_rounding = false;  // deterministic so the test can rebuild the operands
  LinearLayer lin = fx.make(QuantFormat::NVFP4, nv);
  OpContext exact;
  exact.round_bf16 = false;
  lin.prepare_weight(exact, fx.w.t());
  Mat y(fx.T, fx.out), dx(fx.T, fx.in), dw(fx.out, fx.in, 0.5f);
  lin.forward(exact, y.t(), fx.x.t(), fx.w.t());
  lin.backward(exact, dx.t(), dw.t(), fx.dy.t(), fx.x.t(), fx.w.t(), MicroBatchOptions{});

  const QuantFormat F = QuantFormat::NVFP4;
  // fprop: X rowwise 1x16 · W rowwise 16x16
  EXPECT_LT(rel_diff(y, nt(dq(fx.x, F, false, false, false), dq(fx.w, F, false, true, false))), 1e-6);
  // dgrad: dY rowwise · (Wᵀ from the same 2D quantization)ᵀ
  EXPECT_LT(rel_diff(dx, nt(dq(fx.dy, F, false, false, false), dq(fx.w, F, true, true, false))), 1e-6);
  // wgrad: RHT(dYᵀ) · RHT(Xᵀ)ᵀ, accumulated onto the 0.5 already in dw
  Mat ref = nt(dq(fx.dy, F, true, false, true), dq(fx.x, F, true, false, true));
  for (float& v : ref.v) v += 0.5f;
  EXPECT_LT(rel_diff(dw, ref), 1e-6);
  // and all three are near the unquantized products (the recipe's quantization error)
  EXPECT_LT(rel_diff(y, nt(fx.x, fx.w)), 0.2);
  EXPECT_LT(rel_diff(dx, nt(fx.dy, transpose(fx.w))), 0.2);
}

TEST(ModelLinearLayer, WgradWithRhtEqualsWgradWithoutItUpToQuantizationError) {
  Fixture fx;
  OpContext exact;
  exact.round_bf16 = false;
  const Mat exact_dw = nt(transpose(fx.dy), transpose(fx.x));
  Mat dw_rht(fx.out, fx.in), dw_plain(fx.out, fx.in);
  for (bool rht : {true, false}) {
    Nvfp4Options nv;
    nv.random_hadamard_transform = rht;
    LinearLayer lin = fx.make(QuantFormat::NVFP4, nv);
    lin.prepare_weight(exact, fx.w.t());
    Mat y(fx.T, fx.out), dx(fx.T, fx.in);
    lin.forward(exact, y.t(), fx.x.t(), fx.w.t());  // backward reuses the forward's amax of x
    lin.backward(exact, dx.t(), (rht ? dw_rht : dw_plain).t(), fx.dy.t(), fx.x.t(), fx.w.t(), MicroBatchOptions{3});
  }
  // R·Rᵀ = I: no inverse transform is needed, both estimate dYᵀX.
  EXPECT_LT(rel_diff(dw_rht, exact_dw), 0.25);
  EXPECT_LT(rel_diff(dw_plain, exact_dw), 0.25);
  EXPECT_GT(rel_diff(dw_rht, dw_plain), 0.0) << "the transform must change the quantized operands";
}

TEST(ModelLinearLayer, Fp8AndMxfp8LayersAreCloseToBf16) {
  for (QuantFormat f : {QuantFormat::FP8_E4M3, QuantFormat::MXFP8}) {
    SCOPED_TRACE(quant_format_name(f));
    Fixture fx;
    OpContext exact;
    exact.round_bf16 = false;
    LinearLayer lin = fx.make(f, Nvfp4Options{});
    lin.prepare_weight(exact, fx.w.t());
    Mat y(fx.T, fx.out), dx(fx.T, fx.in), dw(fx.out, fx.in);
    lin.forward(exact, y.t(), fx.x.t(), fx.w.t());
    lin.backward(exact, dx.t(), dw.t(), fx.dy.t(), fx.x.t(), fx.w.t(), MicroBatchOptions{});
    EXPECT_LT(rel_diff(y, nt(fx.x, fx.w)), 0.08);
    EXPECT_LT(rel_diff(dx, nt(fx.dy, transpose(fx.w))), 0.15);  // E5M2 gradients for fp8 hybrid
    EXPECT_LT(rel_diff(dw, nt(transpose(fx.dy), transpose(fx.x))), 0.15);
    EXPECT_GT(rel_diff(y, nt(fx.x, fx.w)), 0.0) << "the layer must actually quantize";
  }
}

// fp8 "e4m3" (TE Format.E4M3) quantizes dy in E4M3, "hybrid" (Format.HYBRID) in E5M2; x and W are
// E4M3 in both. E4M3's extra mantissa bit shows in the gradient GEMMs' error.
TEST(ModelLinearLayer, Fp8E4m3QuantizesGradientsInE4m3AndHybridInE5m2) {
  Fixture fx;
  const Mat exact_dx = nt(fx.dy, transpose(fx.w)), exact_dw = nt(transpose(fx.dy), transpose(fx.x));
  double err_dx[2], err_dw[2];
  for (int i = 0; i < 2; ++i) {
    const QuantFormat dy = i == 0 ? QuantFormat::FP8_E4M3 : QuantFormat::FP8_E5M2;
    SCOPED_TRACE(quant_format_name(dy));
    LinearLayer lin = fx.make(QuantFormat::FP8_E4M3, Nvfp4Options{}, dy);
    lin.prepare_weight(OpContext{}, fx.w.t());
    Mat y(fx.T, fx.out), dx(fx.T, fx.in), dw(fx.out, fx.in);
    lin.forward(OpContext{}, y.t(), fx.x.t(), fx.w.t());
    lin.backward(OpContext{}, dx.t(), dw.t(), fx.dy.t(), fx.x.t(), fx.w.t(), MicroBatchOptions{0, true});
    ASSERT_EQ(lin.stats().size(), 5u);
    for (const OperandStats& s : lin.stats())
      EXPECT_EQ(s.format, std::string(s.operand).starts_with("dy") ? dy : QuantFormat::FP8_E4M3) << s.operand;
    err_dx[i] = rel_diff(dx, exact_dx);
    err_dw[i] = rel_diff(dw, exact_dw);
  }
  EXPECT_LT(err_dx[0], err_dx[1]);
  EXPECT_LT(err_dw[0], err_dw[1]);
}

TEST(ModelLinearLayer, TheWeightIsQuantizedOncePerStepNotPerMicroBatch) {
  Fixture fx;
  LinearLayer lin = fx.make(QuantFormat::NVFP4, Nvfp4Options{});
  lin.prepare_weight(OpContext{}, fx.w.t());
  Mat y1(fx.T, fx.out), y2(fx.T, fx.out), y3(fx.T, fx.out);
  lin.forward(OpContext{}, y1.t(), fx.x.t(), fx.w.t());
  Mat w2 = fx.w;
  for (float& v : w2.v) v = num::round_bf16(v * 1.5f);
  // Until prepare_weight runs again (the trainer does it after each optimizer step), every
  // micro-batch uses the cached quantized weight, whatever the bf16 tensor now holds.
  lin.forward(OpContext{}, y2.t(), fx.x.t(), w2.t());
  EXPECT_EQ(y1.v, y2.v);
  lin.prepare_weight(OpContext{}, w2.t());
  lin.forward(OpContext{}, y3.t(), fx.x.t(), w2.t());
  EXPECT_NE(y1.v, y3.v);
}

TEST(ModelLinearLayer, TelemetryReportsEveryOperand) {
  Fixture fx;
  LinearLayer lin = fx.make(QuantFormat::NVFP4, Nvfp4Options{});
  lin.prepare_weight(OpContext{}, fx.w.t());
  Mat y(fx.T, fx.out), dx(fx.T, fx.in), dw(fx.out, fx.in);
  lin.forward(OpContext{}, y.t(), fx.x.t(), fx.w.t());
  lin.backward(OpContext{}, dx.t(), dw.t(), fx.dy.t(), fx.x.t(), fx.w.t(), MicroBatchOptions{0, true});
  ASSERT_EQ(lin.stats().size(), 5u);
  for (const OperandStats& s : lin.stats()) {
    SCOPED_TRACE(s.operand);
    EXPECT_GT(s.stats.amax, 0.0);
    EXPECT_GT(s.stats.relative_error, 0.01);
    EXPECT_LT(s.stats.relative_error, 0.2);
    // What quant_stats gives on these operands (saturation per block, error range) is checked at op
    // level: Cpu/QuantStatsOp.Nvfp4GaussianOperandsHaveTheExpectedTelemetry (tests/ops/test_quant_stats.cpp).
    EXPECT_GT(s.stats.saturated_fraction, 0.0);
    EXPECT_EQ(s.stats.underflow_fraction, 0.0);
  }
}

// Layers of one shape share one workspace of x/dy copies; each keeps x's amaxes itself. Interleaving
// two layers (forward A, forward B, backward B, backward A, as a model runs them) must give exactly
// the gradients of running each alone: a shared amax slot would hand A's backward B's amax.
TEST(ModelLinearLayer, EachLayerKeepsItsOwnAmaxAcrossAForwardOfAnotherLayer) {
  for (QuantFormat f : {QuantFormat::NVFP4, QuantFormat::FP8_E4M3}) {
    SCOPED_TRACE(quant_format_name(f));
    Fixture fx;
    const LinearPlan p = fx.plan(f, Nvfp4Options{});  // RHT and SR on: the wgrad copy of x uses the RHT amax
    auto ws = std::make_unique<LinearWorkspace>(LinearWorkspace::allocate(fx.owner, Device::CPU, p, fx.T));
    auto make = [&] {
      return LinearLayer(p, fx.T, 0, Device::CPU, fx.owner, ws.get(),
                         Tensor(fx.sa.data(), {static_cast<int64_t>(fx.sa.size())}, DType::F32),
                         Tensor(fx.sb.data(), {static_cast<int64_t>(fx.sb.size())}, DType::F32));
    };
    LinearLayer a = make(), b = make();
    Mat xb = random_bf16(fx.T, fx.in, 11, 30.0f);  // a much larger amax than fx.x
    a.prepare_weight(OpContext{}, fx.w.t());
    b.prepare_weight(OpContext{}, fx.w.t());
    auto run_alone = [&](LinearLayer& l, Mat& x, Mat& dw) {
      Mat y(fx.T, fx.out), dx(fx.T, fx.in);
      l.forward(OpContext{}, y.t(), x.t(), fx.w.t());
      l.backward(OpContext{}, dx.t(), dw.t(), fx.dy.t(), x.t(), fx.w.t(), MicroBatchOptions{4});
    };
    Mat dwa_alone(fx.out, fx.in), dwb_alone(fx.out, fx.in);
    run_alone(a, fx.x, dwa_alone);
    run_alone(b, xb, dwb_alone);
    Mat ya(fx.T, fx.out), yb(fx.T, fx.out), dxa(fx.T, fx.in), dxb(fx.T, fx.in), dwa(fx.out, fx.in), dwb(fx.out, fx.in);
    a.forward(OpContext{}, ya.t(), fx.x.t(), fx.w.t());
    b.forward(OpContext{}, yb.t(), xb.t(), fx.w.t());
    b.backward(OpContext{}, dxb.t(), dwb.t(), fx.dy.t(), xb.t(), fx.w.t(), MicroBatchOptions{4});
    a.backward(OpContext{}, dxa.t(), dwa.t(), fx.dy.t(), fx.x.t(), fx.w.t(), MicroBatchOptions{4});
    EXPECT_EQ(dwa.v, dwa_alone.v);
    EXPECT_EQ(dwb.v, dwb_alone.v);
    EXPECT_NE(dwa.v, dwb.v);
  }
}

// The producers' amax (issue 40): a layer whose recipe scales per tensor without an RHT'd copy (FP8 current
// scaling, NVFP4 without RHT) takes x's and dy's amax from their producers (producer_x_amax / _dy_amax, which
// RMSNorm and SwiGLU fill: their ops' tests check the value); given the right value it gives the GEMMs of
// computing it bit for bit, and it does read the slots (an amax 1.37 times too large changes y and dx). The other
// recipes take none.
TEST(ModelLinearLayer, TheProducersAmaxGivesTheSameBitsAndIsRead) {
  const auto amax_of = [](const Mat& m) {
    float a = 0.0f;
    for (float v : m.v) a = std::max(a, std::fabs(v));
    return a;
  };
  Nvfp4Options no_rht;
  no_rht.random_hadamard_transform = false;
  for (const auto& [f, nv] : {std::pair{QuantFormat::FP8_E4M3, Nvfp4Options{}}, std::pair{QuantFormat::NVFP4, no_rht}}) {
    SCOPED_TRACE(quant_format_name(f));
    Fixture fx;
    LinearLayer computed = fx.make(f, nv), given = fx.make(f, nv);
    ASSERT_EQ(computed.producer_x_amax().numel(), 2);
    ASSERT_EQ(computed.producer_dy_amax().numel(), 2);
    const auto run = [&](LinearLayer& l, float x_scale, float dy_scale, bool give) {
      l.prepare_weight(OpContext{}, fx.w.t());
      if (give) {
        const float xa = amax_of(fx.x) * x_scale, da = amax_of(fx.dy) * dy_scale;
        const float xs[2] = {xa, xa}, ds[2] = {da, da};
        copy_from_host(l.producer_x_amax(), xs);
        copy_from_host(l.producer_dy_amax(), ds);
      }
      Mat y(fx.T, fx.out), dx(fx.T, fx.in), dw(fx.out, fx.in);
      l.forward(OpContext{}, y.t(), fx.x.t(), fx.w.t(), give);
      l.backward(OpContext{}, dx.t(), dw.t(), fx.dy.t(), fx.x.t(), fx.w.t(), MicroBatchOptions{3}, give);
      return std::vector<Mat>{y, dx, dw};
    };
    const std::vector<Mat> ref = run(computed, 1, 1, false), same = run(given, 1, 1, true);
    const char* names[] = {"y", "dx", "dw"};
    for (int i = 0; i < 3; ++i) EXPECT_EQ(same[i].v, ref[i].v) << names[i];
    // Off by a factor that is not a power of two (a power of two would only shift every scale exactly).
    const std::vector<Mat> x_off = run(given, 1.37f, 1, true), dy_off = run(given, 1, 1.37f, true);
    EXPECT_NE(x_off[0].v, ref[0].v) << "y does not read x's given amax";
    EXPECT_NE(dy_off[1].v, ref[1].v) << "dx does not read dy's given amax";
  }
  Fixture fx;
  for (const auto& [f, nv] : {std::pair{QuantFormat::NVFP4, Nvfp4Options{}}, std::pair{QuantFormat::MXFP8, Nvfp4Options{}}}) {
    LinearLayer l = fx.make(f, nv);
    EXPECT_EQ(l.producer_x_amax().data, nullptr) << quant_format_name(f);
    EXPECT_EQ(l.producer_dy_amax().data, nullptr) << quant_format_name(f);
    Mat y(fx.T, fx.out);
    l.prepare_weight(OpContext{}, fx.w.t());
    EXPECT_THROW(l.forward(OpContext{}, y.t(), fx.x.t(), fx.w.t(), true), Error) << quant_format_name(f);
  }
  LinearPlan delayed = linear_plan(QuantFormat::FP8_E4M3, fx.in, fx.out);
  delayed.amax_history_len = 4;
  std::vector<Buffer> owner;
  LinearWorkspace ws = LinearWorkspace::allocate(owner, Device::CPU, delayed, fx.T);
  const LinearLayer d(delayed, fx.T, 0, Device::CPU, owner, &ws,
                      Tensor(fx.sa.data(), {static_cast<int64_t>(fx.sa.size())}, DType::F32),
                      Tensor(fx.sb.data(), {static_cast<int64_t>(fx.sb.size())}, DType::F32));
  EXPECT_EQ(d.producer_x_amax().data, nullptr) << "delayed scaling records its amax while casting";
  const LinearLayer bf16(linear_plan({}, fx.in, fx.out), fx.T, 0, Device::CPU, owner, nullptr, Tensor{}, Tensor{});
  EXPECT_EQ(bf16.producer_x_amax().data, nullptr);
}

// What a layer needs besides its copies, per execution (LinearLayer::scratch_need).
TEST(ModelLinearLayer, ScratchFollowsTheExecutionMode) {
  const int64_t T = 4096, in = 4096, out = 28672, full = std::max({T * in, T * out, in * out});
  ASSERT_EQ(LinearLayer::scratch_elements(T, in, out), full);
  auto need = [&](std::optional<QuantFormat> f, Device d, int sm, bool telemetry) {
    LinearExecution e;
    e.device = d;
    e.gpu_sm = sm;
    e.telemetry = telemetry;
    const LinearLayer::ScratchNeed n = LinearLayer::scratch_need(linear_plan(f, in, out), e, T);
    return std::pair{n.a, n.b};
  };
  using P = std::pair<int64_t, int64_t>;
  for (bool tel : {false, true}) {
    // The CPU emulates everything in FP32, whatever the GPU or telemetry.
    EXPECT_EQ(need(QuantFormat::NVFP4, Device::CPU, 100, tel), (P{full, full}));
    // sm_90 emulates NVFP4 and MXFP8 (BF16 operands: half the bytes) and runs FP8 natively.
    EXPECT_EQ(need(QuantFormat::NVFP4, Device::CUDA, 90, tel), (P{tel ? full : full / 2, full / 2}));
    EXPECT_EQ(need(QuantFormat::MXFP8, Device::CUDA, 90, tel), (P{tel ? full : full / 2, full / 2}));
    EXPECT_EQ(need(QuantFormat::FP8_E4M3, Device::CUDA, 90, tel), (P{tel ? full : 0, 0}));
    // sm_100 runs all natively; sm_80 emulates FP8 too; sm_120 emulates the block-scaled formats.
    EXPECT_EQ(need(QuantFormat::NVFP4, Device::CUDA, 100, tel), (P{tel ? full : 0, 0}));
    EXPECT_EQ(need(QuantFormat::FP8_E4M3, Device::CUDA, 80, tel), (P{tel ? full : full / 2, full / 2}));
    EXPECT_EQ(need(QuantFormat::NVFP4, Device::CUDA, 120, tel), (P{tel ? full : full / 2, full / 2}));
    EXPECT_EQ(need(std::nullopt, Device::CUDA, 90, tel), (P{0, 0}));
  }
}

// The model plans the scratch of the execution it will run: on a native GPU without telemetry no
// GEMM scratch at all; the plan says which GPU it assumed.
TEST(ModelLinearLayer, TheMemoryPlanCountsTheScratchOfTheExecutionMode) {
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama3_8b.json");
  const PrecisionPlan plan =
      make_precision_plan(m, load_precision_recipe(std::string(PL_CONFIG_DIR) + "/recipes/bf16_with_nvfp4_mixed.json"));
  auto plan_for = [&](int sm, bool telemetry) {  // nothing is allocated, no GPU is touched
    RunLayout o;
    o.gpu_sm = sm;
    o.quant_telemetry = telemetry;
    return plan_memory(m, 1, 4096, Device::CUDA, plan, o, 0);
  };
  const int64_t T = 4096, h = m.hidden_size, f = m.ffn_hidden_size;
  // The largest operand of the four linears: fc1's weight [2f, h] and its x/dy copies [T, 2f].
  const double full = 4.0 * static_cast<double>(std::max({T * h, T * 2 * f, h * 2 * f, T * f}));
  const MemoryPlan hopper = plan_for(90, false), blackwell = plan_for(100, false), hopper_tel = plan_for(90, true),
                   blackwell_tel = plan_for(100, true);
  // Each scratch tensor is rounded up to 256 bytes in the arena.
  EXPECT_NEAR(hopper.activations - blackwell.activations, full, 512.0);                // two BF16 operand buffers
  EXPECT_NEAR(blackwell_tel.activations - blackwell.activations, full, 256.0);         // the FP32 reference
  EXPECT_NEAR(hopper_tel.activations - blackwell.activations, 1.5 * full, 512.0);      // both
  EXPECT_EQ(hopper.quantized, blackwell.quantized);
  EXPECT_NE(hopper.gemm_note.find("sm_90"), std::string::npos) << hopper.gemm_note;
  EXPECT_NE(hopper.gemm_note.find("emulated"), std::string::npos) << hopper.gemm_note;
  EXPECT_NE(blackwell.gemm_note.find("native"), std::string::npos) << blackwell.gemm_note;
  // Without a GPU opened or named, the plan assumes the default and says so.
  const MemoryPlan d = plan_memory(m, 1, 4096, Device::CUDA, plan, RunLayout{}, 0);
  EXPECT_NE(d.gemm_note.find("sm_" + std::to_string(kPlanDefaultSm)), std::string::npos) << d.gemm_note;
  EXPECT_NE(d.gemm_note.find("default"), std::string::npos) << d.gemm_note;
  EXPECT_EQ(log::memory_plan_lines(d.categories(), d.gemm_note).back(), d.gemm_note);
  // A GPU opened (sm_100) is used and named when no sm is given.
  EXPECT_NE(plan_memory(m, 1, 4096, Device::CUDA, plan, RunLayout{}, 100).gemm_note.find("sm_100 (this GPU)"),
            std::string::npos);
  // The CPU plan has no such note (its lines are unchanged).
  EXPECT_TRUE(plan_memory(m, 1, 4096, Device::CPU, plan, RunLayout{}, 0).gemm_note.empty());
}

}  // namespace
}  // namespace pl
