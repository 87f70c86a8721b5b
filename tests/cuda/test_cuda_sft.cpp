// Issue 28 on the GPU against the CPU backend (skipped without a device): one training step of an SFT pack
// (explicit documents from the pack's positions: cuDNN's packed-sequence attention, the loss on answers only),
// and the generate tool's model (the KV-cache attention kernel inside the whole forward).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "cuda_test_util.h"
#include "data/documents.h"
#include "data/sft_dataset.h"
#include "data/sft_format.h"
#include "data/tokenizer.h"
#include "io/atomic_file.h"
#include "model/generator.h"
#include "model/llama.h"
#include "data/sft_test_util.h"
#include "test_util.h"

namespace pl {
namespace {

using nlohmann::json;

ModelConfig bytes_model() { return load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny_bytes.json"); }

// Two packs of 128 positions from eight examples of both shapes (byte tokenizer).
struct Packs {
  test::TempDir dir;
  std::vector<int32_t> tokens, labels, positions;  // [2 * 128] each
  Packs() {
    std::vector<json> objects;
    for (int i = 0; i < 8; ++i)
      objects.push_back(i % 2 ? json{{"input", "Question " + std::to_string(i) + "?"}, {"output", "Answer " + std::to_string(i)}}
                              : json{{"messages", {{{"role", "user"}, {"content", "Say " + std::to_string(i)}},
                                                   {{"role", "assistant"}, {"content", std::to_string(i) + "!"}}}}});
    const std::string prefix = test::write_sft_set(dir.path(), objects);
    const data::SftData d(prefix, "1,0,0", 128, data::PackingAlgorithm::first_fit_shuffle, 1);
    tokens.resize(256);
    labels.resize(256);
    positions.resize(256);
    for (int p = 0; p < 2; ++p)
      d.sample(data::Split::train, p, std::span(tokens).subspan(p * 128, 128), std::span(labels).subspan(p * 128, 128),
               std::span(positions).subspan(p * 128, 128));
  }
};

struct CudaSftStep {
  double loss;
  std::vector<float> grads;
};

CudaSftStep sft_step(Device device, const Packs& p) {
  const ModelConfig m = bytes_model();
  OpContext ctx = device == Device::CUDA ? test::cuda_ctx() : OpContext{};
  ctx.round_bf16 = true;
  RunLayout layout;
  layout.packing = data::packing_for_data(true, {});
  layout.packing.eod = 257;
  LlamaModel model(m, 2, 128, ctx, bf16_plan(m), layout);
  model.init_parameters(1234);
  model.zero_grads();
  const int64_t n = data::counted_tokens(layout.packing, p.tokens, p.labels);
  const double loss = model.forward_backward(p.tokens.data(), p.labels.data(), 1.0f / static_cast<float>(n), {},
                                             p.positions.data()) / static_cast<double>(n);
  CudaSftStep s{loss, std::vector<float>(static_cast<size_t>(model.num_params()))};
  copy_to_host(s.grads.data(), model.grads().flat);
  return s;
}

// As CudaModel.OneBf16TrainingStepMatchesTheCpu: BF16 activations on both sides, other summation orders.
TEST(CudaSft, OnePackedStepMatchesTheCpu) {
  PL_REQUIRE_CUDA_DEVICE();
  const Packs p;
  const CudaSftStep cpu = sft_step(Device::CPU, p), gpu = sft_step(Device::CUDA, p);
  EXPECT_NEAR(gpu.loss, cpu.loss, 2e-3 * std::abs(cpu.loss));
  for (const ParamEntry& e : param_layout(bytes_model())) {
    double num = 0.0, den = 0.0;
    for (int64_t i = e.offset; i < e.offset + e.numel(); ++i) {
      const double d = static_cast<double>(gpu.grads[i]) - cpu.grads[i];
      num += d * d;
      den += static_cast<double>(cpu.grads[i]) * cpu.grads[i];
    }
    EXPECT_LT(std::sqrt(num / std::max(den, 1e-30)), 2e-2) << e.name;
  }
}

// The generate tool's model on the GPU: the prompt's last logits and the greedy continuation's logits within
// bf16 rounding of the CPU's (the same weights; the KV-cache kernel sums in another order than the CPU).
TEST(CudaSft, GeneratorMatchesTheCpu) {
  PL_REQUIRE_CUDA_DEVICE();
  ModelConfig m = bytes_model();
  m.init_method_std = 0.05;
  LlamaModel init(m, 1, 8, OpContext{}, bf16_plan(m));
  init.init_parameters(28);
  std::vector<float> w(static_cast<size_t>(init.num_params()));
  copy_to_host(w.data(), init.master().flat);
  OpContext cpu;
  cpu.round_bf16 = true;
  OpContext gpu = test::cuda_ctx();
  gpu.round_bf16 = true;
  Generator gc(m, cpu, 64), gg(m, gpu, 64);
  gc.write_weights(0, w.data(), static_cast<int64_t>(w.size()));
  gg.write_weights(0, w.data(), static_cast<int64_t>(w.size()));
  std::vector<int32_t> seq;
  for (const char c : std::string("The answer is")) seq.push_back(static_cast<unsigned char>(c));
  std::vector<float> lc = gc.append(seq), lg = gg.append(seq);
  for (int step = 0; step < 16; ++step) {
    ASSERT_EQ(lc.size(), lg.size());
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < lc.size(); ++i) {
      num += (static_cast<double>(lg[i]) - lc[i]) * (static_cast<double>(lg[i]) - lc[i]);
      den += static_cast<double>(lc[i]) * lc[i];
    }
    EXPECT_LT(std::sqrt(num / std::max(den, 1e-30)), 2e-2) << "step " << step;
    // Both continue with the CPU's choice, so a near-tie the two break differently does not end the comparison.
    const auto next = static_cast<int32_t>(std::max_element(lc.begin(), lc.end()) - lc.begin());
    lc = gc.append(std::span<const int32_t>(&next, 1));
    lg = gg.append(std::span<const int32_t>(&next, 1));
  }
}

}  // namespace
}  // namespace pl
