// The generate tool's model (model/generator.h, issue 28), on the CPU: its logits are the training model's (the
// loss of a sequence computed from them equals LlamaModel::forward's), greedy decoding with the KV cache follows
// greedy decoding by full forward passes (within rounding), a seed fixes sampled output, the sampler's rules, and
// what does not fit is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "model/generator.h"
#include "model/llama.h"
#include "model/model_test_util.h"
#include "test_util.h"

namespace pl {
namespace {

ModelConfig bytes_model() { return tiny_bytes_model(); }
OpContext cpu_bf16() { return cpu_bf16_ctx(); }
std::vector<float> masters(const ModelConfig& m) { return initial_masters(m, 28); }

Generator loaded(const ModelConfig& m, const std::vector<float>& w, int64_t capacity) {
  Generator g(m, cpu_bf16(), capacity);
  g.write_weights(0, w.data(), static_cast<int64_t>(w.size()));
  return g;
}

std::vector<int32_t> generator_bytes_of(const std::string& s) {
  std::vector<int32_t> v;
  for (const char c : s) v.push_back(static_cast<unsigned char>(c));
  return v;
}

TEST(Generator, LogitsGiveTheTrainingForwardsLoss) {
  const ModelConfig m = bytes_model();
  const std::vector<float> w = masters(m);
  const std::vector<int32_t> seq = generator_bytes_of("The quick brown fox jumps over");
  const auto S = static_cast<int64_t>(seq.size()) - 1;
  const std::vector<int32_t> tokens(seq.begin(), seq.end() - 1), labels(seq.begin() + 1, seq.end());
  LlamaModel model(m, 1, S, cpu_bf16(), bf16_plan(m));
  model.init_parameters(28);
  const double train_loss = model.forward(tokens.data(), labels.data());
  Generator g = loaded(m, w, S);
  const std::vector<float> logits = g.append(tokens, true);
  ASSERT_EQ(logits.size(), static_cast<size_t>(S * m.vocab_size));
  double loss = 0.0;
  for (int64_t t = 0; t < S; ++t) {
    const float* row = logits.data() + t * m.vocab_size;
    const double mx = *std::max_element(row, row + m.vocab_size);
    double z = 0.0;
    for (int64_t v = 0; v < m.vocab_size; ++v) z += std::exp(static_cast<double>(row[v]) - mx);
    loss += mx + std::log(z) - row[labels[static_cast<size_t>(t)]];
  }
  // The same weights and ops; the attention sums in another order (training's BF16-tiled path where oneDNN runs
  // it), so within rounding, not bit for bit.
  EXPECT_NEAR(loss, train_loss, 2e-3 * train_loss);
  EXPECT_EQ(g.length(), S);
}

// Greedy decoding with the cache against full forward passes over the sequence so far, step by step: the
// logits agree within rounding, and the cached choice is the full pass's argmax — or, where the two best logits
// are within that rounding of each other, the runner-up. (On the oneDNN engine a row's sums do not depend on
// how many rows a GEMM has, and the two agree bit for bit; OpenBLAS's SGEMM sums a row computed alone (M = 1,
// the cache's step) in another order than within M = S, and the BF16 activations carry that difference.)
TEST(Generator, GreedyWithTheCacheFollowsFullForwardPasses) {
  const ModelConfig m = bytes_model();
  const std::vector<float> w = masters(m);
  int exact_argmax = 0, steps = 0;
  for (const std::string& text : {std::string("Hello"), std::string("What is 3 plus 4?\n"), std::string("a")}) {
    SCOPED_TRACE(text);
    const std::vector<int32_t> prompt = generator_bytes_of(text);
    constexpr int64_t kNew = 24;
    Generator cached = loaded(m, w, static_cast<int64_t>(prompt.size()) + kNew);
    std::mt19937_64 rng(1);
    const Generated out = generate_tokens(cached, prompt, kNew, {}, {}, rng);
    ASSERT_EQ(static_cast<int64_t>(out.tokens.size()), kNew);
    // The same steps again, one token at a time through the cache (its logits), and each from scratch.
    Generator stepped = loaded(m, w, static_cast<int64_t>(prompt.size()) + kNew);
    Generator full = loaded(m, w, static_cast<int64_t>(prompt.size()) + kNew);
    std::vector<int32_t> seq = prompt;
    std::vector<float> step_logits = stepped.append(prompt);
    for (int64_t k = 0; k < kNew; ++k) {
      full.reset();
      const std::vector<float> full_logits = full.append(seq);
      const auto best = std::max_element(full_logits.begin(), full_logits.end());
      const int32_t chosen = out.tokens[static_cast<size_t>(k)];
      float worst = 0.0f;
      for (size_t v = 0; v < full_logits.size(); ++v) worst = std::max(worst, std::fabs(step_logits[v] - full_logits[v]));
      // The logits are BF16 values of order 1 (an ulp of 2^-6 between 2 and 4): seen 1 to 2 ulps apart on
      // OpenBLAS, 0 on oneDNN; a broken cache (wrong positions, stale rows) moves them by order 1.
      constexpr float kRounding = 0.05f;
      ASSERT_LE(worst, kRounding) << "step " << k << ": the cached logits are not the full pass's";
      ASSERT_GE(full_logits[static_cast<size_t>(chosen)], *best - kRounding) << "step " << k;
      ASSERT_EQ(chosen, static_cast<int32_t>(std::max_element(step_logits.begin(), step_logits.end()) -
                                             step_logits.begin()))
          << "step " << k << ": generate_tokens did not take the cached argmax";
      exact_argmax += chosen == static_cast<int32_t>(best - full_logits.begin());
      ++steps;
      seq.push_back(chosen);
      step_logits = stepped.append(std::vector<int32_t>{chosen});
    }
  }
  // Near-ties are rare at init std 0.05: all but a few choices are the full pass's own argmax.
  EXPECT_GE(exact_argmax, steps - 3) << exact_argmax << " of " << steps;
}

TEST(Generator, ASeedFixesSampledOutput) {
  const ModelConfig m = bytes_model();
  const std::vector<float> w = masters(m);
  const std::vector<int32_t> prompt = generator_bytes_of("Once");
  const auto sample = [&](uint64_t seed) {
    Generator g = loaded(m, w, 40);
    std::mt19937_64 rng(seed);
    return generate_tokens(g, prompt, 32, {}, {.temperature = 1.0, .top_p = 0.95}, rng).tokens;
  };
  EXPECT_EQ(sample(7), sample(7));
  EXPECT_NE(sample(7), sample(8));
  // A stop id ends the answer before it: stopping at whatever greedy decoding would make first.
  Generator g = loaded(m, w, 40);
  std::mt19937_64 rng(1);
  const int32_t first = generate_tokens(g, prompt, 1, {}, {}, rng).tokens.at(0);
  Generator g2 = loaded(m, w, 40);
  const std::vector<int32_t> stops = {first};
  const Generated stopped = generate_tokens(g2, prompt, 10, stops, {}, rng);
  EXPECT_TRUE(stopped.stopped);
  EXPECT_TRUE(stopped.tokens.empty());
}

TEST(Generator, SamplerRules) {
  std::mt19937_64 rng(3);
  const std::vector<float> logits = {0.0f, 2.0f, 2.0f, 1.0f};
  EXPECT_EQ(sample_token(logits, {}, rng), 1);  // greedy: the first largest
  // A nucleus that one token fills (its probability alone reaches top_p) always gives that token.
  const std::vector<float> peaked = {0.0f, 8.0f, 1.0f};
  for (int i = 0; i < 50; ++i) EXPECT_EQ(sample_token(peaked, {.temperature = 1.0, .top_p = 0.5}, rng), 1);
  // Frequencies follow softmax(logits / T): 40000 draws within 2% of each probability.
  const std::vector<float> l3 = {0.0f, std::log(2.0f), std::log(5.0f)};  // probabilities 1/8, 2/8, 5/8
  std::map<int32_t, int> count;
  for (int i = 0; i < 40000; ++i) ++count[sample_token(l3, {.temperature = 1.0, .top_p = 1.0}, rng)];
  EXPECT_NEAR(count[0] / 40000.0, 0.125, 0.02);
  EXPECT_NEAR(count[1] / 40000.0, 0.25, 0.02);
  EXPECT_NEAR(count[2] / 40000.0, 0.625, 0.02);
  // top_p 0.7 keeps the two most likely (5/8 < 0.7 <= 7/8), renormalized: 2/7 and 5/7, never the third.
  count.clear();
  for (int i = 0; i < 40000; ++i) ++count[sample_token(l3, {.temperature = 1.0, .top_p = 0.7}, rng)];
  EXPECT_EQ(count[0], 0);
  EXPECT_NEAR(count[1] / 40000.0, 2.0 / 7.0, 0.02);
  test::expect_one_line_error([&] { sample_token(l3, {.temperature = -1.0}, rng); }, {"temperature"});
  // Logits that are not finite (an all-NaN LM head) stop the generation in one line, greedy or sampled.
  const std::vector<float> poisoned = {std::nanf(""), std::nanf(""), 1.0f, std::numeric_limits<float>::infinity()};
  for (const double t : {0.0, 1.0})
    test::expect_one_line_error([&] { sample_token(poisoned, {.temperature = t}, rng); },
                                {"3 of the 4 logits are not finite"});
}

TEST(Generator, WhatDoesNotFitIsRefused) {
  const ModelConfig m = bytes_model();
  test::expect_one_line_error([&] { Generator(m, cpu_bf16(), m.max_position_embeddings + 1); },
                              {"positions", std::to_string(m.max_position_embeddings)});
  Generator g(m, cpu_bf16(), 4);
  const std::vector<int32_t> five = {1, 2, 3, 4, 5};
  test::expect_one_line_error([&] { g.append(five); }, {"5 tokens", "4 positions"});
  const std::vector<int32_t> bad = {300};
  test::expect_one_line_error([&] { g.append(bad); }, {"300", "vocabulary"});
}

}  // namespace
}  // namespace pl
