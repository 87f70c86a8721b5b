// Full recomputation re-runs each layer's forward in the backward pass from the kept layer input:
// it must give exactly the gradients of the stored-activation backward, with less memory planned.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "config/model_config.h"
#include "config/precision_recipe.h"
#include "model/llama.h"
#include "model/precision_plan.h"

namespace pl {
namespace {

std::vector<float> grads_of(const ModelConfig& m, const PrecisionPlan& plan, bool recompute) {
  LlamaModel model(m, 2, 32, OpContext{}, plan, RunLayout{recompute});
  model.init_parameters(5);
  std::mt19937 rng(3);
  std::vector<int32_t> tok(64), lab(64);
  for (auto& t : tok) t = static_cast<int32_t>(rng() % m.vocab_size);
  for (auto& t : lab) t = static_cast<int32_t>(rng() % m.vocab_size);
  model.zero_grads();
  model.forward_backward(tok.data(), lab.data(), 1.0f / 64, MicroBatchOptions{9});
  return std::vector<float>(model.grads().flat.f32(), model.grads().flat.f32() + model.num_params());
}

TEST(ModelRecompute, FullRecomputationGivesIdenticalGradients) {
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  for (const char* recipe : {"bf16_mixed", "bf16_with_nvfp4_mixed"}) {
    SCOPED_TRACE(recipe);
    const PrecisionPlan plan =
        make_precision_plan(m, load_precision_recipe(std::string(PL_CONFIG_DIR) + "/recipes/" + recipe + ".json"));
    const std::vector<float> stored = grads_of(m, plan, false), recomputed = grads_of(m, plan, true);
    ASSERT_EQ(stored.size(), recomputed.size());
    for (size_t i = 0; i < stored.size(); ++i) ASSERT_EQ(stored[i], recomputed[i]) << "gradient element " << i;
  }
}

TEST(ModelRecompute, PlansLessActivationMemoryAndNoOtherChange) {
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama3_8b.json");
  const PrecisionPlan plan = bf16_plan(m);  // a GPU plan: nothing is allocated, no GPU is touched
  const MemoryPlan full = plan_memory(m, 4, 4096, Device::CUDA, plan, RunLayout{true}, 0);
  const MemoryPlan none = plan_memory(m, 4, 4096, Device::CUDA, plan, RunLayout{false}, 0);
  EXPECT_LT(full.activations, 0.3 * none.activations);
  EXPECT_EQ(full.weights_and_optimizer(), none.weights_and_optimizer());
  // bf16 weights 2 + fp32 grads 4 + master 4 + Adam 8 = 18 bytes per parameter (Megatron's 6 + 12/DP).
  EXPECT_DOUBLE_EQ(none.weights_and_optimizer(), 18.0 * static_cast<double>(m.num_parameters()));
}

}  // namespace
}  // namespace pl
