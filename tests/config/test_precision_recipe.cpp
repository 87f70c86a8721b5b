// Precision recipes: the shipped files load with Megatron-Bridge's settings (SPEC-MEGATRON §3), and
// malformed or contradictory recipes are one-line pl::Errors naming the file and the field.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "config/precision_recipe.h"
#include "core/error.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using pl::test::expect_one_line_error;
using pl::PrecisionRecipe;

std::string recipe_path(const std::string& name) {
  return std::string(PL_CONFIG_DIR) + "/recipes/" + name + ".json";
}

TEST(ConfigRecipe, EveryShippedRecipeLoads) {
  int count = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(PL_CONFIG_DIR) / "recipes")) {
    if (entry.path().extension() != ".json") continue;
    SCOPED_TRACE(entry.path().string());
    PrecisionRecipe r;
    ASSERT_NO_THROW(r = pl::load_precision_recipe(entry.path().string()));
    EXPECT_FALSE(r.name.empty());
    EXPECT_EQ(r.file, entry.path().string());
    ++count;
  }
  EXPECT_GE(count, 4);
}

TEST(ConfigRecipe, Bf16MixedQuantizesNothing) {
  const PrecisionRecipe r = pl::load_precision_recipe(recipe_path("bf16_mixed"));
  EXPECT_EQ(r.name, "bf16_mixed");
  EXPECT_FALSE(r.fp8.has_value());
  EXPECT_FALSE(r.fp4.has_value());
}

TEST(ConfigRecipe, Nvfp4IsThePlaybookRecipe) {
  // MB-0.4.0 bf16_with_nvfp4_mixed: fp4 e2m1, recipe nvfp4, no fp8; the playbook keeps the last 4
  // layers in BF16; TE defaults: RHT, stochastic rounding and 2D weight blocks on.
  const PrecisionRecipe r = pl::load_precision_recipe(recipe_path("bf16_with_nvfp4_mixed"));
  EXPECT_EQ(r.name, "bf16_with_nvfp4_mixed");
  ASSERT_TRUE(r.fp4.has_value());
  EXPECT_EQ(*r.fp4, "e2m1");
  EXPECT_EQ(r.fp4_recipe, "nvfp4");
  EXPECT_FALSE(r.fp8.has_value());
  EXPECT_TRUE(r.first_last_layers_bf16);
  EXPECT_EQ(r.num_layers_at_start_in_bf16, 0);
  EXPECT_EQ(r.num_layers_at_end_in_bf16, 4);
  EXPECT_TRUE(r.nvfp4.random_hadamard_transform);
  EXPECT_TRUE(r.nvfp4.stochastic_rounding);
  EXPECT_TRUE(r.nvfp4.weight_2d_quantization);
}

TEST(ConfigRecipe, Fp8CurrentScalingAndMxfp8) {
  const PrecisionRecipe cs = pl::load_precision_recipe(recipe_path("bf16_with_fp8_current_scaling_mixed"));
  ASSERT_TRUE(cs.fp8.has_value());
  EXPECT_EQ(cs.fp8_recipe, "tensorwise");
  EXPECT_FALSE(cs.fp4.has_value());
  EXPECT_TRUE(cs.first_last_layers_bf16);
  EXPECT_EQ(cs.num_layers_at_start_in_bf16, 1);
  EXPECT_EQ(cs.num_layers_at_end_in_bf16, 1);

  const PrecisionRecipe mx = pl::load_precision_recipe(recipe_path("bf16_with_mxfp8_mixed"));
  ASSERT_TRUE(mx.fp8.has_value());
  EXPECT_EQ(*mx.fp8, "e4m3");
  EXPECT_EQ(mx.fp8_recipe, "mxfp8");
  EXPECT_FALSE(mx.fp4.has_value());
}

TEST(ConfigRecipe, Nvfp4SwitchesCanBeTurnedOff) {
  pl::test::TempDir dir;
  const std::string p = dir.write("r.json", R"({"name": "r", "fp4": "e2m1", "nvfp4": {"random_hadamard_transform": false,
      "stochastic_rounding": false, "weight_2d_quantization": false}})");
  const PrecisionRecipe r = pl::load_precision_recipe(p);
  EXPECT_FALSE(r.nvfp4.random_hadamard_transform);
  EXPECT_FALSE(r.nvfp4.stochastic_rounding);
  EXPECT_FALSE(r.nvfp4.weight_2d_quantization);
}

// ---- errors -----------------------------------------------------------------------------------

class ConfigRecipeErrors : public ::testing::Test {
 protected:
  std::string write(const nlohmann::json& j) { return dir_.write("bad_recipe.json", j.dump(2)); }
  pl::test::TempDir dir_;
};

TEST_F(ConfigRecipeErrors, ValidBaseLoads) {
  EXPECT_NO_THROW(pl::load_precision_recipe(write({{"name", "r"}, {"fp4", "e2m1"}, {"nvfp4", nlohmann::json::object()}})));
}

TEST_F(ConfigRecipeErrors, UnknownTopLevelKey) {
  const std::string p = write({{"name", "r"}, {"fp4_recpie", "nvfp4"}});
  expect_one_line_error([&] { pl::load_precision_recipe(p); }, {p, "fp4_recpie"});
}

TEST_F(ConfigRecipeErrors, NestedUnknownKeyInNvfp4) {
  const std::string p = write({{"name", "r"}, {"fp4", "e2m1"}, {"nvfp4", {{"random_hadamard", false}}}});
  expect_one_line_error([&] { pl::load_precision_recipe(p); }, {p, "nvfp4", "random_hadamard"});
}

TEST_F(ConfigRecipeErrors, Nvfp4NotAnObject) {
  const std::string p = write({{"name", "r"}, {"fp4", "e2m1"}, {"nvfp4", true}});
  expect_one_line_error([&] { pl::load_precision_recipe(p); }, {p, "nvfp4"});
}

TEST_F(ConfigRecipeErrors, Fp4WithFp8) {
  const std::string p = write({{"name", "r"}, {"fp4", "e2m1"}, {"fp8", "e4m3"}});
  expect_one_line_error([&] { pl::load_precision_recipe(p); }, {p, "fp4", "fp8"});
}

TEST_F(ConfigRecipeErrors, BadFp8Recipe) {
  const std::string p = write({{"name", "r"}, {"fp8", "e4m3"}, {"fp8_recipe", "blockwise"}});
  expect_one_line_error([&] { pl::load_precision_recipe(p); }, {p, "fp8_recipe"});
  // Delayed scaling's fields (Megatron-Bridge's MixedPrecisionConfig) are checked too.
  const std::string q = write({{"name", "r"}, {"fp8", "hybrid"}, {"fp8_recipe", "delayed"}, {"fp8_amax_compute_algo", "mean"}});
  expect_one_line_error([&] { pl::load_precision_recipe(q); }, {q, "fp8_amax_compute_algo"});
}

TEST_F(ConfigRecipeErrors, BadFp8Format) {
  const std::string p = write({{"name", "r"}, {"fp8", "e5m2"}});
  expect_one_line_error([&] { pl::load_precision_recipe(p); }, {p, "fp8"});
}

TEST_F(ConfigRecipeErrors, BadFp4Format) {
  const std::string p = write({{"name", "r"}, {"fp4", "e3m0"}});
  expect_one_line_error([&] { pl::load_precision_recipe(p); }, {p, "fp4"});
}

TEST_F(ConfigRecipeErrors, WrongTypeForLayerCount) {
  const std::string p = write({{"name", "r"}, {"num_layers_at_end_in_bf16", "4"}});
  expect_one_line_error([&] { pl::load_precision_recipe(p); }, {p, "num_layers_at_end_in_bf16"});
}

TEST_F(ConfigRecipeErrors, NegativeLayerCount) {
  const std::string p = write({{"name", "r"}, {"num_layers_at_start_in_bf16", -1}});
  expect_one_line_error([&] { pl::load_precision_recipe(p); }, {p, "num_layers_at_start_in_bf16"});
}

TEST_F(ConfigRecipeErrors, MissingName) {
  const std::string p = write({{"fp4", "e2m1"}});
  expect_one_line_error([&] { pl::load_precision_recipe(p); }, {p, "name"});
}

TEST_F(ConfigRecipeErrors, UnsupportedBase) {
  const std::string p = write({{"name", "r"}, {"mixed_precision", "fp16_mixed"}});
  expect_one_line_error([&] { pl::load_precision_recipe(p); }, {p, "mixed_precision"});
}

}  // namespace
