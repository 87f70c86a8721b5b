// Megatron's model-FLOP formula (SPEC-MEGATRON §2) and theoretical parameter counts (§1a), checked
// against the numbers computed for the playbook configuration (§2c).
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <cmath>
#include <string>

#include "config/model_config.h"
#include "log/megatron_log.h"
#include "model/accounting.h"

namespace {

pl::ModelConfig accounting_model(const std::string& name) {
  return pl::load_model_config(std::string(PL_CONFIG_DIR) + "/models/" + name + ".json");
}

TEST(Accounting, FlopsPerTokenLlama3_8b) {
  const pl::ModelConfig m = accounting_model("llama3_8b");
  EXPECT_EQ(fmt::format("{:.3f}", pl::flops_per_token(m, 4096) / 1e9), "48.249");
  EXPECT_EQ(fmt::format("{:.3f}", pl::flops_per_token(m, 8192) / 1e9), "51.470");
  EXPECT_NEAR(pl::flops_per_token(m, 4096), 48.249e9, 0.0005e9);
  EXPECT_NEAR(pl::flops_per_token(m, 8192), 51.470e9, 0.0005e9);
}

TEST(Accounting, FlopsPerTokenBreakdown) {
  // §2c per token at s=4096: MLP 18*L*h*f + projections 12*L*h^2*1.25 + core attention 6*L*h*s
  // + logits 6*h*V, evaluated exactly in integers.
  const pl::ModelConfig m = accounting_model("llama3_8b");
  const double L = 32, h = 4096, f = 14336, s = 4096, V = 128256;
  const double expected = 18 * L * h * f + 12 * L * h * h * 1.25 + 6 * L * h * s + 6 * h * V;
  EXPECT_DOUBLE_EQ(pl::flops_per_token(m, 4096), expected);
}

TEST(Accounting, FlopsPerIterationLlama3_8b) {
  const pl::ModelConfig m = accounting_model("llama3_8b");
  const double f = pl::flops_per_iteration(m, 64, 4096);
  EXPECT_NEAR(f / 1.26482e16, 1.0, 1e-5);
  EXPECT_DOUBLE_EQ(f, 64.0 * 4096.0 * pl::flops_per_token(m, 4096));
  // The playbook's 5.39 s step: 2346.6 TFLOP/s (reported as "2347").
  EXPECT_EQ(fmt::format("{:.1f}", f / 5.39 / 1e12), "2346.6");
  // The BF16 baseline's 9.05 s: 1397.6.
  EXPECT_EQ(fmt::format("{:.1f}", f / 9.05 / 1e12), "1397.6");
}

TEST(Accounting, FlopsUsePaddedVocab) {
  pl::ModelConfig a = accounting_model("llama_tiny");
  a.vocab_size = 100;  // pads to 128, the shipped tiny vocabulary
  const pl::ModelConfig b = accounting_model("llama_tiny");
  ASSERT_EQ(b.vocab_size, 128);
  EXPECT_DOUBLE_EQ(pl::flops_per_iteration(a, 8, 128), pl::flops_per_iteration(b, 8, 128));
}

TEST(Accounting, MegatronParamCountsLlama3_8b) {
  const pl::MegatronParamCounts c = pl::megatron_param_counts(accounting_model("llama3_8b"));
  // 2*L*h^2*((1+g/n) + 1.5 f/h + 2/h + 1/(L h)) and 2*h*V_pad: both exact integers.
  EXPECT_DOUBLE_EQ(c.transformer_layers, 6979854336.0);
  EXPECT_DOUBLE_EQ(c.embedding_layers, 1050673152.0);
  EXPECT_DOUBLE_EQ(c.total(), 8030527488.0);
  EXPECT_EQ(fmt::format("{:.2f}", c.transformer_layers / 1e9), "6.98");
  EXPECT_EQ(fmt::format("{:.2f}", c.embedding_layers / 1e9), "1.05");
  EXPECT_EQ(fmt::format("{:.2f}", c.total() / 1e9), "8.03");
  EXPECT_EQ(fmt::format("{:.4f}", c.total() / 1e9), "8.0305");
}

TEST(Accounting, MegatronCountVersusAllocatedTensors) {
  // Megatron's formula counts each norm as LayerNorm (weight and bias: 2*h), while the model
  // allocates RMSNorm weights only (h). Otherwise the two agree for a GQA SwiGLU model with untied
  // embeddings and an unpadded vocabulary: the difference is exactly (2 per layer + final) * h.
  for (const char* name : {"llama3_8b", "llama_small", "llama_tiny"}) {
    const pl::ModelConfig m = accounting_model(name);
    ASSERT_EQ(m.padded_vocab_size(), m.vocab_size) << name;
    const double norm_bias = static_cast<double>((2 * m.num_layers + 1) * m.hidden_size);
    EXPECT_DOUBLE_EQ(pl::megatron_param_counts(m).total(), static_cast<double>(m.num_parameters()) + norm_bias)
        << name;
  }
}

TEST(Accounting, ParameterLinesLlama3_8b) {
  const pl::MegatronParamCounts c = pl::megatron_param_counts(accounting_model("llama3_8b"));
  const std::string s = pl::log::parameter_lines(c.transformer_layers, c.embedding_layers,
                                                 pl::kWeightAndOptimizerBytesPerParam);
  // Format "{: .2f}": a space for the sign, so two spaces after the colon.
  EXPECT_NE(s.find("Number of parameters in transformer layers in billions:  6.98\n"), std::string::npos) << s;
  EXPECT_NE(s.find("Number of parameters in embedding layers in billions: 1.05\n"), std::string::npos) << s;
  EXPECT_NE(s.find("Total number of parameters in billions: 8.03\n"), std::string::npos) << s;
  EXPECT_NE(s.find("Number of parameters in most loaded shard in billions: 8.0305\n"), std::string::npos) << s;

  // The weight-and-optimizer figure, computed here from the formula: params * 18 B / 2^20.
  // 8030527488 * 18 / 1048576 = 137853.140625 -> "137853.14", which is exactly the spec's value.
  EXPECT_DOUBLE_EQ(pl::kWeightAndOptimizerBytesPerParam, 18.0);
  const double mb = 8030527488.0 * 18.0 / 1048576.0;
  const std::string expected_mb = fmt::format("{:.2f}", mb);
  ASSERT_EQ(expected_mb, "137853.14");
  const std::string last = "Theoretical memory footprints: weight and optimizer=" + expected_mb + " MB";
  ASSERT_GE(s.size(), last.size());
  EXPECT_EQ(s.substr(s.size() - last.size()), last) << s;

  // Exactly five lines, in Megatron's order.
  int lines = 1;
  for (char ch : s) lines += ch == '\n';
  EXPECT_EQ(lines, 5);
  EXPECT_LT(s.find("transformer layers"), s.find("embedding layers"));
  EXPECT_LT(s.find("embedding layers"), s.find("Total number"));
  EXPECT_LT(s.find("Total number"), s.find("most loaded shard"));
  EXPECT_LT(s.find("most loaded shard"), s.find("Theoretical memory"));
}

}  // namespace
