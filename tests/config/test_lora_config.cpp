// LoRA's configuration (config/lora_config.h, issue 41): the target modules in Megatron's and Hugging Face's
// names, the partial fused groups and foreign names refused in one line, the checks of dim, alpha and
// dropout, and the adapters' shapes and parameter counts against hand arithmetic and the 8B figure.
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "config/lora_config.h"
#include "config/model_config.h"
#include "core/error.h"
#include "model/precision_plan.h"

namespace pl {
namespace {

std::string model_path(const std::string& name) { return std::string(PL_CONFIG_DIR) + "/models/" + name + ".json"; }

// The one-line error of fn, or "" when it does not throw.
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LoraConfig, TargetNamesAreTheModelsLinearNames) {
  for (int k = 0; k < kLoraTargets; ++k) EXPECT_STREQ(kLoraTargetNames[k], kLinearNames[k]);
}

TEST(LoraConfig, TargetModulesInMegatronAndHuggingFaceNames) {
  const LoraTargets all = {true, true, true, true};
  EXPECT_EQ(LoraConfig{}.targets, all);  // Megatron-Bridge's default: the four linear layers
  EXPECT_EQ(parse_lora_target_modules("linear_qkv,linear_proj,linear_fc1,linear_fc2"), all);
  EXPECT_EQ(parse_lora_target_modules("all-linear"), all);
  EXPECT_EQ(parse_lora_target_modules("q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"), all);
  EXPECT_EQ(parse_lora_target_modules("linear_qkv"), (LoraTargets{true, false, false, false}));
  EXPECT_EQ(parse_lora_target_modules(" v_proj , q_proj,k_proj , down_proj"), (LoraTargets{true, false, false, true}));
  EXPECT_EQ(parse_lora_target_modules("gate_proj,up_proj,linear_proj,gate_proj"), (LoraTargets{false, true, true, false}));
  EXPECT_EQ(parse_lora_target_modules("o_proj,linear_proj"), (LoraTargets{false, true, false, false}));
  EXPECT_EQ(lora_target_names(all), "linear_qkv,linear_proj,linear_fc1,linear_fc2");
  EXPECT_EQ(lora_target_names({false, false, true, true}), "linear_fc1,linear_fc2");
  EXPECT_EQ(lora_hf_target_modules(all),
            (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
  EXPECT_EQ(lora_hf_target_modules({true, false, false, false}), (std::vector<std::string>{"q_proj", "k_proj", "v_proj"}));
}

TEST(LoraConfig, PartialGroupsAndForeignNamesAreRefusedInOneLine) {
  // PEFT's Llama default: a partial fused group, refused naming what is missing.
  EXPECT_EQ(error_of([] { parse_lora_target_modules("q_proj,v_proj"); }),
            "--lora-target-modules 'q_proj,v_proj' gives part of linear_qkv without k_proj: one adapter sits on the "
            "fused layer, so give q_proj,k_proj,v_proj together (or linear_qkv)");
  EXPECT_EQ(error_of([] { parse_lora_target_modules("linear_qkv,up_proj"); }),
            "--lora-target-modules 'linear_qkv,up_proj' gives part of linear_fc1 without gate_proj: one adapter sits "
            "on the fused layer, so give gate_proj,up_proj together (or linear_fc1)");
  for (const char* bad : {"lm_head", "embed_tokens", "output_layer", "*.layers.0.*.linear_qkv", "linear_qkv,mlp"}) {
    SCOPED_TRACE(bad);
    const std::string e = error_of([&] { parse_lora_target_modules(bad); });
    EXPECT_EQ(e.rfind("--lora-target-modules: '", 0), 0u) << e;
    EXPECT_NE(e.find("names no LoRA target"), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  for (const char* bad : {"", "linear_qkv,", ",linear_fc1", "linear_qkv,,linear_fc2"}) {
    SCOPED_TRACE(bad);
    EXPECT_NE(error_of([&] { parse_lora_target_modules(bad); }).find("has an empty name"), std::string::npos);
  }
}

TEST(LoraConfig, ChecksNameTheFlag) {
  EXPECT_EQ(error_of([] { validate_lora_config(LoraConfig{}); }), "");
  const auto with = [](auto change) {
    LoraConfig c;
    change(c);
    return error_of([&] { validate_lora_config(c); });
  };
  EXPECT_EQ(with([](LoraConfig& c) { c.dim = 0; }), "--lora-dim must be >= 1, got 0");
  EXPECT_EQ(with([](LoraConfig& c) { c.alpha = 0.0; }), "--lora-alpha must be a finite number > 0, got 0");
  EXPECT_EQ(with([](LoraConfig& c) { c.alpha = -8.0; }), "--lora-alpha must be a finite number > 0, got -8");
  EXPECT_NE(with([](LoraConfig& c) { c.alpha = std::numeric_limits<double>::infinity(); }).find("--lora-alpha"), std::string::npos);
  EXPECT_EQ(with([](LoraConfig& c) { c.dropout = 1.0; }), "--lora-dropout must be in [0, 1), got 1");
  EXPECT_EQ(with([](LoraConfig& c) { c.dropout = -0.1; }), "--lora-dropout must be in [0, 1), got -0.1");
  EXPECT_NE(with([](LoraConfig& c) { c.dropout = std::numeric_limits<double>::quiet_NaN(); }).find("--lora-dropout"), std::string::npos);
  EXPECT_EQ(with([](LoraConfig& c) { c.dropout = 0.999; }), "");
  EXPECT_EQ(with([](LoraConfig& c) { c.targets = {}; }), "--lora-target-modules chooses no target");
  EXPECT_EQ(parse_lora_dropout_position("post"), LoraDropoutPosition::Post);
  EXPECT_EQ(parse_lora_a_init("kaiming"), LoraAInit::Kaiming);
  EXPECT_STREQ(lora_dropout_position_name(LoraConfig{}.dropout_position), "pre");
  EXPECT_STREQ(lora_a_init_name(LoraConfig{}.a_init), "xavier");
  EXPECT_EQ(error_of([] { parse_lora_dropout_position("before"); }),
            "--lora-dropout-position must be pre (on the adapter's input, before A) or post (on the adapter's output, "
            "before the alpha/dim scaling), got 'before'");
  EXPECT_EQ(error_of([] { parse_lora_a_init("gaussian"); }), "--lora-a-init must be xavier or kaiming, got 'gaussian'");
  EXPECT_DOUBLE_EQ((LoraConfig{.dim = 16, .alpha = 32.0}).scale(), 2.0);
}

// llama_tiny by hand (hidden 256, ffn 256, 8 heads of 32, 2 groups, 2 layers), and the 8B figure.
TEST(LoraConfig, AdapterShapesAndParameterCounts) {
  const ModelConfig tiny = load_model_config(model_path("llama_tiny"));
  ASSERT_EQ(tiny.hidden_size, 256);
  ASSERT_EQ(tiny.ffn_hidden_size, 256);
  ASSERT_EQ(tiny.qkv_dim(), (8 + 2 * 2) * 32);
  const int64_t want_in[] = {256, 256, 256, 256}, want_out[] = {384, 256, 512, 256};
  for (int k = 0; k < kLoraTargets; ++k) {
    EXPECT_EQ(lora_adapter_shape(tiny, k).in, want_in[k]) << kLoraTargetNames[k];
    EXPECT_EQ(lora_adapter_shape(tiny, k).out, want_out[k]) << kLoraTargetNames[k];
  }
  LoraConfig c{.dim = 8};
  // 2 layers x 8 x ((256 + 384) + (256 + 256) + (256 + 512) + (256 + 256))
  EXPECT_EQ(lora_parameter_count(tiny, c), 2 * 8 * (640 + 512 + 768 + 512));
  c.targets = {true, false, false, false};
  EXPECT_EQ(lora_parameter_count(tiny, c), 2 * 8 * 640);

  // Issue 41: llama3_8b at r 32 on all four targets: 71.3 M trainable parameters, 0.89% of the model.
  const ModelConfig m = load_model_config(model_path("llama3_8b"));
  const int64_t n = lora_parameter_count(m, LoraConfig{});
  EXPECT_EQ(n, 32 * 32 * ((4096 + 6144) + (4096 + 4096) + (4096 + 2 * 14336) + (14336 + 4096)));
  EXPECT_EQ(n, 71'303'168);
  char share[16];
  std::snprintf(share, sizeof share, "%.2f%%", 100.0 * static_cast<double>(n) / static_cast<double>(m.num_parameters()));
  EXPECT_STREQ(share, "0.89%");
}

}  // namespace
}  // namespace pl
