// The generate tool's model (model/generator.h, issue 28), on the CPU: its logits are the training model's (the
// loss of a sequence computed from them equals LlamaModel::forward's), greedy decoding with the KV cache equals
// greedy decoding by full forward passes token for token, a seed fixes sampled output, the sampler's rules, and
// what does not fit is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "model/generator.h"
#include "model/llama.h"
#include "test_util.h"

namespace pl {
namespace {

ModelConfig bytes_model() {
  ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny_bytes.json");
  m.init_method_std = 0.05;  // predictions sharper than at 0.02, so near-ties between logits are rare
  return m;
}

OpContext cpu_bf16() {
  OpContext c;
  c.round_bf16 = true;
  return c;
}

// Megatron-initialised FP32 masters of the model (as a checkpoint would hold them).
std::vector<float> masters(const ModelConfig& m) {
  LlamaModel model(m, 1, 8, cpu_bf16(), bf16_plan(m));
  model.init_parameters(28);
  std::vector<float> w(static_cast<size_t>(model.num_params()));
  copy_to_host(w.data(), model.master().flat);
  return w;
}

Generator loaded(const ModelConfig& m, const std::vector<float>& w, int64_t capacity) {
  Generator g(m, cpu_bf16(), capacity);
  g.write_weights(0, w.data(), static_cast<int64_t>(w.size()));
  return g;
}

std::vector<int32_t> bytes_of(const std::string& s) {
  std::vector<int32_t> v;
  for (const char c : s) v.push_back(static_cast<unsigned char>(c));
  return v;
}

TEST(Generator, LogitsGiveTheTrainingForwardsLoss) {
  const ModelConfig m = bytes_model();
  const std::vector<float> w = masters(m);
  const std::vector<int32_t> seq = bytes_of("The quick brown fox jumps over");
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

TEST(Generator, GreedyWithTheCacheEqualsFullForwardPassesTokenForToken) {
  const ModelConfig m = bytes_model();
  const std::vector<float> w = masters(m);
  for (const std::string& text : {std::string("Hello"), std::string("What is 3 plus 4?\n"), std::string("a")}) {
    SCOPED_TRACE(text);
    const std::vector<int32_t> prompt = bytes_of(text);
    constexpr int64_t kNew = 24;
    Generator cached = loaded(m, w, static_cast<int64_t>(prompt.size()) + kNew);
    std::mt19937_64 rng(1);
    const Generated out = generate_tokens(cached, prompt, kNew, {}, {}, rng);
    ASSERT_EQ(static_cast<int64_t>(out.tokens.size()), kNew);
    // Every step again from scratch: the whole sequence so far through the layers, the last row's argmax.
    Generator full = loaded(m, w, static_cast<int64_t>(prompt.size()) + kNew);
    std::vector<int32_t> seq = prompt;
    for (int64_t k = 0; k < kNew; ++k) {
      full.reset();
      const std::vector<float> logits = full.append(seq);
      const auto next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      ASSERT_EQ(next, out.tokens[static_cast<size_t>(k)]) << "token " << k;
      seq.push_back(next);
    }
  }
}

TEST(Generator, ASeedFixesSampledOutput) {
  const ModelConfig m = bytes_model();
  const std::vector<float> w = masters(m);
  const std::vector<int32_t> prompt = bytes_of("Once");
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
