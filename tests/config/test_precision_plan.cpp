// The per-layer precision plan (SPEC-MEGATRON §3 "NVFP4 mixed precision"): which layers run in which
// format, and the block-size rules the quantized formats impose on the model's dimensions.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>

#include "config/model_config.h"
#include "config/precision_recipe.h"
#include "core/error.h"
#include "model/precision_plan.h"

namespace {

using pl::QuantFormat;
using pl::ModelConfig;
using pl::PrecisionPlan;
using pl::PrecisionRecipe;

ModelConfig model(const std::string& name) {
  return pl::load_model_config(std::string(PL_CONFIG_DIR) + "/models/" + name + ".json");
}
// The format of layer l's x (all four linears of a layer share their formats); nullopt: BF16.
std::optional<QuantFormat> x_of(const PrecisionPlan& p, int64_t l) {
  for (int k = 1; k < 4; ++k) EXPECT_EQ(p.linear(l, k).x, p.linear(l, 0).x);
  return p.linear(l, 0).x;
}
PrecisionRecipe recipe(const std::string& name) {
  return pl::load_precision_recipe(std::string(PL_CONFIG_DIR) + "/recipes/" + name + ".json");
}

// Expects make_precision_plan to fail with one line naming `file` and `field`.
void expect_block_rule_error(const ModelConfig& m, const PrecisionRecipe& r, const std::string& field) {
  try {
    pl::make_precision_plan(m, r);
    ADD_FAILURE() << "expected a pl::Error for " << field;
  } catch (const pl::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find(m.file), std::string::npos) << msg;
    EXPECT_NE(msg.find(field), std::string::npos) << msg;
  }
}

TEST(Plan, Nvfp4OnLlama3_8bKeepsLastFourLayersBf16) {
  const PrecisionPlan p = pl::make_precision_plan(model("llama3_8b"), recipe("bf16_with_nvfp4_mixed"));
  ASSERT_EQ(p.num_layers(), 32);
  for (int l = 0; l < 28; ++l) EXPECT_EQ(x_of(p, l), QuantFormat::NVFP4) << "layer " << l;
  for (int l = 28; l < 32; ++l) EXPECT_EQ(x_of(p, l), std::nullopt) << "layer " << l;
  EXPECT_TRUE(p.notes.empty());
  EXPECT_EQ(p.quantized().x, QuantFormat::NVFP4);
  EXPECT_FALSE(p.all_bf16());
  EXPECT_EQ(p.recipe_name, "bf16_with_nvfp4_mixed");
  const pl::LinearPlan& q = p.linear(0, 0);
  EXPECT_EQ(q.w, QuantFormat::NVFP4);
  EXPECT_EQ(q.dy, QuantFormat::NVFP4);
  EXPECT_TRUE(q.rht);
  EXPECT_TRUE(q.stochastic_rounding);
  EXPECT_TRUE(q.weight_2d);
  EXPECT_EQ(q.block_multiple, 16);
  EXPECT_EQ(q.gpu_multiple, 32);
  EXPECT_FALSE(p.linear(31, 0).rht);  // the BF16 layers have no quantization switches
  // Each linear carries its shape: qkv [h -> (heads + 2 groups) * d], proj, fc1 [h -> 2f], fc2.
  const ModelConfig m = model("llama3_8b");
  EXPECT_EQ(p.linear(5, 0).in, m.hidden_size);
  EXPECT_EQ(p.linear(5, 0).out, m.qkv_dim());
  EXPECT_EQ(p.linear(5, 1).in, m.q_dim());
  EXPECT_EQ(p.linear(5, 2).out, 2 * m.ffn_hidden_size);
  EXPECT_EQ(p.linear(5, 3).in, m.ffn_hidden_size);
  EXPECT_EQ(p.linear(5, 3).out, m.hidden_size);
}

TEST(Plan, Nvfp4DescribeNamesTheLayerRuns) {
  const PrecisionPlan p = pl::make_precision_plan(model("llama3_8b"), recipe("bf16_with_nvfp4_mixed"));
  const auto lines = p.describe();
  ASSERT_GE(lines.size(), 2u);
  EXPECT_NE(lines[0].find("0-27"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("nvfp4"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("28-31"), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("bf16"), std::string::npos) << lines[1];
}

TEST(Plan, Fp8CurrentScalingKeepsFirstAndLastBf16) {
  const PrecisionPlan p =
      pl::make_precision_plan(model("llama3_8b"), recipe("bf16_with_fp8_current_scaling_mixed"));
  ASSERT_EQ(p.num_layers(), 32);
  EXPECT_EQ(x_of(p, 0), std::nullopt);
  EXPECT_EQ(x_of(p, 31), std::nullopt);
  for (int l = 1; l < 31; ++l) EXPECT_EQ(x_of(p, l), QuantFormat::FP8_E4M3) << "layer " << l;
  EXPECT_EQ(std::string(pl::format_name(p.quantized())), "fp8-current-scaling");
}

// Megatron's fp8 "hybrid" (TE Format.HYBRID): E4M3 x and W, E5M2 gradients; "e4m3" (Format.E4M3):
// E4M3 gradients too. The plan and the banner line say which.
TEST(Plan, Fp8E4m3AndHybridDifferInTheGradientFormatOnly) {
  const PrecisionPlan hybrid =
      pl::make_precision_plan(model("llama3_8b"), recipe("bf16_with_fp8_current_scaling_mixed"));
  const PrecisionPlan e4m3 =
      pl::make_precision_plan(model("llama3_8b"), recipe("bf16_with_fp8_current_scaling_e4m3_mixed"));
  for (const PrecisionPlan* p : {&hybrid, &e4m3}) {
    EXPECT_EQ(p->quantized().x, QuantFormat::FP8_E4M3);
    EXPECT_EQ(p->quantized().w, QuantFormat::FP8_E4M3);
    EXPECT_EQ(p->quantized().block_multiple, 16);
  }
  EXPECT_EQ(hybrid.quantized().dy, QuantFormat::FP8_E5M2);
  EXPECT_EQ(e4m3.quantized().dy, QuantFormat::FP8_E4M3);
  EXPECT_NE(hybrid.describe()[1].find("fp8 current scaling (E4M3 forward, E5M2 gradients)"), std::string::npos)
      << hybrid.describe()[1];
  EXPECT_NE(e4m3.describe()[1].find("fp8 current scaling (E4M3 forward, E4M3 gradients)"), std::string::npos)
      << e4m3.describe()[1];
}

TEST(Plan, Mxfp8QuantizesEveryLayer) {
  const PrecisionPlan p = pl::make_precision_plan(model("llama3_8b"), recipe("bf16_with_mxfp8_mixed"));
  ASSERT_EQ(p.num_layers(), 32);
  for (int l = 0; l < 32; ++l) EXPECT_EQ(x_of(p, l), QuantFormat::MXFP8) << "layer " << l;
  EXPECT_EQ(p.quantized().dy, QuantFormat::MXFP8);  // MXFP8 is E4M3 everywhere, gradients included
  EXPECT_EQ(p.quantized().block_multiple, 32);
  EXPECT_TRUE(p.notes.empty());
}

TEST(Plan, Bf16MixedIsAllBf16) {
  const PrecisionPlan p = pl::make_precision_plan(model("llama3_8b"), recipe("bf16_mixed"));
  ASSERT_EQ(p.num_layers(), 32);
  EXPECT_TRUE(std::none_of(p.linears.begin(), p.linears.end(), [](const pl::LinearPlan& l) { return l.quantized(); }));
  EXPECT_TRUE(p.all_bf16());
  EXPECT_EQ(p.quantized().x, std::nullopt);
  EXPECT_EQ(p.linears, pl::bf16_plan(model("llama3_8b")).linears);
}

TEST(Plan, Nvfp4OnTinyKeepsOneQuantizedLayerAndSaysSo) {
  const PrecisionPlan p = pl::make_precision_plan(model("llama_tiny"), recipe("bf16_with_nvfp4_mixed"));
  ASSERT_EQ(p.num_layers(), 2);
  EXPECT_EQ(x_of(p, 0), QuantFormat::NVFP4);
  EXPECT_FALSE(p.all_bf16());
  ASSERT_FALSE(p.notes.empty());
  EXPECT_FALSE(p.notes[0].empty());
}

TEST(Plan, EveryShippedRecipeFitsEveryShippedModel) {
  for (const char* m : {"llama3_8b", "llama3_1_8b", "llama_small", "llama_tiny"})
    for (const char* r : {"bf16_mixed", "bf16_with_nvfp4_mixed", "bf16_with_fp8_current_scaling_mixed",
                          "bf16_with_fp8_current_scaling_e4m3_mixed", "bf16_with_mxfp8_mixed"}) {
      SCOPED_TRACE(std::string(m) + " + " + r);
      EXPECT_NO_THROW(pl::make_precision_plan(model(m), recipe(r)));
    }
}

TEST(Plan, Nvfp4BlockRuleOnFfn) {
  ModelConfig m = model("llama_tiny");
  m.file = "/some/where/odd_ffn.json";
  m.ffn_hidden_size = 264;  // multiple of 8, not of 16
  expect_block_rule_error(m, recipe("bf16_with_nvfp4_mixed"), "ffn_hidden_size");
  // The same model is fine in BF16.
  EXPECT_NO_THROW(pl::make_precision_plan(m, recipe("bf16_mixed")));
}

TEST(Plan, Nvfp4BlockRuleOnHidden) {
  ModelConfig m = model("llama_tiny");
  m.file = "/some/where/odd_hidden.json";
  m.hidden_size = 248;  // multiple of 8, not of 16
  expect_block_rule_error(m, recipe("bf16_with_nvfp4_mixed"), "hidden_size");
}

TEST(Plan, Mxfp8NeedsMultiplesOf32) {
  ModelConfig m = model("llama_tiny");
  m.file = "/some/where/ffn272.json";
  m.ffn_hidden_size = 272;  // multiple of 16, not of 32
  EXPECT_NO_THROW(pl::make_precision_plan(m, recipe("bf16_with_nvfp4_mixed")));
  expect_block_rule_error(m, recipe("bf16_with_mxfp8_mixed"), "ffn_hidden_size");
}

TEST(Plan, Mxfp8BlockRuleOnKvDim) {
  ModelConfig m = model("llama_tiny");
  m.file = "/some/where/kv16.json";
  m.kv_channels = 16;      // heads*kv_channels = 8*16 = 128: a multiple of 32
  m.num_query_groups = 1;  // groups*kv_channels = 16: not a multiple of 32
  expect_block_rule_error(m, recipe("bf16_with_mxfp8_mixed"), "kv_channels");
}

TEST(Plan, TokensBlockRule) {
  const PrecisionPlan nv = pl::make_precision_plan(model("llama_tiny"), recipe("bf16_with_nvfp4_mixed"));
  try {
    pl::check_tokens_block_rule(nv, 1, 15);
    ADD_FAILURE() << "1x15 tokens must fail for nvfp4";
  } catch (const pl::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find("15"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(pl::check_tokens_block_rule(nv, 1, 16));
  EXPECT_NO_THROW(pl::check_tokens_block_rule(nv, 3, 48));

  const PrecisionPlan bf = pl::make_precision_plan(model("llama_tiny"), recipe("bf16_mixed"));
  EXPECT_NO_THROW(pl::check_tokens_block_rule(bf, 1, 15));

  const PrecisionPlan mx = pl::make_precision_plan(model("llama_tiny"), recipe("bf16_with_mxfp8_mixed"));
  EXPECT_THROW(pl::check_tokens_block_rule(mx, 1, 16), pl::Error);
  EXPECT_NO_THROW(pl::check_tokens_block_rule(mx, 2, 16));
}

}  // namespace

namespace {

TEST(Plan, GpuNvfp4GemmsNeedMultiplesOf32) {
  const ModelConfig m = pl::load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama3_8b.json");
  const PrecisionPlan nvfp4 =
      pl::make_precision_plan(m, pl::load_precision_recipe(std::string(PL_CONFIG_DIR) + "/recipes/bf16_with_nvfp4_mixed.json"));
  EXPECT_NO_THROW(pl::check_gpu_gemm_rules(nvfp4, m, 4, 4096));
  // 1 x 48 tokens fill 16-element blocks (fine on the CPU) but not cuBLASLt's 32-element FP4 rows.
  EXPECT_NO_THROW(pl::check_tokens_block_rule(nvfp4, 1, 48));
  try {
    pl::check_gpu_gemm_rules(nvfp4, m, 1, 48);
    FAIL() << "expected an error";
  } catch (const pl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("micro-batch-size x seq-length = 48"), std::string::npos) << e.what();
  }
  // Other formats are unaffected.
  EXPECT_NO_THROW(pl::check_gpu_gemm_rules(pl::bf16_plan(m), m, 1, 48));
}

}  // namespace
