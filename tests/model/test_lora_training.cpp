// LoRA on a frozen base (issue 41), on the CPU backend:
//   - with B = 0 the first losses (evaluation and training forward) equal the full model's in the same recipe, bit
//     for bit (BF16, FP8 current scaling, NVFP4 with RHT and stochastic rounding);
//   - after AdamW steps the base's weights are byte for byte what they were and every adapter moved;
//   - the adapters' gradients equal central finite differences of the training loss in the plain-FP32 mode (all
//     four targets, dropout on before A and after B, alpha/dim = 1.5, two packed documents per row);
//   - the flat buffers hold the adapters only (Megatron-Bridge's names and shapes), and B starts at zero.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <vector>

#include "config/model_config.h"
#include "config/precision_recipe.h"
#include "data/documents.h"
#include "model/hf_llama.h"
#include "numerics/bf16.h"
#include "model/llama.h"
#include "train/optimizer.h"

namespace pl {
namespace {

ModelConfig lora_training_tiny() { return load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json"); }

// The recipe with every layer in its format (the tiny model would otherwise keep its edge layers in BF16).
PrecisionPlan all_layers(const ModelConfig& m, const std::string& recipe) {
  PrecisionRecipe r = load_precision_recipe(std::string(PL_CONFIG_DIR) + "/recipes/" + recipe + ".json");
  r.first_last_layers_bf16 = false;
  return make_precision_plan(m, r);
}

RunLayout lora_layout_with(LoraConfig c) {
  RunLayout o;
  o.lora = c;
  return o;
}

struct LoraTrainingBatch {
  std::vector<int32_t> tokens, labels;
};
LoraTrainingBatch random_batch(const ModelConfig& m, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(m.vocab_size - 1));
  LoraTrainingBatch b{std::vector<int32_t>(static_cast<size_t>(n)), std::vector<int32_t>(static_cast<size_t>(n))};
  for (auto& t : b.tokens) t = tok(rng);
  for (auto& t : b.labels) t = tok(rng);
  return b;
}

std::vector<float> host_of(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  copy_to_host(v.data(), t);
  return v;
}

TEST(LoraTraining, TheFlatBuffersHoldTheAdaptersWithMegatronBridgeNames) {
  const ModelConfig m = lora_training_tiny();
  LoraConfig c{.dim = 4, .alpha = 8.0};
  c.targets = {true, false, true, false};
  LlamaModel model(m, 1, 16, OpContext{}, bf16_plan(m), lora_layout_with(c));
  model.init_parameters(3);
  ASSERT_TRUE(model.lora());
  EXPECT_EQ(model.num_params(), lora_parameter_count(m, c));
  ASSERT_EQ(model.param_entries().size(), 2u * 2u * static_cast<size_t>(m.num_layers));
  const ParamEntry& a = model.param_entries()[0];
  const ParamEntry& b = model.param_entries()[1];
  EXPECT_EQ(a.name, "decoder.layers.0.self_attention.linear_qkv.adapter.linear_in.weight");
  EXPECT_EQ(b.name, "decoder.layers.0.self_attention.linear_qkv.adapter.linear_out.weight");
  EXPECT_EQ(model.param_entries()[2].name, "decoder.layers.0.mlp.linear_fc1.adapter.linear_in.weight");
  EXPECT_EQ(a.rows, 4);
  EXPECT_EQ(a.cols, m.hidden_size);
  EXPECT_EQ(b.rows, m.qkv_dim());
  EXPECT_EQ(b.cols, 4);
  const std::vector<float> w = host_of(model.master().flat);
  double a_sq = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) a_sq += static_cast<double>(w[a.offset + i]) * w[a.offset + i];
  // xavier_normal: std sqrt(2 / (in + dim))
  const double xavier = std::sqrt(2.0 / (static_cast<double>(m.hidden_size) + 4.0));
  EXPECT_NEAR(std::sqrt(a_sq / static_cast<double>(a.numel())), xavier, 0.1 * xavier);
  for (int64_t i = 0; i < b.numel(); ++i) ASSERT_EQ(w[b.offset + i], 0.0f) << "B starts at zero";
  EXPECT_EQ(model.memory_plan().weights_label, "weights (adapters + frozen base, bf16 but its quantized linears)");
}

// B = 0: the adapters add exact zeros, so every loss of the first step is the full model's in the same recipe.
TEST(LoraTraining, WithBZeroTheFirstLossesEqualTheFullModelsBitForBit) {
  const ModelConfig m = lora_training_tiny();
  const int64_t B = 2, S = 16;
  const LoraTrainingBatch batch = random_batch(m, B * S, 5);
  for (const std::string recipe : {"bf16_mixed", "bf16_with_fp8_current_scaling_mixed", "bf16_with_nvfp4_mixed"}) {
    const PrecisionPlan plan = all_layers(m, recipe);
    LlamaModel full(m, B, S, OpContext{}, plan);
    full.init_parameters(21);
    LoraConfig c{.dim = 8, .alpha = 16.0, .dropout = 0.1};
    LlamaModel lora(m, B, S, OpContext{}, plan, lora_layout_with(c));
    lora.init_parameters(21);
    EXPECT_EQ(full.forward(batch.tokens.data(), batch.labels.data()),
              lora.forward(batch.tokens.data(), batch.labels.data()))
        << recipe;
    const MicroBatchOptions step{.counter = 9};
    EXPECT_EQ(full.forward_backward(batch.tokens.data(), batch.labels.data(), 1.0f, step),
              lora.forward_backward(batch.tokens.data(), batch.labels.data(), 1.0f, step))
        << recipe;
  }
}

// A Hugging Face base goes into the frozen base (write_base), not into the adapters' master weights: the LoRA
// model's first loss is the full model's from the same directory, and the adapters keep their initial values.
// The values an HF export of `master` holds (BF16, round to nearest even), as FP32.
std::vector<float> master_rounded(std::vector<float> v) {
  for (float& x : v) x = num::round_bf16(x);
  return v;
}

TEST(LoraTraining, AHuggingFaceBaseFillsTheFrozenBase) {
  const ModelConfig m = lora_training_tiny();
  const int64_t B = 2, S = 16;
  std::vector<float> master(static_cast<size_t>(m.num_parameters()));
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (float& v : master) v = nd(rng);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "pl_lora_hf_base";
  std::filesystem::remove_all(dir);
  export_hf(m, master, dir.string());
  // BF16, and NVFP4 whose linears keep no BF16 copy (q, k, v arrive one by one: the copies are made once the fused
  // weight is whole).
  for (const PrecisionPlan& plan : {bf16_plan(m), all_layers(m, "bf16_with_nvfp4_mixed")}) {
    LlamaModel full(m, B, S, OpContext{}, plan);
    import_hf(dir.string(), full);
    LlamaModel lora(m, B, S, OpContext{}, plan, lora_layout_with(LoraConfig{.dim = 4, .alpha = 4.0}));
    lora.init_adapters(5);
    const std::vector<float> adapters = host_of(lora.master().flat);
    import_hf(dir.string(), lora);
    const LoraTrainingBatch batch = random_batch(m, B * S, 3);
    EXPECT_EQ(full.forward(batch.tokens.data(), batch.labels.data()),
              lora.forward(batch.tokens.data(), batch.labels.data()));
    EXPECT_EQ(host_of(lora.master().flat), adapters);
    EXPECT_EQ(lora.base_checksum(), lora_base_checksum(m, master_rounded(master))) << "the record's checksum";
  }
  std::filesystem::remove_all(dir);
}

// AdamW over the adapters: the base's BF16 weights keep every byte, its quantized-only linears (no BF16 copy: every
// NVFP4 layer here) their copies, so with B zeroed again the model is the full model's first step bit for bit; A and
// B move.
TEST(LoraTraining, AfterStepsTheBaseIsUnchangedAndOnlyTheAdaptersMoved) {
  const ModelConfig m = lora_training_tiny();
  const int64_t B = 2, S = 16;
  const PrecisionPlan plan = all_layers(m, "bf16_with_nvfp4_mixed");
  LlamaModel model(m, B, S, OpContext{}, plan, lora_layout_with(LoraConfig{.dim = 4, .alpha = 4.0, .dropout = 0.2}));
  model.init_parameters(8);
  const ParamViews& w = model.weights();
  for (const LayerParams& l : w.layers)
    for (const Tensor* t : {&l.qkv, &l.proj, &l.fc1, &l.fc2}) EXPECT_EQ(t->data, nullptr) << "no BF16 copy kept";
  std::vector<std::vector<float>> base_before;
  for (const Tensor* t : {&w.embedding, &w.final_norm, &w.lm_head}) base_before.push_back(host_of(*t));
  for (const LayerParams& l : w.layers)
    for (const Tensor* t : {&l.ln1, &l.ln2}) base_before.push_back(host_of(*t));
  const uint64_t checksum = model.base_checksum();
  LlamaModel full(m, B, S, OpContext{}, plan);
  full.init_parameters(8);
  const std::vector<float> adapters_before = host_of(model.master().flat);
  AdamW opt(model, OptimizerConfig{});
  double first = 0.0, last = 0.0;
  const LoraTrainingBatch batch = random_batch(m, B * S, 6);
  for (int it = 0; it < 8; ++it) {
    model.zero_grads();
    const double loss = model.forward_backward(batch.tokens.data(), batch.labels.data(), 1.0f / (B * S),
                                               MicroBatchOptions{.counter = static_cast<uint64_t>(it)});
    (it == 0 ? first : last) = loss;
    EXPECT_FALSE(opt.step(1e-2).skipped);
    model.prepare_weights();  // what the trainer does after a step: the base's copies made again from its weights
  }
  EXPECT_LT(last, first) << "the adapters learn the batch";
  size_t i = 0;
  for (const Tensor* t : {&w.embedding, &w.final_norm, &w.lm_head}) EXPECT_EQ(host_of(*t), base_before[i++]);
  for (const LayerParams& l : w.layers)
    for (const Tensor* t : {&l.ln1, &l.ln2}) EXPECT_EQ(host_of(*t), base_before[i++]);
  EXPECT_EQ(model.base_checksum(), checksum);
  std::vector<float> adapters = host_of(model.master().flat);
  for (const ParamEntry& e : model.param_entries()) {
    int64_t moved = 0;
    for (int64_t k = 0; k < e.numel(); ++k) moved += adapters[e.offset + k] != adapters_before[e.offset + k] ? 1 : 0;
    EXPECT_GT(moved, e.numel() / 2) << e.name;
    if (e.name.ends_with("linear_out.weight")) std::fill_n(adapters.begin() + e.offset, e.numel(), 0.0f);
  }
  model.write_master(0, adapters.data(), model.num_params());
  model.sync_weights_from_master();
  EXPECT_EQ(model.forward(batch.tokens.data(), batch.labels.data()), full.forward(batch.tokens.data(), batch.labels.data()))
      << "B = 0 again: the frozen base's quantized copies are the full model's";
}

// Central finite differences of the training loss (dropout on: the same masks, from the same counter) against the
// analytic adapter gradients, plain FP32, two documents per row (positions restart, attention split).
TEST(LoraTraining, AdapterGradientsMatchFiniteDifferencesWithDropoutAndPackedDocuments) {
  const ModelConfig m = lora_training_tiny();
  const int64_t B = 2, S = 8;
  for (const LoraDropoutPosition where : {LoraDropoutPosition::Pre, LoraDropoutPosition::Post}) {
    OpContext ctx;
    ctx.round_bf16 = false;
    LoraConfig c{.dim = 4, .alpha = 6.0, .dropout = 0.25, .dropout_position = where};
    RunLayout layout = lora_layout_with(c);
    layout.packing = data::packing_for_data(true, {});
    LlamaModel model(m, B, S, ctx, bf16_plan(m), layout);
    model.init_parameters(17);
    // Larger weights than the defaults (as the whole-model gradcheck), B nonzero so A gets gradient.
    float* master = model.master().flat.f32();
    std::mt19937 rng(4);
    std::normal_distribution<float> nd(0.0f, 0.5f);
    for (const ParamEntry& e : model.param_entries())
      for (int64_t i = 0; i < e.numel(); ++i)
        master[e.offset + i] = e.name.ends_with("linear_out.weight") ? nd(rng) : 4.0f * master[e.offset + i];
    model.sync_weights_from_master();
    LoraTrainingBatch batch = random_batch(m, B * S, 12);
    std::vector<int32_t> positions = {0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 0, 1};
    batch.labels[3] = -1;  // a masked position
    const uint64_t counter = 77;
    const auto training_loss = [&] {
      model.queue_training_forward(0, batch.tokens.data(), batch.labels.data(), 1.0f, positions.data(), counter);
      return model.add_loss_sums(1, 0.0);
    };
    model.zero_grads();
    model.forward_backward(batch.tokens.data(), batch.labels.data(), 1.0f, MicroBatchOptions{.counter = counter},
                           positions.data());
    const std::vector<float> grad = host_of(model.grads().flat);
    for (const ParamEntry& e : model.param_entries()) {
      std::vector<int64_t> idx(static_cast<size_t>(e.numel()));
      for (int64_t i = 0; i < e.numel(); ++i) idx[static_cast<size_t>(i)] = i;
      std::partial_sort(idx.begin(), idx.begin() + 3, idx.end(), [&](int64_t a, int64_t b) {
        return std::abs(grad[e.offset + a]) > std::abs(grad[e.offset + b]);
      });
      idx.resize(3);
      idx.push_back(std::uniform_int_distribution<int64_t>(0, e.numel() - 1)(rng));
      const double max_abs = std::abs(grad[e.offset + idx[0]]);
      ASSERT_GT(max_abs, 0.0) << e.name << " has an all-zero gradient";
      for (int64_t i : idx) {
        float& v = master[e.offset + i];
        const float v0 = v, h = std::max(2.5e-4f, 2.5e-4f * std::abs(v0));
        v = v0 + h;
        model.sync_weights_from_master();
        const double up = training_loss();
        v = v0 - h;
        model.sync_weights_from_master();
        const double down = training_loss();
        v = v0;
        const double fd = (up - down) / (static_cast<double>(v0 + h) - static_cast<double>(v0 - h));
        EXPECT_NEAR(grad[e.offset + i], fd, 2e-2 * max_abs + 2e-3)
            << e.name << " element " << i << " dropout " << lora_dropout_position_name(where);
      }
      model.sync_weights_from_master();
    }
  }
}

}  // namespace
}  // namespace pl
