// FP8 primary weights (Megatron's fp8_param_gather, RunLayout::fp8_primary_weights): the FP8 layers keep no
// BF16 weights; their FP8 copies are made from the master through a transient BF16 rounding. A run with them
// must be the run without them, bit for bit: losses, gradient norms, master weights, quantization telemetry
// and every checkpoint file; a checkpoint of either resumes the other.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "config/precision_recipe.h"
#include "data/mock_dataset.h"
#include "model/llama.h"
#include "model/memory_plan.h"
#include "model/precision_plan.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/mock_runs.h"
#include "train/run_recorder.h"
#include "train/trainer.h"

namespace pl {
namespace {

// llama_tiny with 4 layers, so that the FP8 recipes (first and last layer BF16) have two FP8 layers.
ModelConfig four_layer_tiny() {
  ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  m.num_layers = 4;
  return m;
}

struct PrimaryRun {
  TrainConfig t;
  ModelConfig m = four_layer_tiny();
  std::string recipe;
  PrecisionPlan plan;
  std::unique_ptr<data::MockGPTDataset> data;
  std::unique_ptr<LlamaModel> model;
  PrimaryRun(const std::string& recipe_name, bool primary, uint64_t seed = 1234) : recipe(recipe_name) {
    t.train_iters = 6;
    t.warmup_iters = 2;
    t.global_batch_size = 4;
    t.micro_batch_size = 2;
    t.seq_length = 32;
    plan = make_precision_plan(m, load_precision_recipe(std::string(PL_CONFIG_DIR) + "/recipes/" + recipe + ".json"));
    data = std::make_unique<data::MockGPTDataset>(
        data::MockDataConfig{m.vocab_size, m.vocab_size - 1, t.seq_length, t.train_iters * t.global_batch_size, 77});
    RunLayout layout;
    layout.fp8_primary_weights = primary;
    layout.loss_micro_batches = t.num_micro_batches();
    model = std::make_unique<LlamaModel>(m, t.micro_batch_size, t.seq_length, OpContext{}, plan, layout);
    model->init_parameters(seed);
  }
  RunDescription describe() const { return test::mock_run_description(m, recipe, t); }
  Trainer trainer(std::vector<TrainObserver*> observers = {}) {
    return Trainer(*model, t, Batches{test::mock_batches(*data, t)}, std::move(observers));
  }
};

std::vector<char> file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

bool fp8_primary_weights_same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

TEST(Fp8PrimaryWeights, TheFp8LayersKeepNoBf16Weights) {
  const PrimaryRun on("bf16_with_fp8_current_scaling_mixed", true), off("bf16_with_fp8_current_scaling_mixed", false);
  EXPECT_TRUE(on.model->fp8_primary_weights());
  EXPECT_FALSE(off.model->fp8_primary_weights());
  ParamViews& w = on.model->weights();
  EXPECT_EQ(w.flat.numel(), 0);
  for (int64_t l = 0; l < 4; ++l) {
    const bool fp8 = l == 1 || l == 2;  // the recipe keeps the first and last layer in BF16
    for (const Tensor* t : {&w.layers[l].qkv, &w.layers[l].proj, &w.layers[l].fc1, &w.layers[l].fc2})
      EXPECT_EQ(t->data == nullptr, fp8) << "layer " << l;
    EXPECT_NE(w.layers[l].ln1.data, nullptr);
    EXPECT_NE(w.layers[l].ln2.data, nullptr);
  }
  // The plan: the BF16 weights less the FP8 layers' matrices, plus one rounding scratch of the largest of them.
  const ModelConfig& m = on.m;
  const int64_t fc1 = 2 * m.ffn_hidden_size * m.hidden_size;
  const int64_t layer = m.qkv_dim() * m.hidden_size + m.hidden_size * m.q_dim() + fc1 + m.hidden_size * m.ffn_hidden_size;
  EXPECT_EQ(on.model->memory_plan().weights, static_cast<double>((m.num_parameters() - 2 * layer + fc1) * 4));
  EXPECT_EQ(off.model->memory_plan().weights, static_cast<double>(m.num_parameters() * 4));
  EXPECT_EQ(on.model->memory_plan().weights_label, "weights (bf16 but FP8 layers)");
  EXPECT_EQ(off.model->memory_plan().weights_label, "");
}

TEST(Fp8PrimaryWeights, OnlyTheFp8FormatsAndNotWithTheOffloadOrTheDistributedOptimizer) {
  const ModelConfig m = four_layer_tiny();
  const auto plan_of = [&](const char* recipe) {
    return make_precision_plan(m, load_precision_recipe(std::string(PL_CONFIG_DIR) + "/recipes/" + recipe + ".json"));
  };
  RunLayout o;
  o.fp8_primary_weights = true;
  for (const char* r : {"bf16_with_fp8_current_scaling_mixed", "bf16_with_fp8_delayed_scaling_mixed",
                        "bf16_with_mxfp8_mixed", "bf16_with_fp8_current_scaling_e4m3_mixed"})
    EXPECT_TRUE(fp8_primary_weights_in_effect(plan_of(r), o)) << r;
  for (const char* r : {"bf16_mixed", "bf16_with_nvfp4_mixed"}) {
    EXPECT_FALSE(fp8_primary_weights_in_effect(plan_of(r), o)) << r;
    EXPECT_EQ(fp8_primary_weights_off_because(plan_of(r), o), nullptr) << r;  // nothing to turn off
  }
  const PrecisionPlan fp8 = plan_of("bf16_with_fp8_current_scaling_mixed");
  RunLayout offload = o, sharded = o;
  offload.optimizer_offload = true;
  sharded.distributed_optimizer = true;
  EXPECT_FALSE(fp8_primary_weights_in_effect(fp8, offload));
  EXPECT_NE(std::string(fp8_primary_weights_off_because(fp8, offload)).find("--optimizer-cpu-offload"), std::string::npos);
  EXPECT_FALSE(fp8_primary_weights_in_effect(fp8, sharded));
  EXPECT_NE(fp8_primary_weights_off_because(fp8, sharded), nullptr);
  // The kept ranges: everything but layers 1 and 2's four matrices, adjacent entries merged.
  const std::vector<int64_t> kept = bf16_weight_ranges(m, fp8, o);
  const std::vector<ParamEntry> e = param_layout(m);
  const auto entry = [&](int64_t layer, int k) { return e[1 + kEntriesPerLayer * static_cast<size_t>(layer) + k]; };
  const std::vector<int64_t> expected = {0, entry(1, 1).offset,  // the embedding, layer 0, layer 1's ln1
                                         entry(1, 3).offset, entry(1, 4).offset,  // layer 1's ln2
                                         entry(2, 0).offset, entry(2, 1).offset,  // layer 2's ln1
                                         entry(2, 3).offset, entry(2, 4).offset,  // layer 2's ln2
                                         entry(3, 0).offset, m.num_parameters()};  // layer 3, final norm, LM head
  EXPECT_EQ(kept, expected);
  EXPECT_EQ(bf16_weight_ranges(m, fp8, RunLayout{}), (std::vector<int64_t>{0, m.num_parameters()}));
  EXPECT_EQ(primary_weight_scratch_elements(fp8, o), 2 * m.ffn_hidden_size * m.hidden_size);
  EXPECT_EQ(primary_weight_scratch_elements(fp8, offload), 0);
}

// Losses, gradient norms and master weights of a whole run, with and without, for every FP8 weight format.
TEST(Fp8PrimaryWeights, TrainingIsBitIdenticalWithAndWithout) {
  for (const char* recipe : {"bf16_with_fp8_current_scaling_mixed", "bf16_with_fp8_delayed_scaling_mixed",
                             "bf16_with_mxfp8_mixed"}) {
    SCOPED_TRACE(recipe);
    PrimaryRun on(recipe, true), off(recipe, false);
    test::RunRecorder ron, roff;
    const log::RunEnd end = on.trainer({&ron}).run();
    off.trainer({&roff}).run();
    EXPECT_EQ(end.allocations_in_loop, 0u);
    ASSERT_EQ(ron.loss().size(), 6u);
    EXPECT_TRUE(fp8_primary_weights_same_bits(ron.loss(), roff.loss()));
    EXPECT_TRUE(fp8_primary_weights_same_bits(ron.grad_norm(), roff.grad_norm()));
    EXPECT_LT(ron.loss().back(), ron.loss().front());
    const size_t n = static_cast<size_t>(on.model->num_params());
    EXPECT_EQ(std::memcmp(on.model->master().flat.data, off.model->master().flat.data, n * 4), 0);
    // The BF16 weights as a checkpoint reads them: the kept ones from the packed buffer, the rest rounded
    // from the master, equal to the other model's stored weights.
    std::vector<float> a(n), b(n);
    on.model->weights_to_host(0, static_cast<int64_t>(n), a.data());
    off.model->weights_to_host(0, static_cast<int64_t>(n), b.data());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), n * 4), 0);
    // A piece that starts inside a range and ends inside another.
    const int64_t first = param_layout(on.m)[8].offset + 3, count = 5000;
    std::vector<float> piece(static_cast<size_t>(count));
    on.model->weights_to_host(first, count, piece.data());
    EXPECT_EQ(std::memcmp(piece.data(), b.data() + first, static_cast<size_t>(count) * 4), 0);
  }
}

// The telemetry of the weights reads the rounded master: the same statistics as from the BF16 weights.
TEST(Fp8PrimaryWeights, QuantizationStatisticsAreTheSame) {
  PrimaryRun on("bf16_with_fp8_current_scaling_mixed", true), off("bf16_with_fp8_current_scaling_mixed", false);
  std::vector<int32_t> tok(64), lab(64);
  on.data->micro_batch(0, 0, 2, tok, lab);
  const MicroBatchOptions step{.counter = 1, .collect_quant_stats = true};
  const double la = on.model->forward_backward(tok.data(), lab.data(), 1.0f, step);
  const double lb = off.model->forward_backward(tok.data(), lab.data(), 1.0f, step);
  EXPECT_EQ(la, lb);
  const std::vector<LinearStats> sa = on.model->quant_stats(), sb = off.model->quant_stats();
  ASSERT_EQ(sa.size(), 8u);  // layers 1 and 2, four linears each
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    ASSERT_EQ(sa[i].operands.size(), sb[i].operands.size());
    for (size_t k = 0; k < sa[i].operands.size(); ++k) {
      const QuantStats& x = sa[i].operands[k].stats;
      const QuantStats& y = sb[i].operands[k].stats;
      EXPECT_EQ(std::memcmp(&x, &y, sizeof x), 0) << sa[i].linear << " " << sa[i].operands[k].operand;
    }
  }
}

// A checkpoint saved with FP8 primary weights holds the same files as one saved without, and either resumes
// the other run bit for bit.
TEST(Fp8PrimaryWeights, CheckpointsAreTheSameFilesAndResumeEitherWay) {
  const std::string recipe = "bf16_with_fp8_current_scaling_mixed";
  test::TempDir dir;
  PrimaryRun on(recipe, true), off(recipe, false);
  on.t.train_iters = off.t.train_iters = 3;
  Trainer a = on.trainer(), b = off.trainer();
  a.run();
  b.run();
  TrainState st;
  st.iteration = 3;
  save_checkpoint((dir.path() / "on").string(), 0, *on.model, a.optimizer(), st, on.describe());
  save_checkpoint((dir.path() / "off").string(), 0, *off.model, b.optimizer(), st, off.describe());
  for (const char* f : {"weights_bf16.bin", "master_fp32.bin", "adam_m_fp32.bin", "adam_v_fp32.bin"}) {
    SCOPED_TRACE(f);
    const std::vector<char> x = file_bytes(dir.path() / "on" / "iter_0000003" / f);
    EXPECT_FALSE(x.empty());
    EXPECT_EQ(x, file_bytes(dir.path() / "off" / "iter_0000003" / f));
  }
  // The other's checkpoint into fresh models (other initial weights), then three more iterations each.
  PrimaryRun on2(recipe, true, 999), off2(recipe, false, 999);
  Trainer a2 = on2.trainer(), b2 = off2.trainer();
  restore_checkpoint(verify_checkpoint((dir.path() / "off").string()), *on2.model, a2.optimizer(), false);
  restore_checkpoint(verify_checkpoint((dir.path() / "on").string()), *off2.model, b2.optimizer(), false);
  const size_t n = static_cast<size_t>(on.model->num_params());
  EXPECT_EQ(std::memcmp(on2.model->master().flat.data, on.model->master().flat.data, n * 4), 0);
  std::vector<float> w(n);
  on2.model->weights_to_host(0, static_cast<int64_t>(n), w.data());
  EXPECT_EQ(std::memcmp(w.data(), off2.model->weights().flat.data, n * 4), 0);
  // The restored FP8 copies: one more forward gives the same loss on both.
  std::vector<int32_t> tok(64), lab(64);
  on.data->micro_batch(3 * 4, 0, 2, tok, lab);
  EXPECT_EQ(on2.model->forward(tok.data(), lab.data()), off2.model->forward(tok.data(), lab.data()));
  EXPECT_EQ(on2.model->forward(tok.data(), lab.data()), on.model->forward(tok.data(), lab.data()));
}

}  // namespace
}  // namespace pl
