// Whole-model GPU conformance: one training step of llama_tiny on the CPU and on the GPU from the
// same initial weights (the initialisation is counter-based, so both backends start from identical
// master weights): the loss and every parameter tensor's gradient are compared.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "config/model_config.h"
#include "config/precision_recipe.h"
#include "cuda_test_util.h"
#include "model/llama.h"
#include "model/precision_plan.h"

namespace pl {
namespace {

struct StepResult {
  double loss;
  std::vector<float> grads;
};

StepResult one_step(Device device, const std::string& recipe) {
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  const PrecisionPlan plan =
      make_precision_plan(m, load_precision_recipe(std::string(PL_CONFIG_DIR) + "/recipes/" + recipe + ".json"));
  OpContext ctx = device == Device::CUDA ? test::cuda_ctx() : OpContext{};
  LlamaModel model(m, 2, 64, ctx, plan);
  model.init_parameters(1234);
  std::mt19937 rng(7);
  std::vector<int32_t> tok(128), lab(128);
  for (auto& t : tok) t = static_cast<int32_t>(rng() % m.vocab_size);
  for (auto& t : lab) t = static_cast<int32_t>(rng() % m.vocab_size);
  model.zero_grads();
  const double loss = model.forward_backward(tok.data(), lab.data(), 1.0f / 128, StepOptions{0}) / 128.0;
  StepResult r{loss, std::vector<float>(static_cast<size_t>(model.num_params()))};
  copy_to_host(r.grads.data(), model.grads().flat);
  return r;
}

// Per tensor: relative L2 difference of the gradients. BF16 activations on both sides, but different
// summation orders (cuBLASLt, cuDNN flash attention with BF16 probabilities, CUB reductions) and
// device expf: differences of a few BF16 ulps per element, ~1e-2 relative per tensor at most.
void compare(const std::string& recipe, double bound) {
  SCOPED_TRACE(recipe);
  const StepResult cpu = one_step(Device::CPU, recipe), gpu = one_step(Device::CUDA, recipe);
  EXPECT_NEAR(gpu.loss, cpu.loss, 2e-3 * std::abs(cpu.loss));
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  for (const ParamEntry& e : param_layout(m)) {
    double num = 0.0, den = 0.0;
    for (int64_t i = e.offset; i < e.offset + e.numel(); ++i) {
      const double d = static_cast<double>(gpu.grads[i]) - cpu.grads[i];
      num += d * d;
      den += static_cast<double>(cpu.grads[i]) * cpu.grads[i];
    }
    EXPECT_LT(std::sqrt(num / std::max(den, 1e-30)), bound) << e.name;
  }
}

TEST(CudaModel, OneBf16TrainingStepMatchesTheCpu) {
  PL_REQUIRE_CUDA_DEVICE();
  compare("bf16_mixed", 2e-2);
}

TEST(CudaModel, OneNvfp4TrainingStepMatchesTheCpu) {
  PL_REQUIRE_CUDA_DEVICE();
  // Quantization is bit-exact across backends, but a one-ulp difference in a BF16 input can move an
  // element across an E2M1 rounding boundary (one FP4 step, up to 1/6 of its block max), so the
  // bound is wider than for BF16.
  compare("bf16_with_nvfp4_mixed", 8e-2);
}

// The loss read once per iteration and the pinned, asynchronous token upload: three micro-batches are
// queued through one host array that is overwritten between the calls (while earlier copies may still
// be pending), their losses stay on the device and are read by one add_loss_sums; the result must equal,
// bit for bit, the same micro-batches run one at a time with the loss read after each (the forward is
// deterministic on the GPU, and the host adds the same doubles in the same order).
TEST(CudaModel, QueuedMicroBatchesWithOneLossReadEqualOneAtATime) {
  PL_REQUIRE_CUDA_DEVICE();
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  OpContext ctx = test::cuda_ctx();
  RunLayout o;
  o.loss_micro_batches = 3;
  LlamaModel model(m, 2, 64, ctx, bf16_plan(m), o);
  model.init_parameters(1234);
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> toks(3, std::vector<int32_t>(128)), labs = toks;
  for (auto* v : {&toks, &labs})
    for (auto& mb : *v)
      for (auto& t : mb) t = static_cast<int32_t>(rng() % m.vocab_size);
  double one_at_a_time = 0.0;
  for (int k = 0; k < 3; ++k) one_at_a_time += model.forward(toks[k].data(), labs[k].data());
  std::vector<int32_t> tok(128), lab(128);  // one host array for all three, as the trainer has
  for (int k = 0; k < 3; ++k) {
    tok = toks[k];
    lab = labs[k];
    model.queue_forward(k, tok.data(), lab.data());
  }
  const double queued = model.add_loss_sums(3, 0.0);
  EXPECT_EQ(queued, one_at_a_time);
  EXPECT_TRUE(std::isfinite(queued));
}

}  // namespace
}  // namespace pl
