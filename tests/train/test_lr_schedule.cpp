// Megatron's OptimizerParamScheduler counted in samples (SPEC-MEGATRON §6), checked against the playbook
// values (max 3e-4, min 3e-5, warmup 2 iterations, 50 iterations, global batch 64) and, for every decay style,
// the warmup fraction and the weight-decay increment, against Megatron's get_lr / get_wd written out again
// here (megatron/core/optimizer_param_scheduler.py). Then AdamW's flags through optimizer_config, the path
// the command line feeds, against a hand computation of two steps.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <cmath>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include "config/model_config.h"
#include "core/error.h"
#include "model/llama.h"
#include "test_util.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"

namespace {

using pl::LrSchedule;
using pl::TrainConfig;

TrainConfig config(int64_t warmup, int64_t iters, int64_t global_batch) {
  TrainConfig t;
  t.lr = 3e-4;
  t.min_lr = 3e-5;
  t.warmup_iters = warmup;
  t.train_iters = iters;
  t.global_batch_size = global_batch;
  return t;
}
LrSchedule playbook() { return LrSchedule::from_config(config(/*warmup*/ 2, /*iters*/ 50, /*GBS*/ 64)); }

TEST(LrSchedule, PlaybookValuesAsLogged) {
  const LrSchedule s = playbook();
  const std::vector<std::pair<int, std::string>> expected = {
      {1, "1.500000E-04"},  {2, "3.000000E-04"},  {3, "2.997110E-04"},  {10, "2.819134E-04"},
      {20, "2.166623E-04"}, {25, "1.738294E-04"}, {49, "3.028905E-05"}, {50, "3.000000E-05"}};
  for (const auto& [k, text] : expected) EXPECT_EQ(fmt::format("{:.6E}", s.lr_at(int64_t{k} * 64)), text) << "k=" << k;
}

TEST(LrSchedule, SamplesNotIterations) {
  const LrSchedule s = playbook();
  EXPECT_EQ(s.warmup_samples, 2 * 64);
  EXPECT_EQ(s.decay_samples, 50 * 64);
  EXPECT_DOUBLE_EQ(s.lr_at(32), 3e-4 * 32.0 / 128.0);  // mid-warmup: 32 of 128 warmup samples
  EXPECT_EQ(s.lr_at(0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(51 * 64), 3e-5);
  EXPECT_DOUBLE_EQ(s.wd_at(0), 0.033);  // the recipe's constant weight decay
  EXPECT_DOUBLE_EQ(s.wd_at(51 * 64), 0.033);
}

// Megatron's get_lr, in its own words (num_steps, warmup and decay steps are samples here).
double megatron_lr(const LrSchedule& s, double num_steps) {
  const double max_lr = s.max_lr, min_lr = s.min_lr, warmup = s.warmup_samples;
  const auto decay = static_cast<double>(s.decay_samples);
  if (warmup > 0 && num_steps <= warmup) return s.init_lr + (max_lr - s.init_lr) * num_steps / warmup;
  if (s.decay_style == "constant") return max_lr;
  if (num_steps > decay) return min_lr;
  if (s.decay_style == "inverse-square-root")
    return std::max(min_lr, max_lr * std::pow(std::max(warmup, 1.0), 0.5) / std::pow(std::max(num_steps, 1.0), 0.5));
  const double decay_ratio = (num_steps - warmup) / (decay - warmup);
  double coeff = 0;
  if (s.decay_style == "linear") coeff = 1.0 - decay_ratio;
  if (s.decay_style == "cosine") coeff = 0.5 * (std::cos(std::numbers::pi * decay_ratio) + 1.0);
  if (s.decay_style == "WSD") {
    const double anneal_start = decay - static_cast<double>(s.wsd_decay_samples);
    if (num_steps <= anneal_start) {
      coeff = 1.0;
    } else {
      const double r = (num_steps - anneal_start) / static_cast<double>(s.wsd_decay_samples);
      if (s.wsd_decay_style == "linear") coeff = 1.0 - r;
      if (s.wsd_decay_style == "cosine") coeff = 0.5 * (std::cos(std::numbers::pi * r) + 1.0);
      if (s.wsd_decay_style == "exponential") coeff = 2.0 * std::pow(0.5, r) - 1.0;
      if (s.wsd_decay_style == "minus_sqrt") coeff = 1.0 - std::sqrt(r);
    }
  }
  return min_lr + coeff * (max_lr - min_lr);
}

TEST(LrSchedule, EveryDecayStyleFollowsMegatronsGetLr) {
  // 20 iterations of 8 samples, warmup 3, decay over 16 (so the tail past the span is at min_lr too).
  struct Case {
    std::string style, wsd = "exponential";
    std::vector<double> spot;  // a few values computed by hand at iterations 2, 10 and 18
  };
  const std::vector<Case> cases = {
      {"constant", "exponential", {2e-4, 3e-4, 3e-4}},
      {"linear", "exponential", {2e-4, 3e-4 - (2.7e-4 * 7.0 / 13.0), 3e-5}},
      {"cosine", "exponential", {2e-4, 3e-5 + 2.7e-4 * 0.5 * (std::cos(std::numbers::pi * 7.0 / 13.0) + 1.0), 3e-5}},
      {"inverse-square-root", "exponential", {2e-4, 3e-4 * std::sqrt(3.0 / 10.0), 3e-5}},
      {"WSD", "exponential", {2e-4, 3e-4, 3e-5}},
      {"WSD", "linear", {2e-4, 3e-4, 3e-5}},
      {"WSD", "cosine", {2e-4, 3e-4, 3e-5}},
      {"WSD", "minus_sqrt", {2e-4, 3e-4, 3e-5}},
  };
  for (const Case& c : cases) {
    TrainConfig t = config(3, 20, 8);
    t.schedule_given = true;
    t.lr_decay_iters = 16;
    t.lr_decay_style = c.style;
    t.lr_wsd_decay_style = c.wsd;
    t.lr_wsd_decay_iters = 5;
    const LrSchedule s = LrSchedule::from_config(t);
    SCOPED_TRACE(c.style + " " + c.wsd);
    for (int k = 0; k <= 20; ++k) EXPECT_DOUBLE_EQ(s.lr_at(k * 8), megatron_lr(s, k * 8.0)) << "iteration " << k;
    const int at[] = {2, 10, 18};
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(s.lr_at(at[i] * 8), c.spot[i], 1e-12) << "iteration " << at[i];
  }
}

TEST(LrSchedule, WsdAnnealsOverItsLastIterationsOnly) {
  TrainConfig t = config(0, 10, 4);
  t.lr_decay_style = "WSD";
  t.lr_wsd_decay_style = "linear";
  t.lr_wsd_decay_iters = 4;
  const LrSchedule s = LrSchedule::from_config(t);
  for (int k = 0; k <= 6; ++k) EXPECT_DOUBLE_EQ(s.lr_at(k * 4), 3e-4) << k;  // stable to iteration 6
  EXPECT_DOUBLE_EQ(s.lr_at(8 * 4), 3e-5 + 2.7e-4 * 0.5);                         // half the anneal
  EXPECT_DOUBLE_EQ(s.lr_at(10 * 4), 3e-5);
  t.lr_wsd_decay_style = "exponential";  // 2 * 0.5^r - 1
  EXPECT_DOUBLE_EQ(LrSchedule::from_config(t).lr_at(8 * 4), 3e-5 + 2.7e-4 * (2.0 * std::pow(0.5, 0.5) - 1.0));
}

TEST(LrSchedule, WarmupFractionIsOfTheDecaySpanInSamples) {
  // Megatron: lr_warmup_steps = fraction x lr_decay_iters x global batch, possibly not a whole iteration.
  TrainConfig t = config(2, 20, 8);
  t.schedule_given = true;
  t.lr_warmup_fraction = 0.1;
  t.lr_decay_iters = 15;
  const LrSchedule s = LrSchedule::from_config(t);
  EXPECT_DOUBLE_EQ(s.warmup_samples, 0.1 * 15 * 8);  // 12 samples: 1.5 iterations
  EXPECT_DOUBLE_EQ(s.lr_at(8), 3e-4 * 8.0 / 12.0);
  EXPECT_DOUBLE_EQ(s.lr_at(12), 3e-4);
  for (int k = 0; k <= 20; ++k) EXPECT_DOUBLE_EQ(s.lr_at(k * 8), megatron_lr(s, k * 8.0)) << k;
}

TEST(LrSchedule, WeightDecayIncrementFollowsMegatronsGetWd) {
  TrainConfig t = config(0, 10, 4);
  t.start_weight_decay = 0.01;
  t.end_weight_decay = 0.1;
  for (const char* style : {"linear", "cosine"}) {
    t.weight_decay_incr_style = style;
    const LrSchedule s = LrSchedule::from_config(t);
    for (int k = 0; k <= 12; ++k) {
      const double ratio = std::min(1.0, k / 10.0);  // wd_incr_steps = train_iters x global batch
      const double coeff = std::string(style) == "linear" ? ratio : 0.5 * (std::cos(std::numbers::pi * (1 - ratio)) + 1.0);
      EXPECT_NEAR(s.wd_at(k * 4), 0.01 + coeff * 0.09, 1e-15) << style << " iteration " << k;
    }
  }
}

TEST(LrSchedule, ChosenWarmupNotBelowTheDecaySpanIsAnErrorInSamples) {
  TrainConfig t = config(50, 50, 64);
  t.schedule_given = true;  // --warmup-iters 50 given
  pl::test::expect_one_line_error([&] { LrSchedule::from_config(t); },
                                  {"--warmup-iters 50", "3200 samples", "--train-iters 50", "lr_warmup_steps"});
  t.warmup_iters = 2;
  t.lr_decay_iters = 2;
  pl::test::expect_one_line_error([&] { LrSchedule::from_config(t); }, {"--lr-decay-iters 2", "128 samples"});
  t.lr_decay_iters = 0;
  t.lr_warmup_fraction = 1.0;
  pl::test::expect_one_line_error([&] { LrSchedule::from_config(t); }, {"--lr-warmup-fraction 1", "3200 samples"});
}

TEST(LrSchedule, RecipesDefaultWarmupIsCappedAsBridgeAndSaysSo) {
  // No schedule flag given: the recipe's warmup of 2 against --train-iters 1 or 2 is capped to decay - 1.
  const LrSchedule one = LrSchedule::from_config(config(2, 1, 64));
  EXPECT_EQ(one.warmup_samples, 0);
  EXPECT_DOUBLE_EQ(one.lr_at(64), 3e-5);
  EXPECT_EQ(one.capped_warmup_iters, 2);
  EXPECT_NE(one.describe(64).find("capped"), std::string::npos);
  EXPECT_EQ(LrSchedule::from_config(config(2, 2, 64)).warmup_samples, 64);
  EXPECT_EQ(playbook().capped_warmup_iters, -1);
}

TEST(LrSchedule, MegatronsRulesBetweenTheFlags) {
  TrainConfig t = config(0, 10, 4);
  t.lr_decay_style = "WSD";
  pl::test::expect_one_line_error([&] { LrSchedule::from_config(t); }, {"--lr-wsd-decay-iters"});
  t.lr_decay_style = "cosine";
  t.start_weight_decay = 0.1;
  pl::test::expect_one_line_error([&] { LrSchedule::from_config(t); }, {"--start-weight-decay", "constant"});
  t.weight_decay_incr_style = "linear";
  pl::test::expect_one_line_error([&] { LrSchedule::from_config(t); }, {"--end-weight-decay"});
  t.end_weight_decay = 0.01;
  pl::test::expect_one_line_error([&] { LrSchedule::from_config(t); }, {"--start-weight-decay 0.1", "--end-weight-decay 0.01"});
  t.weight_decay_incr_style = "step";
  pl::test::expect_one_line_error([&] { LrSchedule::from_config(t); }, {"--weight-decay-incr-style", "step"});
  t = config(0, 10, 4);
  t.lr_decay_style = "wsd";  // Megatron's spelling is WSD
  pl::test::expect_one_line_error([&] { LrSchedule::from_config(t); }, {"--lr-decay-style", "wsd"});
}

// ---- AdamW's flags, through optimizer_config (what the command line fills) -----------------------------

// Two steps of AdamW on llama_tiny with every gradient g1, then g2, from master weights all w0: the values
// of one decayed (matrix) element and one not decayed (norm weight) element.
struct TwoSteps {
  double matrix = 0, norm = 0;
};
constexpr double kW0 = 0.5, kG1 = 0.02, kG2 = -0.01, kLr = 0.1;

TwoSteps run_two_steps(const TrainConfig& t) {
  const pl::ModelConfig m = pl::load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  pl::LlamaModel model(m, 1, 8, pl::OpContext{}, pl::bf16_plan(m), {});
  const int64_t n = model.num_params();
  const std::vector<float> w0(static_cast<size_t>(n), static_cast<float>(kW0));
  model.write_master(0, w0.data(), n);
  pl::AdamW opt(model, pl::optimizer_config(t));
  const LrSchedule schedule = LrSchedule::from_config(t);
  for (double g : {kG1, kG2}) {
    float* grads = model.grads().flat.f32();
    std::fill(grads, grads + n, static_cast<float>(g));
    opt.step(kLr, schedule.wd_at(0));
  }
  int64_t matrix = -1, norm = -1;
  for (const pl::ParamEntry& e : model.param_entries()) (e.is_matrix ? matrix : norm) = e.offset;
  const float* master = model.master().flat.f32();
  // --log-params-norm's value: the L2 norm of the FP32 masters (summed in FP32 lanes, as the grad norm).
  double squares = 0;
  for (int64_t i = 0; i < n; ++i) squares += static_cast<double>(master[i]) * master[i];
  EXPECT_NEAR(opt.master_weights_norm(), std::sqrt(squares), 1e-5 * std::sqrt(squares));
  return {master[matrix], master[norm]};
}

// The same by hand (Megatron's AdamW with decoupled decay, global-norm clipping coefficient
// clip / (norm + 1e-6) when below 1, bias corrections 1 - beta^step).
double by_hand(const TrainConfig& t, int64_t n, bool decayed) {
  double w = kW0, m = 0, v = 0;
  int step = 0;
  for (double g : {kG1, kG2}) {
    ++step;
    const double norm = std::abs(g) * std::sqrt(static_cast<double>(n));
    const double clip = t.clip_grad / (norm + 1e-6);
    const double gs = g * (t.clip_grad > 0 && clip < 1.0 ? clip : 1.0);
    m = t.adam_beta1 * m + (1 - t.adam_beta1) * gs;
    v = t.adam_beta2 * v + (1 - t.adam_beta2) * gs * gs;
    const double m_hat = m / (1 - std::pow(t.adam_beta1, step)), v_hat = v / (1 - std::pow(t.adam_beta2, step));
    w -= kLr * (m_hat / (std::sqrt(v_hat) + t.adam_eps) + (decayed ? t.weight_decay : 0.0) * w);
  }
  return w;
}

TEST(AdamWFlags, EachFlagChangesTheUpdateAsItsFormulaSays) {
  const pl::ModelConfig m = pl::load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  const int64_t n = m.num_parameters();
  // The recipe's values but the clip: 0.015 sqrt(n) clips the first step's gradient (norm 0.02 sqrt(n)) to
  // 0.015 per element and leaves the second's (0.01 sqrt(n)), so both betas show (with two gradients of
  // one magnitude beta2 would cancel out of the bias-corrected update).
  TrainConfig base;
  base.train_iters = 10;
  base.clip_grad = 0.015 * std::sqrt(static_cast<double>(n));
  const TwoSteps defaults = run_two_steps(base);
  std::vector<std::pair<std::string, TrainConfig>> cases;
  const auto with = [&](const char* name, auto set) {
    TrainConfig t = base;
    set(t);
    cases.emplace_back(name, t);
  };
  with("defaults", [](TrainConfig&) {});
  with("--adam-beta1 0.5", [](TrainConfig& t) { t.adam_beta1 = 0.5; });
  with("--adam-beta2 0.5", [](TrainConfig& t) { t.adam_beta2 = 0.5; });
  with("--adam-eps 1e-3", [](TrainConfig& t) { t.adam_eps = 1e-3; });
  with("--weight-decay 0.5", [](TrainConfig& t) { t.weight_decay = 0.5; });
  with("--clip-grad 1 (both steps clipped)", [](TrainConfig& t) { t.clip_grad = 1.0; });
  with("--clip-grad 0", [](TrainConfig& t) { t.clip_grad = 0.0; });
  for (const auto& [name, t] : cases) {
    SCOPED_TRACE(name);
    const TwoSteps got = run_two_steps(t);
    EXPECT_NEAR(got.matrix, by_hand(t, n, true), 2e-6);
    EXPECT_NEAR(got.norm, by_hand(t, n, false), 2e-6);
    if (name == "defaults") continue;
    // The flag made a difference (the decay only on the matrix element).
    EXPECT_GT(std::abs(got.matrix - defaults.matrix), 1e-5);
    if (name != "--weight-decay 0.5") {
      EXPECT_GT(std::abs(got.norm - defaults.norm), 1e-5);
    }
  }
}

}  // namespace
