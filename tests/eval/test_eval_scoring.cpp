// Multiple-choice scoring (lib/eval/harness.h) against independent references on the CPU: lm-eval's _encode_pair,
// each request's log-likelihood equal to the model's own loss path (LlamaModel::forward over the same tokens, per
// token and summed), the evaluation model (frozen, no adapters) giving the full model's losses bit for bit, is_greedy
// exactly for the argmax over the whole vocabulary, scores that batch size and request order do not change, acc_norm
// by the choices' lengths in code points, and lm-eval's mean_stderr.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "data/tokenizer.h"
#include "eval/harness.h"
#include "eval/results.h"
#include "model/llama.h"
#include "model/model_test_util.h"
#include "parallel/world.h"
#include "test_util.h"

namespace pl::eval {
namespace {

ModelConfig bytes_model() { return tiny_bytes_model(); }
OpContext cpu_bf16() { return cpu_bf16_ctx(); }
std::vector<float> masters(const ModelConfig& m) { return initial_masters(m, 43); }

std::unique_ptr<LlamaModel> eval_model(const ModelConfig& m, const std::vector<float>& w, int64_t rows, int64_t longest) {
  std::unique_ptr<LlamaModel> model = make_eval_model(m, bf16_plan(m), nullptr, rows, longest, cpu_bf16());
  model->write_base(0, w.data(), static_cast<int64_t>(w.size()));
  finish_eval_weights(*model);
  return model;
}

// The reference: a full (trainable) model of exactly the request's length, its loss over the continuation's
// positions from LlamaModel::forward, one position at a time and all together.
struct EvalScoringReference {
  double sum = 0.0;
  std::vector<double> per_token;
};
EvalScoringReference reference(const ModelConfig& m, const std::vector<float>& w, const Request& q) {
  const int64_t L = static_cast<int64_t>(q.tokens.size());
  LlamaModel full(m, 1, L, cpu_bf16(), bf16_plan(m));
  full.write_master(0, w.data(), static_cast<int64_t>(w.size()));
  full.sync_weights_from_master();
  std::vector<int32_t> next(q.tokens.begin() + 1, q.tokens.end());
  next.push_back(q.last_token);
  EvalScoringReference r;
  std::vector<int32_t> labels(static_cast<size_t>(L), -1);
  for (int64_t p = L - q.continuation_tokens; p < L; ++p) labels[static_cast<size_t>(p)] = next[static_cast<size_t>(p)];
  r.sum = -full.forward(q.tokens.data(), labels.data());
  for (int64_t p = L - q.continuation_tokens; p < L; ++p) {
    std::vector<int32_t> one(static_cast<size_t>(L), -1);
    one[static_cast<size_t>(p)] = next[static_cast<size_t>(p)];
    r.per_token.push_back(-full.forward(q.tokens.data(), one.data()));
  }
  return r;
}

PreparedTask generic_task(test::TempDir& dir, const data::Tokenizer& tok) {
  const std::string f = dir.write("g.jsonl",
                                  R"({"context": "The cat sat on the", "choices": ["mat", "dog", "roof of the house"], "label": 0})" "\n"
                                  R"({"context": "One, two, three,", "choices": ["four", "4", "five six"], "label": 0})" "\n"
                                  R"({"context": "Answer: ", "choices": ["yes", "no"], "label": 1})" "\n"
                                  R"({"context": "", "choices": ["start", "begin"], "label": 0})" "\n");
  return prepare_task({f, "", 0, 0}, tok, {false, 4096});
}

TEST(EvalScoring, EncodePairIsLmEvals) {
  const auto tok = data::make_tokenizer("byte", "");
  const EncodedPair a = encode_pair(*tok, "Answer: ", " yes", false);  // the trailing space joins the continuation
  EXPECT_EQ(a.context, tok->encode("Answer:"));
  EXPECT_EQ(a.continuation, tok->encode("  yes"));
  const EncodedPair b = encode_pair(*tok, "", " start", false);  // empty context: the BOS alone
  EXPECT_EQ(b.context, std::vector<int32_t>{tok->bos()});
  EXPECT_EQ(b.continuation, tok->encode(" start"));
  const EncodedPair c = encode_pair(*tok, "x", " y", true);
  EXPECT_EQ(c.context, (std::vector<int32_t>{tok->bos(), 'x'}));
  // The left cut: a request longer than max_length + 1 tokens keeps its last max_length + 1.
  test::TempDir dir;
  const std::string f = dir.write("long.jsonl", R"({"context": "abcdefghij", "choices": ["k"], "label": 0})" "\n");
  const PreparedTask t = prepare_task({f, "", 0, 0}, *tok, {false, 5});
  ASSERT_EQ(t.requests.size(), 1u);
  EXPECT_EQ(t.truncated, 1);
  EXPECT_EQ(t.requests[0].tokens, tok->encode("ghij "));  // "ghij k" without its last token
  EXPECT_EQ(t.requests[0].last_token, 'k');
  EXPECT_EQ(t.requests[0].continuation_tokens, 2);
}

TEST(EvalScoring, LogLikelihoodsAreTheLossPathsPerTokenAndSummed) {
  const ModelConfig m = bytes_model();
  const std::vector<float> w = masters(m);
  const auto tok = data::make_tokenizer("byte", "");
  test::TempDir dir;
  const PreparedTask t = generic_task(dir, *tok);
  std::unique_ptr<LlamaModel> model = eval_model(m, w, 3, longest_request({&t, 1}));
  const parallel::World one = parallel::World::single();
  const std::vector<ChoiceScore> s = score_requests(*model, t.requests, one);
  ASSERT_EQ(s.size(), t.requests.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const EvalScoringReference r = reference(m, w, t.requests[i]);
    EXPECT_NEAR(s[i].loglikelihood, r.sum, 1e-4 * std::fabs(r.sum)) << i;
    double per_token = 0.0;
    for (double x : r.per_token) per_token += x;
    EXPECT_NEAR(s[i].loglikelihood, per_token, 1e-4 * std::fabs(r.sum)) << i;
    EXPECT_LT(s[i].loglikelihood, 0.0);
  }
}

TEST(EvalScoring, TheEvaluationModelIsTheFullModelBitForBit) {
  const ModelConfig m = bytes_model();
  const std::vector<float> w = masters(m);
  LlamaModel full(m, 2, 16, cpu_bf16(), bf16_plan(m));
  full.write_master(0, w.data(), static_cast<int64_t>(w.size()));
  full.sync_weights_from_master();
  std::unique_ptr<LlamaModel> frozen = eval_model(m, w, 2, 16);
  EXPECT_EQ(frozen->num_params(), 0);
  std::vector<int32_t> tokens(32), labels(32);
  for (int i = 0; i < 32; ++i) tokens[i] = (i * 37 + 11) % 258, labels[i] = (i * 53 + 5) % 258;
  std::vector<float> a, b;
  full.score(tokens.data(), labels.data(), a, nullptr);
  frozen->score(tokens.data(), labels.data(), b, nullptr);
  EXPECT_EQ(a, b);
  EXPECT_LT(frozen->memory_plan().total(), full.memory_plan().total() / 3);
}

TEST(EvalScoring, BatchSizeAndRequestOrderDoNotChangeAScore) {
  const ModelConfig m = bytes_model();
  const std::vector<float> w = masters(m);
  const auto tok = data::make_tokenizer("byte", "");
  test::TempDir dir;
  const PreparedTask t = generic_task(dir, *tok);
  const parallel::World one = parallel::World::single();
  const int64_t longest = longest_request({&t, 1});
  const std::vector<ChoiceScore> by1 = score_requests(*eval_model(m, w, 1, longest), t.requests, one);
  const std::vector<ChoiceScore> by4 = score_requests(*eval_model(m, w, 4, longest + 7), t.requests, one);
  std::vector<Request> reversed(t.requests.rbegin(), t.requests.rend());
  const std::vector<ChoiceScore> rev = score_requests(*eval_model(m, w, 3, longest), reversed, one);
  for (size_t i = 0; i < by1.size(); ++i) {
    EXPECT_NEAR(by1[i].loglikelihood, by4[i].loglikelihood, 1e-5 * std::fabs(by1[i].loglikelihood)) << i;
    EXPECT_NEAR(by1[i].loglikelihood, rev[by1.size() - 1 - i].loglikelihood, 1e-5 * std::fabs(by1[i].loglikelihood)) << i;
    EXPECT_EQ(by1[i].greedy, by4[i].greedy);
  }
  EXPECT_EQ(summarize_task(t, by1).acc, summarize_task(t, by4).acc);
  // Without is_greedy (the training-time evaluation): the same sums, no logits read back, no request greedy.
  const std::vector<ChoiceScore> plain = score_requests(*eval_model(m, w, 1, longest), t.requests, one, {}, false);
  for (size_t i = 0; i < by1.size(); ++i) {
    EXPECT_EQ(plain[i].loglikelihood, by1[i].loglikelihood) << i;
    EXPECT_FALSE(plain[i].greedy) << i;
  }
}

// One-token continuations over the whole vocabulary: exactly the argmax is greedy, and it has the largest sum.
TEST(EvalScoring, IsGreedyMarksTheArgmaxOfTheLogits) {
  const ModelConfig m = bytes_model();
  const std::vector<float> w = masters(m);
  const auto tok = data::make_tokenizer("byte", "");
  std::vector<Request> all;
  const std::vector<int32_t> ctx = tok->encode("Hello wor");
  for (int32_t v = 0; v < 258; ++v) all.push_back({0, v, "Hello wor", "?", ctx, 1, v});
  const parallel::World one = parallel::World::single();
  const std::vector<ChoiceScore> s = score_requests(*eval_model(m, w, 16, 9), all, one);
  int greedy = 0;
  size_t best = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    greedy += s[i].greedy ? 1 : 0;
    if (s[i].loglikelihood > s[best].loglikelihood) best = i;
  }
  EXPECT_EQ(greedy, 1);
  EXPECT_TRUE(s[best].greedy);
}

TEST(EvalScoring, AccNormDividesByTheChoicesCodePointsAndStderrIsLmEvals) {
  test::TempDir dir;
  const auto tok = data::make_tokenizer("byte", "");
  const std::string f = dir.write("n.jsonl", R"({"context": "c", "choices": ["ab", "abcdef"], "label": 1})" "\n"
                                             R"({"context": "c", "choices": ["é", "xy"], "label": 0})" "\n");
  const PreparedTask t = prepare_task({f, "", 0, 0}, *tok, {false, 64});
  // Doc 0: -4 vs -9: acc picks choice 0; per character -2 vs -1.5: acc_norm picks choice 1 (gold).
  // Doc 1: "é" is one code point (two bytes): -3 / 1 vs -4 / 2 = -2: acc_norm picks choice 1; acc choice 0.
  const std::vector<ChoiceScore> s = {{-4.0, false}, {-9.0, false}, {-3.0, false}, {-4.0, false}};
  const TaskResult r = summarize_task(t, s);
  EXPECT_EQ(r.docs[0].acc, 0.0);
  EXPECT_EQ(r.docs[0].acc_norm, 1.0);
  EXPECT_EQ(r.docs[1].acc, 1.0);
  EXPECT_EQ(r.docs[1].acc_norm, 0.0);
  EXPECT_DOUBLE_EQ(r.acc, 0.5);
  EXPECT_DOUBLE_EQ(r.acc_stderr, std::sqrt(0.5) / std::sqrt(2.0));  // values 0, 1: sample sd sqrt(0.5)
  const std::vector<double> one = {1.0};
  EXPECT_TRUE(std::isnan(mean_stderr(one)));
  const nlohmann::ordered_json j = results_json({&t, 1}, {&r, 1}, {{"model", "x"}});
  EXPECT_DOUBLE_EQ(j["results"]["n"]["acc,none"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["results"]["n"]["acc_norm,none"].get<double>(), 0.5);
  EXPECT_EQ(j["n-samples"]["n"]["effective"].get<int>(), 2);
  EXPECT_EQ(j["n-shot"]["n"].get<int>(), 0);
  EXPECT_TRUE(j.contains("versions") && j.contains("config") && j.contains("configs"));
  // One document: lm-eval's "N/A" for the standard errors; a context of whitespace only is refused.
  const std::string f1 = dir.write("one.jsonl", R"({"context": "c", "choices": ["ab", "abcdef"], "label": 1})" "\n");
  const PreparedTask t1 = prepare_task({f1, "", 0, 0}, *tok, {false, 64});
  const TaskResult r1 = summarize_task(t1, std::vector<ChoiceScore>{{-4.0, false}, {-9.0, false}});
  const nlohmann::ordered_json j1 = results_json({&t1, 1}, {&r1, 1}, {});
  EXPECT_EQ(j1["results"]["one"]["acc_stderr,none"], "N/A");
  const std::string blank = dir.write("blank.jsonl", R"({"context": " \n", "choices": ["a"], "label": 0})" "\n");
  test::expect_one_line_error([&] { (void)prepare_task({blank, "", 0, 0}, *tok, {false, 64}); },
                              {blank + ":1", "whitespace only"});
}

}  // namespace
}  // namespace pl::eval
