// The roofline's measurement and judgement: op rows in the Timers (each op's time, FLOPs and bytes by
// row; an emulated quantized GEMM split into its expansion and its GEMM; the same time the category's
// timer gets), and build_report against hand-made ceilings (the ceiling at an intensity, the memory
// level by working set, speed of light, the JSON).
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <vector>

#include "backend/ops.h"
#include "backend/quantize.h"
#include "core/timers.h"
#include "roofline/report.h"

namespace pl {
namespace {

const OpRow* find_row(std::span<const OpRow> rows, const char* op, GemmPass pass = GemmPass::None) {
  for (const OpRow& r : rows)
    if (std::string(r.key.op) == op && r.key.tag.pass == pass) return &r;
  return nullptr;
}

double category_ms(std::span<const TimerReading> readings, TimerId id) {
  for (const TimerReading& r : readings)
    if (r.id == id) return r.ms;
  return 0.0;
}

TEST(OpRows, RowsHoldEachOpsCostsAndTimeOnlyWhileActive) {
  std::vector<Buffer> owner;
  const int64_t T = 48, in = 64, out = 32;
  const auto make = [&](int64_t r, int64_t c) {
    owner.emplace_back(static_cast<size_t>(r * c) * 4, Device::CPU);
    Tensor t(owner.back().data(), {r, c}, DType::F32, Device::CPU);
    std::fill(t.f32(), t.f32() + r * c, 0.25f);
    return t;
  };
  const Tensor x = make(T, in), w = make(out, in), y = make(T, out);
  Timers timers(Device::CPU, 2, /*op_rows=*/true);
  OpContext ctx{.device = Device::CPU, .timers = &timers};
  linear_forward(ctx, y, x, w);  // not active: no row
  EXPECT_TRUE(timers.op_rows().empty());
  (void)timers.read(1.0);

  timers.set_op_rows_active(true);
  const OpContext fprop = with_pass(with_linear(ctx, LinearKind::Qkv), GemmPass::Fprop);
  linear_forward(fprop, y, x, w);
  linear_forward(fprop, y, x, w);
  QuantizedTensor xq = allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, T, in, true, false);
  QuantizedTensor wq = allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, out, in, true, false);
  quantize(ctx, xq, x, {.format = QuantFormat::NVFP4});
  quantize(ctx, wq, w, {.format = QuantFormat::NVFP4});
  const Tensor sa = make(T, in), sb = make(out, in);
  quantized_gemm(with_pass(ctx, GemmPass::Dgrad), y, xq.rowwise, wq.rowwise, QuantFormat::NVFP4, false, sa, sb);
  timers.set_op_rows_active(false);
  linear_forward(fprop, y, x, w);  // after the window: not counted

  const std::span<const OpRow> rows = timers.op_rows();
  const OpRow* lin = find_row(rows, "linear_forward", GemmPass::Fprop);
  ASSERT_NE(lin, nullptr);
  EXPECT_EQ(lin->calls, 2);
  EXPECT_EQ(lin->key.tag.linear, LinearKind::Qkv);
  EXPECT_EQ(lin->key.kind, OpKind::Gemm);
  EXPECT_DOUBLE_EQ(lin->flops, 2.0 * 2.0 * T * out * in);
  EXPECT_EQ(lin->category, TimerId::GemmBf16);
  const OpRow* quant = find_row(rows, "quantize");
  ASSERT_NE(quant, nullptr);
  EXPECT_EQ(quant->calls, 2);
  const OpRow* expand = find_row(rows, "quantized_gemm:expand", GemmPass::Dgrad);
  const OpRow* gemm = find_row(rows, "quantized_gemm", GemmPass::Dgrad);
  ASSERT_NE(expand, nullptr);
  ASSERT_NE(gemm, nullptr);
  EXPECT_EQ(expand->key.kind, OpKind::Quantize);
  EXPECT_EQ(gemm->key.kind, OpKind::Gemm);
  EXPECT_DOUBLE_EQ(gemm->flops, 2.0 * T * out * in);  // the GEMM row counts 2·M·N·K only
  EXPECT_GT(expand->ms, 0.0);
  EXPECT_GT(gemm->ms, 0.0);
  // The two phases are the category's time, split: the same measurements.
  const auto readings = timers.read(1.0);
  EXPECT_NEAR(expand->ms + gemm->ms, category_ms(readings, TimerId::GemmNvfp4), 1e-9);
  EXPECT_LT(lin->ms, category_ms(readings, TimerId::GemmBf16));  // the category also timed the two calls outside
  timers.clear_op_rows();
  EXPECT_TRUE(timers.op_rows().empty());
}

TEST(OpRows, LevelZeroWithRowsPrintsNoTimers) {
  Timers timers(Device::CPU, 0, /*op_rows=*/true);
  Buffer b(64 * 4, Device::CPU);
  const Tensor x(b.data(), {64}, DType::F32, Device::CPU);
  OpContext ctx{.device = Device::CPU, .timers = &timers};
  timers.set_op_rows_active(true);
  fill_zero(ctx, x);
  timers.set_op_rows_active(false);
  ASSERT_EQ(timers.op_rows().size(), 1u);
  EXPECT_EQ(timers.op_rows()[0].calls, 1);
  EXPECT_TRUE(timers.read(1.0).empty());
}

roofline::MachineCeilings hand_ceilings() {
  roofline::MachineCeilings c;
  c.device = "cpu";
  c.name = "test machine";
  c.gemm.resize(2);
  c.gemm[0].format = "bf16";
  c.gemm[0].tflops = 1.0;
  c.gemm[1].format = "nvfp4";
  c.gemm[1].tflops = 4.0;
  c.memory = {{.level = "L2", .capacity_bytes = 1e6, .gbps = 100.0}, {.level = "DRAM", .capacity_bytes = 0.0, .gbps = 10.0}};
  return c;
}

OpRow report_row(const char* op, OpKind kind, const char* format, double ms, double flops, double bytes, double ws,
                 OpTag tag = {}) {
  return OpRow{.key = {op, tag, kind, format}, .category = TimerId::GemmBf16, .calls = 2, .ms = ms, .flops = flops,
               .bytes = bytes, .working_set = ws};
}

TEST(RooflineReport, EachRowAgainstItsCeilingAndTheStepAgainstSpeedOfLight) {
  // Two iterations: per iteration the GEMM does 2 GFLOP over 1 MB (compute-bound: 2 ms at 1 TFLOP/s),
  // the NVFP4 GEMM 8 GFLOP (2 ms at 4 TFLOP/s), the norm moves 20 MB from DRAM (2 ms at 10 GB/s) and 1 MB
  // from L2 in another report_row (0.01 ms at 100 GB/s).
  const std::vector<OpRow> rows = {
      report_row("linear_forward", OpKind::Gemm, "bf16", 8.0, 4e9, 2e6, 5e5, {LinearKind::Fc1, GemmPass::Fprop}),
      report_row("quantized_gemm", OpKind::Gemm, "nvfp4", 5.0, 16e9, 2e6, 5e5),
      report_row("rmsnorm_forward", OpKind::Norm, "fp32", 6.0, 0.0, 40e6, 20e6),
      report_row("add", OpKind::Elementwise, "fp32", 1.0, 0.0, 2e6, 5e5)};
  const roofline::Measurement m{.rows = rows, .iterations = 2, .first_iteration = 2, .last_iteration = 3,
                                .step_ms_sum = 24.0};
  const roofline::Report r = roofline::build_report(m, hand_ceilings(), {.label = "x", .recipe = "y"});
  ASSERT_EQ(r.rows.size(), 4u);
  EXPECT_EQ(r.rows[0].op, "linear_forward");  // largest time first
  EXPECT_DOUBLE_EQ(r.step_ms, 12.0);
  EXPECT_DOUBLE_EQ(r.inside_ops_ms, 10.0);
  EXPECT_DOUBLE_EQ(r.outside_ops_ms, 2.0);
  const roofline::ReportRow& g = r.rows[0];
  EXPECT_DOUBLE_EQ(g.ms_per_iter, 4.0);
  EXPECT_EQ(g.memory_level, "L2");
  EXPECT_NEAR(g.ms_at_ceiling, 2.0, 1e-12);
  EXPECT_NEAR(g.pct_of_ceiling, 50.0, 1e-9);
  EXPECT_NEAR(g.intensity, 2000.0, 1e-9);
  EXPECT_NEAR(g.ceiling_tflops, 1.0, 1e-12);  // min(1 TFLOP/s, 2000 FLOP/B × 100 GB/s)
  EXPECT_NEAR(g.achieved_tflops, 0.5, 1e-12);
  const auto by_op = [&](const char* op) {
    return *std::find_if(r.rows.begin(), r.rows.end(), [&](const roofline::ReportRow& x) { return x.op == op; });
  };
  EXPECT_NEAR(by_op("quantized_gemm").ms_at_ceiling, 2.0, 1e-12);  // its own format's roof
  EXPECT_EQ(by_op("rmsnorm_forward").memory_level, "DRAM");
  EXPECT_NEAR(by_op("rmsnorm_forward").ms_at_ceiling, 2.0, 1e-12);
  EXPECT_NEAR(by_op("add").ms_at_ceiling, 0.01, 1e-12);
  EXPECT_NEAR(r.sol_ms, 6.01, 1e-12);
  EXPECT_NEAR(r.pct_of_sol, 100.0 * 6.01 / 12.0, 1e-9);
  EXPECT_DOUBLE_EQ(r.mfu, 0.0);  // no datasheet peak on the CPU

  const nlohmann::json j = roofline::report_json(r);
  EXPECT_DOUBLE_EQ(j["sol_ms"].get<double>(), r.sol_ms);
  EXPECT_EQ(j["rows"][0]["linear"], "fc1");
  EXPECT_EQ(j["rows"][0]["pass"], "fprop");
  EXPECT_TRUE(j["rows"][1]["linear"].is_null());
  EXPECT_TRUE(j["ceilings"]["gemm"].is_array());
  EXPECT_TRUE(j["ceilings"]["memory"].is_array());
  const std::vector<std::string> lines = roofline::report_lines(r);
  EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [](const std::string& l) {
    return l.find("step at 50.1% of speed of light") != std::string::npos;
  }));
}

TEST(RooflineReport, ModelGemmShapesAreTheLinearsThreePassesDeduplicated) {
  ModelConfig m;
  m.num_layers = 1;
  m.hidden_size = 64;
  m.ffn_hidden_size = 96;
  m.num_attention_heads = 4;
  m.num_query_groups = 2;
  m.kv_channels = 16;
  m.vocab_size = 300;
  m.make_vocab_size_divisible_by = 128;
  const std::vector<roofline::GemmShape> s = roofline::model_gemm_shapes(m, 40);
  const auto has = [&](int64_t a, int64_t b, int64_t c) {
    return std::find(s.begin(), s.end(), roofline::GemmShape{a, b, c}) != s.end();
  };
  EXPECT_TRUE(has(40, 128, 64));   // qkv fprop: out = 64 + 2·32
  EXPECT_TRUE(has(128, 64, 40));   // qkv wgrad
  EXPECT_TRUE(has(40, 64, 64));    // proj fprop = proj dgrad (deduplicated)
  EXPECT_TRUE(has(40, 384, 64));   // LM head over the padded vocabulary
  EXPECT_EQ(std::count(s.begin(), s.end(), roofline::GemmShape{40, 64, 64}), 1);
  for (size_t i = 1; i < s.size(); ++i)
    EXPECT_GE(static_cast<double>(s[i - 1].m) * s[i - 1].n * s[i - 1].k, static_cast<double>(s[i].m) * s[i].n * s[i].k);
}

}  // namespace
}  // namespace pl
