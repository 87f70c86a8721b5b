// LoRA's adapters outside training (issue 41; model/lora_export.h): the merge W + (alpha/dim)·B·A against a
// double-precision reference (FP32 within its rounding, then one BF16 rounding when exported), PEFT's files as PEFT
// writes them (adapter_config.json's fields, tensor names and shapes, a fused A under each projection, B split by the
// Hugging Face rows), an export -> read round trip bit for bit, and the one-line refusals of a PEFT directory that
// is not one fused adapter per group.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "config/model_config.h"
#include "io/file_checks.h"
#include "io/safetensors.h"
#include "model/llama.h"
#include "model/lora_export.h"
#include "test_util.h"

namespace pl {
namespace {

namespace fs = std::filesystem;

ModelConfig lora_export_tiny() { return load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json"); }

std::vector<float> random_values(int64_t n, uint32_t seed, float std) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, std);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = nd(rng);
  return v;
}

TEST(LoraExport, TheMergeIsWPlusScaledBTimesAInFp32) {
  const ModelConfig m = lora_export_tiny();
  LoraConfig c{.dim = 4, .alpha = 6.0};
  c.targets = {true, false, true, true};
  const std::vector<float> adapters = random_values(lora_parameter_count(m, c), 1, 0.3f);
  const std::vector<float> base0 = random_values(m.num_parameters(), 2, 0.05f);
  std::vector<float> merged = base0;
  merge_lora_into(m, c, adapters, merged);
  const std::vector<ParamEntry> layout = param_layout(m), entries = lora_layout(m, c);
  // Layer 1's qkv (entry 1 + 6 + 1) and fc2 (entry 1 + 6 + 5) against a double reference; proj untouched.
  for (const auto& [k, entry] : {std::pair{0, 8}, std::pair{3, 12}}) {
    const int64_t i = lora_entry_index(c, 1, k);
    const ParamEntry &a = entries[static_cast<size_t>(i)], &b = entries[static_cast<size_t>(i + 1)],
                     &w = layout[static_cast<size_t>(entry)];
    ASSERT_EQ(w.rows, b.rows);
    ASSERT_EQ(w.cols, a.cols);
    for (int64_t o = 0; o < w.rows; o += 7)
      for (int64_t col = 0; col < w.cols; col += 5) {
        double d = 0.0;
        for (int64_t j = 0; j < c.dim; ++j)
          d += static_cast<double>(adapters[b.offset + o * c.dim + j]) * adapters[a.offset + j * a.cols + col];
        const double want = base0[w.offset + o * w.cols + col] + 1.5 * d;
        EXPECT_NEAR(merged[w.offset + o * w.cols + col], want, 1e-6 * (1.0 + std::abs(want))) << w.name;
      }
  }
  const ParamEntry& proj = layout[static_cast<size_t>(1 + 6 + 2)];
  for (int64_t e = proj.offset; e < proj.offset + proj.numel(); ++e) ASSERT_EQ(merged[e], base0[e]) << "proj untouched";
  EXPECT_NE(merged, base0);
}

// The merged weights run as the full model give the LoRA model's loss, to the BF16 rounding of the merged weights
// (the same function: base(x) + s·B·A·x).
TEST(LoraExport, TheMergedModelsLossIsTheLoraModels) {
  const ModelConfig m = lora_export_tiny();
  const int64_t B = 2, S = 16;
  const LoraConfig c{.dim = 8, .alpha = 16.0};
  RunLayout layout;
  layout.lora = c;
  LlamaModel lora(m, B, S, OpContext{}, bf16_plan(m), layout);
  lora.init_parameters(6);
  const std::vector<float> adapters = random_values(lora.num_params(), 7, 0.05f);
  lora.write_master(0, adapters.data(), lora.num_params());
  lora.sync_weights_from_master();
  LlamaModel full(m, B, S, OpContext{});
  full.init_parameters(6);  // the same base
  std::vector<float> merged(static_cast<size_t>(m.num_parameters()));
  copy_to_host(merged.data(), full.master().flat);
  merge_lora_into(m, c, adapters, merged);
  full.write_master(0, merged.data(), m.num_parameters());
  full.sync_weights_from_master();
  std::mt19937 rng(9);
  std::vector<int32_t> tok(static_cast<size_t>(B * S)), lab(tok.size());
  for (auto& t : tok) t = static_cast<int32_t>(rng() % m.vocab_size);
  for (auto& t : lab) t = static_cast<int32_t>(rng() % m.vocab_size);
  LlamaModel base(m, B, S, OpContext{});
  base.init_parameters(6);
  const double with_lora = lora.forward(tok.data(), lab.data()), with_merged = full.forward(tok.data(), lab.data()),
               without = base.forward(tok.data(), lab.data());
  EXPECT_NEAR(with_merged, with_lora, 2e-3 * std::abs(with_lora));
  EXPECT_GT(std::abs(with_lora - without), 20.0 * std::abs(with_merged - with_lora)) << "the adapters matter";
}

TEST(LoraExport, PeftFilesHavePeftsNamesShapesAndFieldsAndReadBackExactly) {
  const ModelConfig m = lora_export_tiny();
  const LoraConfig c{.dim = 8, .alpha = 16.0, .dropout = 0.05};
  const std::vector<float> adapters = random_values(lora_parameter_count(m, c), 3, 0.1f);
  test::TempDir dir;
  const std::string d = dir.path().string();
  EXPECT_EQ(export_peft(m, c, adapters, d, "/models/base"),
            (std::vector<std::string>{"adapter_model.safetensors", "adapter_config.json"}));
  const nlohmann::json j = nlohmann::json::parse(read_regular_file(d + "/adapter_config.json"));
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["task_type"], "CAUSAL_LM");
  EXPECT_EQ(j["r"], 8);
  EXPECT_EQ(j["lora_alpha"], 16.0);
  EXPECT_EQ(j["lora_dropout"], 0.05);
  EXPECT_EQ(j["target_modules"], (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                           "up_proj", "down_proj"}));
  EXPECT_EQ(j["bias"], "none");
  EXPECT_EQ(j["base_model_name_or_path"], "/models/base");
  for (const char* key : {"fan_in_fan_out", "use_rslora", "use_dora"}) EXPECT_EQ(j[key], false) << key;
  EXPECT_TRUE(j["modules_to_save"].is_null());
  const SafetensorsFile f(d + "/adapter_model.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.tensors().size(), 2u * 7u * static_cast<size_t>(m.num_layers));
  const std::string p = "base_model.model.model.layers.1.";
  EXPECT_EQ(f.info(p + "self_attn.q_proj.lora_A.weight").shape, (std::vector<int64_t>{8, m.hidden_size}));
  EXPECT_EQ(f.info(p + "self_attn.q_proj.lora_B.weight").shape, (std::vector<int64_t>{m.q_dim(), 8}));
  EXPECT_EQ(f.info(p + "self_attn.k_proj.lora_B.weight").shape, (std::vector<int64_t>{m.kv_dim(), 8}));
  EXPECT_EQ(f.info(p + "mlp.up_proj.lora_B.weight").shape, (std::vector<int64_t>{m.ffn_hidden_size, 8}));
  EXPECT_EQ(f.info(p + "mlp.down_proj.lora_A.weight").shape, (std::vector<int64_t>{8, m.ffn_hidden_size}));
  EXPECT_EQ(f.read_float(p + "self_attn.q_proj.lora_A.weight"), f.read_float(p + "self_attn.v_proj.lora_A.weight"));
  // k_proj's B is rows [q, q + kv) of the fused B.
  const std::vector<ParamEntry> entries = lora_layout(m, c);
  const ParamEntry& b_qkv = entries[static_cast<size_t>(lora_entry_index(c, 1, 0) + 1)];
  const std::vector<float> kb = f.read_float(p + "self_attn.k_proj.lora_B.weight");
  EXPECT_EQ(kb, std::vector<float>(adapters.begin() + b_qkv.offset + m.q_dim() * 8,
                                   adapters.begin() + b_qkv.offset + (m.q_dim() + m.kv_dim()) * 8));
  const PeftAdapters back = read_peft(d, m);
  EXPECT_EQ(back.adapters, adapters) << "the round trip is exact";
  EXPECT_EQ(back.lora.dim, 8);
  EXPECT_EQ(back.lora.alpha, 16.0);
  EXPECT_EQ(back.lora.targets, c.targets);
}

TEST(LoraExport, APeftDirectoryThatIsNotOneAdapterPerFusedLayerIsOneLine) {
  const ModelConfig m = lora_export_tiny();
  LoraConfig c{.dim = 4, .alpha = 4.0};
  c.targets = {true, false, false, false};
  const std::vector<float> adapters = random_values(lora_parameter_count(m, c), 4, 0.1f);
  test::TempDir dir;
  const std::string d = dir.path().string();
  export_peft(m, c, adapters, d, "");
  // v_proj's A changed: PEFT's separate q/k/v adapters, which one fused adapter cannot hold.
  const SafetensorsFile f(d + "/adapter_model.safetensors");
  std::vector<std::vector<float>> data;
  std::vector<SafetensorsTensorOut> out;
  for (const SafetensorsTensorInfo& t : f.tensors()) data.push_back(f.read_float(t.name));
  size_t v_a = data.size();
  for (size_t i = 0; i < data.size(); ++i) {
    if (f.tensors()[i].name.find("layers.0.self_attn.v_proj.lora_A") != std::string::npos) v_a = i;
    if (i == v_a) data[i][0] += 1.0f;
    out.push_back({f.tensors()[i].name, "F32", f.tensors()[i].shape, data[i].data()});
  }
  test::TempDir other;
  export_peft(m, c, adapters, other.path().string(), "");
  write_safetensors(other.path().string() + "/adapter_model.safetensors", out);
  test::expect_one_line_error([&] { read_peft(other.path().string(), m); },
                              {"v_proj.lora_A.weight", "differs from the A of the other projections", "linear_qkv"});
  // An LM head beside the adapters (PEFT's modules_to_save): refused.
  std::vector<float> head(static_cast<size_t>(m.vocab_size * m.hidden_size), 0.0f);
  out.push_back({"base_model.model.lm_head.weight", "F32", {m.vocab_size, m.hidden_size}, head.data()});
  ASSERT_LT(v_a, data.size());
  data[v_a][0] = f.read_float(f.tensors()[v_a].name)[0];  // (the A of v_proj made equal again)
  write_safetensors(other.path().string() + "/adapter_model.safetensors", out);
  test::expect_one_line_error([&] { read_peft(other.path().string(), m); }, {"lm_head.weight", "unexpected tensor"});
}

}  // namespace
}  // namespace pl
