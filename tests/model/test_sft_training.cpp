// Supervised fine-tuning through the model (issue 28), on the CPU in plain FP32, from packs that SftData made:
//   - the loss counts the answers only: the pack's loss is exactly the sum of the per-position losses at its
//     answer positions (each measured alone from a run that counts every position), the prompt positions' own
//     losses are not zero (so leaving them out matters), and changing the label at a prompt position changes
//     the all-position loss but not the SFT one, while changing an answer's label changes both;
//   - packing is exact: the loss and gradients of a pack A|B|C (with its padding) are those of A, B and C run
//     one per sequence, i.e. their token-weighted mean.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "data/documents.h"
#include "data/sft_dataset.h"
#include "data/sft_format.h"
#include "data/tokenizer.h"
#include "io/atomic_file.h"
#include "model/llama.h"
#include "data/sft_test_util.h"
#include "model_test_util.h"
#include "test_util.h"

namespace pl {
namespace {

using nlohmann::json;

ModelConfig bytes_model() {
  ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny_bytes.json");
  m.init_method_std = 0.3;  // large enough that attention across examples would visibly change the loss
  return m;
}

OpContext sft_training_fp32() {
  OpContext c;
  c.round_bf16 = false;
  return c;
}

RunLayout sft_layout() {
  RunLayout o;
  o.packing = data::packing_for_data(true, {});
  return o;
}

// Three examples of different lengths (byte tokenizer), written as an SFT set.
struct ThreeExamples {
  test::TempDir dir;
  std::string prefix = test::write_sft_set(
      dir.path(), {json{{"input", "What is two and two?"}, {"output", "Four."}},
                   json{{"messages", {{{"role", "user"}, {"content", "Name a colour."}},
                                      {{"role", "assistant"}, {"content", "Blue."}}}}},
                   json{{"input", "Say hi"}, {"output", "Hi there, friend."}}});
};

struct Pack {
  std::vector<int32_t> tokens, labels, positions;
};

// The one pack of the three examples (S positions leave room for all three and some padding).
Pack one_pack(const ThreeExamples& ex, int64_t S) {
  const data::SftData d(ex.prefix, "1,0,0", S, data::PackingAlgorithm::first_fit_shuffle, 1234);
  EXPECT_EQ(d.packs(data::Split::train), 1);
  Pack p{std::vector<int32_t>(static_cast<size_t>(S)), std::vector<int32_t>(static_cast<size_t>(S)),
         std::vector<int32_t>(static_cast<size_t>(S))};
  d.sample(data::Split::train, 0, p.tokens, p.labels, p.positions);
  return p;
}

struct SftTrainingLossAndGrads {
  double loss_sum;
  std::vector<float> grads;
};

SftTrainingLossAndGrads sft_training_run(const RunLayout& layout, const Pack& p, float grad_scale) {
  const ModelConfig m = bytes_model();
  LlamaModel model(m, 1, static_cast<int64_t>(p.tokens.size()), sft_training_fp32(), bf16_plan(m), layout);
  model.init_parameters(11);
  model.zero_grads();
  const double loss = model.forward_backward(p.tokens.data(), p.labels.data(), grad_scale, {},
                                             layout.packing.explicit_documents ? p.positions.data() : nullptr);
  const float* g = model.grads().flat.f32();
  return {loss, std::vector<float>(g, g + model.num_params())};
}

// The examples' segments of a pack: [begin, end) per example (the padding excluded).
std::vector<std::pair<size_t, size_t>> segments(const Pack& p) {
  std::vector<std::pair<size_t, size_t>> v;
  for (size_t t = 0; t < p.tokens.size(); ++t) {
    if (p.positions[t] == 0) v.emplace_back(t, t);
    v.back().second = t + 1;
  }
  if (p.tokens.back() == 257) v.pop_back();  // the padding's segment (an example's inputs never hold the eod)
  return v;
}

TEST(SftTraining, TheLossCountsTheAnswersOnly) {
  const ThreeExamples ex;
  const Pack pack = one_pack(ex, 96);
  // Every position's next token, answer or not (the padding excluded): what a pretraining run would learn.
  Pack all = pack;
  for (const auto& [b, e] : segments(pack))
    for (size_t t = b; t < e; ++t) all.labels[t] = t + 1 < e ? pack.tokens[t + 1] : all.labels[t];
  for (const auto& seg : segments(pack))  // an example's last label is its eod, an answer: already there
    ASSERT_NE(all.labels[seg.second - 1], data::kIgnoredLabel);
  const ModelConfig m = bytes_model();
  LlamaModel model(m, 1, static_cast<int64_t>(pack.tokens.size()), sft_training_fp32(), bf16_plan(m), sft_layout());
  model.init_parameters(11);
  // The loss at one position alone: every other label ignored.
  const auto loss_at = [&](const Pack& src, size_t t) {
    std::vector<int32_t> one(src.labels.size(), data::kIgnoredLabel);
    one[t] = src.labels[t];
    return model.forward(src.tokens.data(), one.data(), src.positions.data());
  };
  double answers = 0.0, prompts = 0.0;
  int64_t counted = 0, prompt_positions = 0;
  for (size_t t = 0; t < all.labels.size(); ++t) {
    if (all.labels[t] == data::kIgnoredLabel) continue;
    const double l = loss_at(all, t);
    if (pack.labels[t] != data::kIgnoredLabel) {
      answers += l;
      ++counted;
    } else {
      prompts += l;
      ++prompt_positions;
    }
  }
  ASSERT_GT(prompt_positions, 10);
  EXPECT_EQ(counted, data::counted_tokens(sft_layout().packing, pack.tokens, pack.labels));
  EXPECT_GT(prompts, 1.0);  // the prompts' own losses are far from zero: leaving them out is what SFT does
  const double sft = model.forward(pack.tokens.data(), pack.labels.data(), pack.positions.data());
  EXPECT_NEAR(sft, answers, 1e-9 * std::max(1.0, answers));  // (the same fp32 losses summed in double)
  // A prompt position's label changes the all-position loss, not the SFT one; an answer's changes both.
  size_t prompt_t = 0, answer_t = 0;
  for (size_t t = 0; t < pack.labels.size(); ++t) {
    if (all.labels[t] != data::kIgnoredLabel && pack.labels[t] == data::kIgnoredLabel) prompt_t = t;
    if (pack.labels[t] != data::kIgnoredLabel) answer_t = t;
  }
  Pack changed = all;
  changed.labels[prompt_t] = (changed.labels[prompt_t] + 7) % 256;
  EXPECT_NE(model.forward(changed.tokens.data(), changed.labels.data(), changed.positions.data()),
            model.forward(all.tokens.data(), all.labels.data(), all.positions.data()));
  Pack answer_changed = pack;
  answer_changed.labels[answer_t] = (answer_changed.labels[answer_t] + 7) % 256;
  EXPECT_NE(model.forward(answer_changed.tokens.data(), answer_changed.labels.data(), answer_changed.positions.data()),
            sft);
}

TEST(SftTraining, APackEqualsItsExamplesRunOnePerSequence) {
  const ThreeExamples ex;
  const Pack pack = one_pack(ex, 96);
  const auto segs = segments(pack);
  ASSERT_EQ(segs.size(), 3u);
  ASSERT_LT(segs.back().second, pack.tokens.size()) << "the test wants padding at the end of the pack";
  const int64_t n = data::counted_tokens(sft_layout().packing, pack.tokens, pack.labels);
  const float scale = 1.0f / static_cast<float>(n);  // the pack's mean over its answer tokens
  const SftTrainingLossAndGrads whole = sft_training_run(sft_layout(), pack, scale);
  double loss_sum = 0.0;
  std::vector<float> grads(whole.grads.size(), 0.0f);
  for (const auto& [b, e] : segs) {  // each example alone, in a sequence of its own length
    const Pack one{std::vector<int32_t>(pack.tokens.begin() + b, pack.tokens.begin() + e),
                   std::vector<int32_t>(pack.labels.begin() + b, pack.labels.begin() + e),
                   std::vector<int32_t>(pack.positions.begin() + b, pack.positions.begin() + e)};
    const SftTrainingLossAndGrads r = sft_training_run({}, one, scale);  // (plain layout: one sequence, positions 0..)
    loss_sum += r.loss_sum;
    for (size_t i = 0; i < grads.size(); ++i) grads[i] += r.grads[i];
  }
  EXPECT_NEAR(whole.loss_sum, loss_sum, 1e-5 * loss_sum);
  const double tol = 1e-4 * max_abs(grads);
  EXPECT_LE(max_diff(whole.grads, grads), tol);
  // Without the examples' documents (one causal sequence over the whole pack) the loss is another one.
  RunLayout no_docs;
  EXPECT_GT(std::abs(sft_training_run(no_docs, pack, scale).loss_sum - whole.loss_sum), 1e-3);
}

}  // namespace
}  // namespace pl
