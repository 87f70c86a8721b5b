// Issue 43 on the GPU against the CPU backend (skipped without a device): multiple-choice scoring through the
// evaluation model -- LlamaModel::score's per-position losses and its is_greedy, which reads BF16 logits rows back
// on a GPU (FP32 on the CPU) -- in BF16 and through the NVFP4 recipe's forward, and the frozen model without
// adapters on the device (nothing trainable allocated).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "config/precision_recipe.h"
#include "cuda_test_util.h"
#include "data/tokenizer.h"
#include "eval/harness.h"
#include "model/llama.h"
#include "model/model_test_util.h"
#include "parallel/world.h"
#include "test_util.h"

namespace pl {
namespace {

ModelConfig bytes_model() { return tiny_bytes_model(); }

std::vector<eval::ChoiceScore> scores_on(Device device, const PrecisionPlan& plan, const std::vector<eval::Request>& rq,
                                         int64_t longest) {
  const ModelConfig m = bytes_model();
  OpContext ctx = device == Device::CUDA ? test::cuda_ctx() : OpContext{};
  ctx.round_bf16 = true;
  const std::vector<float> w = initial_masters(m, 43);
  // The same length on both devices (the GPU's NVFP4 token block is 32, the CPU's 16): the padding rows are part of
  // a quantized forward's per-tensor amax.
  std::unique_ptr<LlamaModel> model = eval::make_eval_model(m, plan, nullptr, 8, (longest + 31) / 32 * 32, ctx);
  EXPECT_EQ(model->num_params(), 0);
  model->write_base(0, w.data(), static_cast<int64_t>(w.size()));
  eval::finish_eval_weights(*model);
  return eval::score_requests(*model, rq, parallel::World::single());
}

// Generic documents of several lengths, and every one-token continuation of one context (one of them greedy).
std::vector<eval::Request> requests(test::TempDir& dir, int64_t& longest) {
  const auto tok = data::make_tokenizer("byte", "");
  std::string lines;
  for (int i = 0; i < 12; ++i)
    lines += "{\"context\": \"Item " + std::to_string(i) + std::string(static_cast<size_t>(i * 3), 'x') +
             " is\", \"choices\": [\"red\", \"a green one\", \"blue\"], \"label\": 0}\n";
  const eval::PreparedTask t = eval::prepare_task({dir.write("g.jsonl", lines), "", 0, 0}, *tok, {false, 4096});
  std::vector<eval::Request> rq = t.requests;
  const std::vector<int32_t> ctx = tok->encode("Hello wor");
  for (int32_t v = 0; v < 258; ++v) rq.push_back({0, v, "Hello wor", "?", ctx, 1, v});
  longest = eval::longest_request({&t, 1});
  return rq;
}

void cuda_eval_expect_close(const std::vector<eval::ChoiceScore>& gpu, const std::vector<eval::ChoiceScore>& cpu,
                            const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size());
  int greedy_differs = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    // BF16 activations on both sides, other summation orders (as CudaModel's whole-model comparisons).
    EXPECT_NEAR(gpu[i].loglikelihood, cpu[i].loglikelihood, 0.02 + 0.02 * std::fabs(cpu[i].loglikelihood))
        << what << " request " << i;
    greedy_differs += gpu[i].greedy != cpu[i].greedy ? 1 : 0;
  }
  EXPECT_LE(greedy_differs, 2) << what << ": is_greedy differs beyond a near-tie";
}

TEST(CudaEval, ScoresAndIsGreedyMatchTheCpuInBf16AndNvfp4) {
  PL_REQUIRE_CUDA_DEVICE();
  test::TempDir dir;
  int64_t longest = 0;
  const std::vector<eval::Request> rq = requests(dir, longest);
  const ModelConfig m = bytes_model();
  cuda_eval_expect_close(scores_on(Device::CUDA, bf16_plan(m), rq, longest), scores_on(Device::CPU, bf16_plan(m), rq, longest),
                         "bf16");
  PrecisionRecipe r = load_precision_recipe(std::string(PL_CONFIG_DIR) + "/recipes/bf16_with_nvfp4_mixed.json");
  r.first_last_layers_bf16 = false;  // every layer in NVFP4 (the CPU's and the GPU's token blocks: 32)
  r.num_layers_at_start_in_bf16 = r.num_layers_at_end_in_bf16 = 0;
  const PrecisionPlan nvfp4 = make_precision_plan(m, r);
  cuda_eval_expect_close(scores_on(Device::CUDA, nvfp4, rq, longest), scores_on(Device::CPU, nvfp4, rq, longest), "nvfp4");
}

}  // namespace
}  // namespace pl
