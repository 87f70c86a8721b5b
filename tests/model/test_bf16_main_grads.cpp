// BF16 main grads (--main-grads-dtype bf16): each micro-batch's gradients of a group of parameters are
// computed in FP32 (the scratch) and added into the BF16 main grads, rounded once per micro-batch. On the
// CPU backend (bf16 values in FP32 storage) that is exactly checkable: after micro-batches with FP32
// gradients G1, G2 (each from its own FP32-grads backward), the main grads must hold
// round_bf16(round_bf16(0 + G1) + G2) for every element, with BF16 and NVFP4 layers, with and without
// full recomputation; on a GPU the same against the GPU's own FP32-grads backward (CudaBf16MainGrads).
// The first micro-batch may overwrite instead (MicroBatchOptions::overwrite_main_grads, what the trainer does
// instead of zeroing them): the main grads then start from garbage and must end the same.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "cuda/cuda_test_util.h"
#include "config/precision_recipe.h"
#include "data/mock_dataset.h"
#include "model/llama.h"
#include "model/precision_plan.h"
#include "numerics/bf16.h"

namespace pl {
namespace {

// The values of an F32 or BF16 tensor on any device.
std::vector<float> host_copy(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::F32) {
    copy_to_host(v.data(), t);
    return v;
  }
  std::vector<uint16_t> bits(v.size());
  copy_to_host(bits.data(), t);
  for (size_t i = 0; i < v.size(); ++i) v[i] = num::bf16_bits_to_float(bits[i]);
  return v;
}

// Every element of t (F32 or BF16 storage) set to `value` (a bf16 value).
void fill_with(const Tensor& t, float value) {
  if (t.dtype == DType::F32) {
    copy_from_host(t, std::vector<float>(static_cast<size_t>(t.numel()), value).data());
    return;
  }
  copy_from_host(t, std::vector<uint16_t>(static_cast<size_t>(t.numel()), num::float_to_bf16_bits(value)).data());
}

void expect_bf16_accumulation(const PrecisionPlan& plan, bool recompute, const OpContext& ctx = {},
                              bool overwrite = false) {
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  const int64_t B = 2, S = 32, T = B * S;
  RunLayout fp32, bf16;
  fp32.recompute = bf16.recompute = recompute ? RecomputeConfig::full() : RecomputeConfig{};
  bf16.bf16_main_grads = true;
  LlamaModel a(m, B, S, ctx, plan, fp32), b(m, B, S, ctx, plan, bf16);
  a.init_parameters(1234);
  b.init_parameters(1234);
  data::MockGPTDataset data(data::MockDataConfig{m.vocab_size, m.vocab_size - 1, S, 16, 7});
  std::vector<int32_t> tok(static_cast<size_t>(T)), lab(static_cast<size_t>(T));
  std::vector<std::vector<float>> g;
  if (overwrite)
    fill_with(b.grads().flat, 3.0f);  // what the last iteration left: never zeroed
  else
    b.zero_grads();
  for (int mb = 0; mb < 2; ++mb) {
    data.micro_batch(0, mb, B, tok, lab);
    const MicroBatchOptions step{static_cast<uint64_t>(10 + mb)};  // the same stochastic rounding on both sides
    a.zero_grads();
    const double la = a.forward_backward(tok.data(), lab.data(), 0.25f, step);
    g.push_back(host_copy(a.grads().flat));
    MicroBatchOptions b_step = step;
    b_step.overwrite_main_grads = overwrite && mb == 0;
    EXPECT_EQ(la, b.forward_backward(tok.data(), lab.data(), 0.25f, b_step)) << "micro-batch " << mb;
  }
  const std::vector<float> got = host_copy(b.grads().flat);
  ASSERT_EQ(got.size(), g[0].size());
  size_t nonzero = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float want = num::round_bf16(num::round_bf16(g[0][i]) + g[1][i]);
    ASSERT_EQ(num::float_bits(got[i]), num::float_bits(want)) << "element " << i;
    nonzero += got[i] != 0.0f;
  }
  EXPECT_GT(nonzero, got.size() / 2);  // the comparison is between real gradients
}

TEST(Bf16MainGrads, EachMicroBatchIsAddedIntoBf16MainGradsRoundedOnce) {
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  const PrecisionPlan nvfp4 = make_precision_plan(
      m, load_precision_recipe(std::string(PL_CONFIG_DIR) + "/recipes/bf16_with_nvfp4_mixed.json"));
  ASSERT_FALSE(nvfp4.all_bf16());
  expect_bf16_accumulation(bf16_plan(m), false);
  expect_bf16_accumulation(nvfp4, false);
  expect_bf16_accumulation(nvfp4, true);
}

TEST(Bf16MainGrads, TheFirstMicroBatchOverwritesUnzeroedMainGrads) {
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  expect_bf16_accumulation(bf16_plan(m), false, {}, true);
  expect_bf16_accumulation(bf16_plan(m), true, {}, true);
}

// The same on a GPU: its BF16 main grads (bf16 storage) against its own FP32-grads backward (the GPU's
// GEMMs, the same accumulate_bf16 rounding). Compiled always; skipped without a device.
TEST(CudaBf16MainGrads, EachMicroBatchIsAddedIntoBf16MainGradsRoundedOnce) {
  PL_REQUIRE_CUDA_DEVICE();
  const test::DeterministicAttention deterministic;  // the two backward passes give the same bits
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  const PrecisionPlan nvfp4 = make_precision_plan(
      m, load_precision_recipe(std::string(PL_CONFIG_DIR) + "/recipes/bf16_with_nvfp4_mixed.json"));
  expect_bf16_accumulation(bf16_plan(m), false, test::cuda_ctx());
  expect_bf16_accumulation(nvfp4, true, test::cuda_ctx());
  expect_bf16_accumulation(bf16_plan(m), false, test::cuda_ctx(), true);  // the first micro-batch overwrites
}

// The plan: 2 bytes of gradient per parameter on the GPU, plus an FP32 scratch of the largest group (here
// the embedding or the LM head with the final norm) in the activations.
TEST(Bf16MainGrads, MemoryPlanHalvesTheGradientsAndAddsTheGroupScratch) {
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama3_8b.json");
  RunLayout fp32, bf16;
  bf16.bf16_main_grads = true;
  const MemoryPlan a = plan_memory(m, 1, 4096, Device::CUDA, bf16_plan(m), fp32, 90);
  const MemoryPlan b = plan_memory(m, 1, 4096, Device::CUDA, bf16_plan(m), bf16, 90);
  EXPECT_DOUBLE_EQ(b.grads, a.grads / 2);
  EXPECT_EQ(b.grads_label, "gradients (bf16)");
  EXPECT_EQ(largest_grad_group(m), m.vocab_size * m.hidden_size + m.hidden_size);
  const double scratch = static_cast<double>((largest_grad_group(m) * 4 + 255) / 256 * 256);
  EXPECT_DOUBLE_EQ(b.activations - a.activations, scratch);
  EXPECT_DOUBLE_EQ(a.total() - b.total(), a.grads / 2 - scratch);
}

}  // namespace
}  // namespace pl
