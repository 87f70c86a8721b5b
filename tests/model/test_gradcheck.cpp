// Whole-model parity test (llm.c style): every parameter tensor of llama_tiny gets its analytic
// gradient compared with central finite differences of the loss, in the plain-FP32 mode
// (ctx.round_bf16 = false; BF16 rounding would make finite differences meaningless).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "config/model_config.h"
#include "model/llama.h"

namespace pl {
namespace {

TEST(ModelGradcheck, EveryParameterTensorMatchesFiniteDifferences) {
  const ModelConfig cfg = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  const int64_t B = 2, S = 8;
  OpContext ctx;
  ctx.round_bf16 = false;
  LlamaModel model(cfg, B, S, ctx);
  model.init_parameters(7);
  // Larger-than-Megatron weights make every path carry gradient (std 0.02 leaves the attention
  // scores almost uniform, which would hide a wrong attention backward).
  float* master = model.master().flat.f32();
  for (const ParamEntry& e : model.param_entries())
    if (e.is_matrix)
      for (int64_t i = 0; i < e.numel(); ++i) master[e.offset + i] *= 10.0f;
  model.sync_weights_from_master();

  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(cfg.vocab_size - 1));
  std::vector<int32_t> tokens(B * S), labels(B * S);
  for (auto& t : tokens) t = tok(rng);
  for (auto& t : labels) t = tok(rng);

  model.zero_grads();
  model.forward_backward(tokens.data(), labels.data(), 1.0f);  // grads of the loss *sum*
  const std::vector<float> grad(model.grads().flat.f32(), model.grads().flat.f32() + model.num_params());

  int checked_tensors = 0;
  for (const ParamEntry& e : model.param_entries()) {
    // The three largest-gradient elements of the tensor plus two random ones.
    std::vector<int64_t> idx(static_cast<size_t>(e.numel()));
    for (int64_t i = 0; i < e.numel(); ++i) idx[i] = i;
    std::partial_sort(idx.begin(), idx.begin() + 3, idx.end(), [&](int64_t a, int64_t b) {
      return std::abs(grad[e.offset + a]) > std::abs(grad[e.offset + b]);
    });
    idx.resize(3);
    std::uniform_int_distribution<int64_t> pick(0, e.numel() - 1);
    idx.push_back(pick(rng));
    idx.push_back(pick(rng));
    const double max_abs = std::abs(grad[e.offset + idx[0]]);
    ASSERT_GT(max_abs, 0.0) << e.name << " has an all-zero gradient";
    for (int64_t i : idx) {
      float& w = master[e.offset + i];
      const float w0 = w;
      const float h = std::max(1e-3f, 1e-3f * std::abs(w0));
      w = w0 + h;
      model.sync_weights_from_master();
      const double up = model.forward(tokens.data(), labels.data());
      w = w0 - h;
      model.sync_weights_from_master();
      const double down = model.forward(tokens.data(), labels.data());
      w = w0;
      const double fd = (up - down) / (static_cast<double>(w0 + h) - static_cast<double>(w0 - h));
      const double an = grad[e.offset + i];
      // FP32 forward noise is ~1e-6 relative per token loss; the bound is far below what a wiring
      // error (a missing term, a wrong transpose) produces.
      EXPECT_NEAR(an, fd, 2e-2 * max_abs + 2e-3) << e.name << " element " << i;
    }
    model.sync_weights_from_master();
    ++checked_tensors;
  }
  EXPECT_EQ(checked_tensors, static_cast<int>(model.param_entries().size()));
  EXPECT_EQ(checked_tensors, 3 + 6 * cfg.num_layers);
}

}  // namespace
}  // namespace pl
