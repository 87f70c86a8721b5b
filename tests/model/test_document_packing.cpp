// Document-aware packing through the model and the trainer (RunLayout::packing; Megatron's --eod-mask-loss,
// --reset-position-ids, --reset-attention-mask, --calculate-per-token-loss), on the CPU in plain FP32:
//   - --reset-attention-mask --reset-position-ids: the loss and gradients of a packed sequence A|B are those of
//     A and B run as separate sequences (their token-weighted mean); without the flags they differ;
//   - --eod-mask-loss: the labels at positions whose input is EOD change nothing, any other label does;
//   - the trainer's normalization: per micro-batch over its counted tokens, or over the global batch with
//     --calculate-per-token-loss, with unequal counted tokens per micro-batch; the reported loss is
//     Σ loss / Σ counted tokens in both.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "data/documents.h"
#include "model/llama.h"
#include "model_test_util.h"
#include "train/run_recorder.h"
#include "train/trainer.h"

namespace pl {
namespace {

ModelConfig document_packing_tiny() {
  ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  m.init_method_std = 0.3;  // large enough that attention across documents visibly changes the loss
  return m;
}
constexpr int32_t kEod = 127;  // llama_tiny's vocab - 1, as mock data's

OpContext fp32() {
  OpContext c;
  c.round_bf16 = false;  // the plain-FP32 model: differences come from the flags, not from rounding
  return c;
}

RunLayout packed(bool mask_loss, bool reset_positions, bool reset_attention) {
  RunLayout o;
  o.packing = data::DocumentPacking{kEod, mask_loss, reset_positions, reset_attention};
  return o;
}

struct LossAndGrads {
  double loss_sum;
  std::vector<float> grads;
};

// One forward_backward of one sample of tokens.size() tokens, gradient of grad_scale · Σ losses.
LossAndGrads run(const RunLayout& layout, std::vector<int32_t> tokens, std::vector<int32_t> labels, float grad_scale) {
  const ModelConfig m = document_packing_tiny();
  LlamaModel model(m, 1, static_cast<int64_t>(tokens.size()), fp32(), bf16_plan(m), layout);
  model.init_parameters(7);
  model.zero_grads();
  const double loss = model.forward_backward(tokens.data(), labels.data(), grad_scale);
  const float* g = model.grads().flat.f32();
  return {loss, std::vector<float>(g, g + model.num_params())};
}

std::vector<int32_t> random_ids(size_t n, std::mt19937& rng) {  // never the EOD
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = static_cast<int32_t>(rng() % kEod);
  return v;
}

TEST(ModelDocumentPacking, PackedSequenceEqualsItsDocumentsRunApart) {
  std::mt19937 rng(2702);
  constexpr size_t kA = 7, kS = 20;  // A: 7 tokens ending with EOD; B: the 13 after it
  std::vector<int32_t> tokens = random_ids(kS, rng), labels = random_ids(kS, rng);
  tokens[kA - 1] = kEod;
  const float scale = 1.0f / static_cast<float>(kS);
  const LossAndGrads whole = run(packed(false, true, true), tokens, labels, scale);
  const auto part = [&](size_t a, size_t e) {
    return run({}, std::vector<int32_t>(tokens.begin() + a, tokens.begin() + e),
               std::vector<int32_t>(labels.begin() + a, labels.begin() + e), scale);
  };
  const LossAndGrads a = part(0, kA), b = part(kA, kS);
  // Σ losses of A|B = Σ of A + Σ of B: the mean over the 20 tokens is the token-weighted mean of A's and B's.
  EXPECT_NEAR(whole.loss_sum, a.loss_sum + b.loss_sum, 1e-5 * whole.loss_sum);
  std::vector<float> sum(a.grads.size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = a.grads[i] + b.grads[i];
  const double tol = 1e-4 * max_abs(sum);
  EXPECT_LE(max_diff(whole.grads, sum), tol);
  // Without the flags B attends to A and sees positions 7..19: another loss and other gradients.
  const LossAndGrads across = run({}, tokens, labels, scale);
  EXPECT_GT(std::abs(across.loss_sum - whole.loss_sum), 1e3 * 1e-5 * whole.loss_sum);
  EXPECT_GT(max_diff(across.grads, sum), 100 * tol);
  // Restarted positions alone still attend across: not enough. The block-diagonal mask alone is (up to
  // rounding): RoPE's scores depend only on q and k's relative position, the same inside a document whether
  // its positions start at 0 or at 7 (only the rounding of the angles differs).
  EXPECT_GT(std::abs(run(packed(false, true, false), tokens, labels, scale).loss_sum - whole.loss_sum), 1e-3);
  EXPECT_NEAR(run(packed(false, false, true), tokens, labels, scale).loss_sum, whole.loss_sum, 1e-5 * whole.loss_sum);
}

TEST(ModelDocumentPacking, EodMaskLossIgnoresExactlyThePredictionsFromEod) {
  std::mt19937 rng(2703);
  constexpr size_t kS = 16;
  std::vector<int32_t> tokens = random_ids(kS, rng), labels = random_ids(kS, rng);
  tokens[3] = tokens[10] = kEod;
  const RunLayout mask = packed(true, false, false);
  const LossAndGrads base = run(mask, tokens, labels, 0.1f);
  EXPECT_EQ(data::counted_tokens(mask.packing, tokens, labels), static_cast<int64_t>(kS) - 2);
  std::vector<int32_t> at_eod = labels;
  at_eod[3] = (at_eod[3] + 5) % kEod;
  at_eod[10] = (at_eod[10] + 9) % kEod;
  const LossAndGrads same = run(mask, tokens, at_eod, 0.1f);
  EXPECT_EQ(same.loss_sum, base.loss_sum);
  EXPECT_EQ(same.grads, base.grads);
  std::vector<int32_t> elsewhere = labels;
  elsewhere[4] = (elsewhere[4] + 5) % kEod;
  const LossAndGrads other = run(mask, tokens, elsewhere, 0.1f);
  EXPECT_NE(other.loss_sum, base.loss_sum);
  EXPECT_NE(other.grads, base.grads);
  // Without the flag the EOD positions count: their labels change the loss.
  EXPECT_NE(run({}, tokens, at_eod, 0.1f).loss_sum, run({}, tokens, labels, 0.1f).loss_sum);
}

// One iteration of the trainer over two micro-batches of one sample each (--eod-mask-loss at EOD 127; learning
// rate 0, so the iteration's gradients stay in the model): the reported loss and the gradients.
struct Trained {
  double loss;
  std::vector<float> grads;
  double loss_tokens;              // the iteration record's count
  std::vector<std::string> lines;  // the text log's
};
Trained train_one(bool per_token, const std::vector<int32_t> (&tok)[2], const std::vector<int32_t> (&lab)[2]) {
  const ModelConfig m = document_packing_tiny();
  const auto S = static_cast<int64_t>(tok[0].size());
  LlamaModel model(m, 1, S, fp32(), bf16_plan(m), packed(true, false, false));
  model.init_parameters(7);
  TrainConfig t;
  t.train_iters = 1;
  t.warmup_iters = 1;  // learning rate 0
  t.global_batch_size = 2;
  t.micro_batch_size = 1;
  t.seq_length = S;
  t.calculate_per_token_loss = per_token;
  test::RunRecorder rec;
  std::vector<std::string> lines;
  const std::unique_ptr<observe::MegatronTextLog> text = test::text_log_into(lines);
  Trainer trainer(
      model, t,
      Batches{[&](int64_t, int64_t micro, std::span<int32_t> tokens, std::span<int32_t> labels, std::span<int32_t>) {
        std::copy(tok[micro].begin(), tok[micro].end(), tokens.begin());
        std::copy(lab[micro].begin(), lab[micro].end(), labels.begin());
      }},
      {&rec, text.get()});
  trainer.run();
  const float* g = model.grads().flat.f32();
  return {rec.loss()[0], std::vector<float>(g, g + model.num_params()), rec.iterations.at(0).loss_tokens, lines};
}

// Two micro-batches with 12 and 3 counted tokens. Per micro-batch (Megatron's default) the gradient is
// g0/(2·12) + g1/(2·3); with --calculate-per-token-loss (g0 + g1)/15, where g_m is the gradient of micro-batch
// m's loss sum. The reported loss is (s0 + s1)/15 either way.
TEST(ModelDocumentPacking, PerTokenLossNormalizesOverTheGlobalBatch) {
  constexpr int64_t kS = 16;
  std::mt19937 rng(2704);
  std::vector<int32_t> tok[2] = {random_ids(kS, rng), random_ids(kS, rng)}, lab[2] = {random_ids(kS, rng),
                                                                                        random_ids(kS, rng)};
  for (int i : {1, 5, 9, 13}) tok[0][static_cast<size_t>(i)] = kEod;  // 12 counted
  for (int i = 0; i < 13; ++i) tok[1][static_cast<size_t>(i)] = kEod;  // 3 counted
  const RunLayout mask = packed(true, false, false);
  const LossAndGrads g0 = run(mask, tok[0], lab[0], 1.0f), g1 = run(mask, tok[1], lab[1], 1.0f);
  const double counted = 15.0, reported = (g0.loss_sum + g1.loss_sum) / counted;
  for (bool per_token : {false, true}) {
    SCOPED_TRACE(per_token ? "--calculate-per-token-loss" : "per micro-batch");
    const Trained r = train_one(per_token, tok, lab);
    EXPECT_NEAR(r.loss, reported, 1e-6 * reported);
    std::vector<float> want(g0.grads.size());
    for (size_t i = 0; i < want.size(); ++i)
      want[i] = per_token ? static_cast<float>((g0.grads[i] + g1.grads[i]) / counted)
                          : static_cast<float>(g0.grads[i] / 24.0 + g1.grads[i] / 6.0);
    EXPECT_LE(max_diff(r.grads, want), 1e-4 * max_abs(want));
  }
}

// A micro-batch with no counted token (every input an EOD) adds nothing and makes nothing NaN: its count is
// taken as 1 (Megatron's clamp), so the gradient is the other micro-batch's g0/(2·12), the loss s0/12; a global
// batch with no counted token at all reports loss 0 with zero gradients.
TEST(ModelDocumentPacking, AllMaskedMicroBatchIsSafe) {
  constexpr int64_t kS = 16;
  std::mt19937 rng(2705);
  std::vector<int32_t> tok[2] = {random_ids(kS, rng), std::vector<int32_t>(kS, kEod)},
                       lab[2] = {random_ids(kS, rng), random_ids(kS, rng)};
  for (int i : {1, 5, 9, 13}) tok[0][static_cast<size_t>(i)] = kEod;  // 12 counted
  const LossAndGrads g0 = run(packed(true, false, false), tok[0], lab[0], 1.0f);
  const Trained r = train_one(false, tok, lab);
  EXPECT_NEAR(r.loss, g0.loss_sum / 12.0, 1e-6 * g0.loss_sum);
  std::vector<float> want(g0.grads.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<float>(g0.grads[i] / 24.0);
  EXPECT_LE(max_diff(r.grads, want), 1e-4 * max_abs(want));
  const auto warnings = [](const Trained& t) {
    return std::count_if(t.lines.begin(), t.lines.end(), [](const std::string& l) {
      return l.find("WARNING: iteration 1: every label of the global batch is masked") != std::string::npos;
    });
  };
  EXPECT_EQ(r.loss_tokens, 12.0);
  EXPECT_EQ(warnings(r), 0);
  tok[0].assign(kS, kEod);
  for (bool per_token : {false, true}) {
    const Trained none = train_one(per_token, tok, lab);
    EXPECT_EQ(none.loss, 0.0);
    EXPECT_EQ(max_abs(none.grads), 0.0);
    // A global batch with no counted token is said (issue 38: an all-masked run went to its end unsaid).
    EXPECT_EQ(none.loss_tokens, 0.0);
    EXPECT_EQ(warnings(none), 1);
  }
}

}  // namespace
}  // namespace pl
