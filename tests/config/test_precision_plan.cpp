// The per-layer precision plan (SPEC-MEGATRON §3 "NVFP4 mixed precision"): which layers run in which
// format, and the block-size rules the quantized formats impose on the model's dimensions.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "config/model_config.h"
#include "config/precision_recipe.h"
#include "core/error.h"
#include "model/precision_plan.h"

namespace {

using pl::LinearFormat;
using pl::ModelConfig;
using pl::PrecisionPlan;
using pl::PrecisionRecipe;

ModelConfig model(const std::string& name) {
  return pl::load_model_config(std::string(PL_CONFIG_DIR) + "/models/" + name + ".json");
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
  ASSERT_EQ(p.layer_format.size(), 32u);
  for (int l = 0; l < 28; ++l) EXPECT_EQ(p.layer_format[l], LinearFormat::NVFP4) << "layer " << l;
  for (int l = 28; l < 32; ++l) EXPECT_EQ(p.layer_format[l], LinearFormat::BF16) << "layer " << l;
  EXPECT_TRUE(p.notes.empty());
  EXPECT_EQ(p.quantized_format(), LinearFormat::NVFP4);
  EXPECT_FALSE(p.all_bf16());
  EXPECT_EQ(p.recipe_name, "bf16_with_nvfp4_mixed");
  EXPECT_TRUE(p.nvfp4.random_hadamard_transform);
  EXPECT_TRUE(p.nvfp4.stochastic_rounding);
  EXPECT_TRUE(p.nvfp4.weight_2d_quantization);
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
  ASSERT_EQ(p.layer_format.size(), 32u);
  EXPECT_EQ(p.layer_format.front(), LinearFormat::BF16);
  EXPECT_EQ(p.layer_format.back(), LinearFormat::BF16);
  for (int l = 1; l < 31; ++l) EXPECT_EQ(p.layer_format[l], LinearFormat::FP8_CURRENT_SCALING) << "layer " << l;
  EXPECT_EQ(p.quantized_format(), LinearFormat::FP8_CURRENT_SCALING);
}

TEST(Plan, Mxfp8QuantizesEveryLayer) {
  const PrecisionPlan p = pl::make_precision_plan(model("llama3_8b"), recipe("bf16_with_mxfp8_mixed"));
  ASSERT_EQ(p.layer_format.size(), 32u);
  for (int l = 0; l < 32; ++l) EXPECT_EQ(p.layer_format[l], LinearFormat::MXFP8) << "layer " << l;
  EXPECT_TRUE(p.notes.empty());
}

TEST(Plan, Bf16MixedIsAllBf16) {
  const PrecisionPlan p = pl::make_precision_plan(model("llama3_8b"), recipe("bf16_mixed"));
  ASSERT_EQ(p.layer_format.size(), 32u);
  EXPECT_TRUE(std::all_of(p.layer_format.begin(), p.layer_format.end(),
                          [](LinearFormat f) { return f == LinearFormat::BF16; }));
  EXPECT_TRUE(p.all_bf16());
  EXPECT_EQ(p.quantized_format(), LinearFormat::BF16);
}

TEST(Plan, Nvfp4OnTinyKeepsOneQuantizedLayerAndSaysSo) {
  const PrecisionPlan p = pl::make_precision_plan(model("llama_tiny"), recipe("bf16_with_nvfp4_mixed"));
  ASSERT_EQ(p.layer_format.size(), 2u);
  EXPECT_GE(std::count(p.layer_format.begin(), p.layer_format.end(), LinearFormat::NVFP4), 1);
  EXPECT_FALSE(p.all_bf16());
  ASSERT_FALSE(p.notes.empty());
  EXPECT_FALSE(p.notes[0].empty());
}

TEST(Plan, EveryShippedRecipeFitsEveryShippedModel) {
  for (const char* m : {"llama3_8b", "llama3_1_8b", "llama_small", "llama_tiny"})
    for (const char* r : {"bf16_mixed", "bf16_with_nvfp4_mixed", "bf16_with_fp8_current_scaling_mixed",
                          "bf16_with_mxfp8_mixed"}) {
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
  EXPECT_NO_THROW(pl::check_gpu_gemm_rules(pl::bf16_plan(m.num_layers), m, 1, 48));
}

}  // namespace
