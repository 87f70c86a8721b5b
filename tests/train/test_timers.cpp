// Megatron's timers (--timing-log-level): the Timers class on the CPU clock, and real llama_tiny
// training at levels 0, 1 and 2 whose timer blocks are parsed with Megatron's line grammar, named
// as expected, non-negative, and consistent with the iteration's elapsed time; two trainers in one
// process each time only their own model's ops (the Timers travel in the op context).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "backend/ops.h"
#include "config/model_config.h"
#include "config/precision_recipe.h"
#include "core/error.h"
#include "core/timers.h"
#include "data/mock_dataset.h"
#include "model/llama.h"
#include "model/precision_plan.h"
#include "train/run_recorder.h"
#include "train/trainer.h"

namespace pl {
namespace {

using namespace std::chrono_literals;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// ---- the Timers class ------------------------------------------------------------------------------

TEST(Timers, LevelZeroMeasuresNothing) {
  Timers t(Device::CPU, 0);
  t.start(TimerId::ForwardBackward);
  EXPECT_FALSE(t.running(TimerId::ForwardBackward));
  t.stop(TimerId::ForwardBackward);  // not an error at level 0: nothing is timed
  { const OpTimer op(&t, TimerId::OptimizerInnerStep); }
  EXPECT_TRUE(t.read(1.0).empty());
}

TEST(Timers, SumsRegionsNormalizesAndResetsOnRead) {
  Timers t(Device::CPU, 1);
  const auto t0 = std::chrono::steady_clock::now();
  t.start(TimerId::ForwardBackward);
  std::this_thread::sleep_for(20ms);
  t.stop(TimerId::ForwardBackward);
  std::this_thread::sleep_for(5ms);  // outside any region
  t.start(TimerId::ForwardBackward);
  std::this_thread::sleep_for(10ms);
  t.stop(TimerId::ForwardBackward);
  const double outer = ms_since(t0);
  const auto r = t.read(2.0);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(std::string(r[0].name), "forward-backward");
  EXPECT_GE(r[0].ms, 30.0 / 2.0);            // the two regions slept 30 ms, per "iteration" of 2
  EXPECT_LE(r[0].ms, (outer - 5.0) / 2.0);   // and excluded the 5 ms between them
  EXPECT_TRUE(t.read(1.0).empty());          // reset by the read
}

TEST(Timers, LevelTwoTimersAreOffAtLevelOne) {
  Timers t(Device::CPU, 1);
  EXPECT_TRUE(t.enabled(TimerId::Optimizer));
  EXPECT_FALSE(t.enabled(TimerId::ForwardCompute));
  EXPECT_FALSE(t.enabled(TimerId::GemmBf16));
  t.start(TimerId::ForwardCompute);
  t.start(TimerId::Optimizer);
  t.stop(TimerId::Optimizer);
  t.stop(TimerId::ForwardCompute);
  const auto r = t.read(1.0);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].id, TimerId::Optimizer);
}

TEST(Timers, MisuseIsAnError) {
  Timers t(Device::CPU, 2);
  t.start(TimerId::Optimizer);
  EXPECT_THROW(t.start(TimerId::Optimizer), Error);
  EXPECT_THROW(t.stop(TimerId::ForwardBackward), Error);
  EXPECT_THROW(Timers(Device::CPU, 3), Error);
  EXPECT_THROW(Timers(Device::CPU, -1), Error);
}

TEST(Timers, OpsCountOnlyOnTheirTimersAndOnlyTheOutermost) {
  Timers t(Device::CPU, 2);
  { const OpTimer untimed(nullptr, TimerId::Attention); }
  {
    const OpTimer outer(&t, TimerId::GemmNvfp4);
    const OpTimer inner(&t, TimerId::Quantization);  // nested in another op: not counted
    std::this_thread::sleep_for(2ms);
  }
  {
    // Through the dispatcher: an op reports to its context's Timers only.
    Timers other(Device::CPU, 2);
    std::vector<float> x(4);
    OpContext ctx;
    fill_zero(ctx, Tensor(x.data(), {4}, DType::F32, Device::CPU));
    ctx.timers = &other;
    fill_zero(ctx, Tensor(x.data(), {4}, DType::F32, Device::CPU));
    const auto r = other.read(1.0);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].id, TimerId::Elementwise);
  }
  const auto r = t.read(1.0);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].id, TimerId::GemmNvfp4);
  EXPECT_GE(r[0].ms, 2.0);
}

// ---- training on llama_tiny ------------------------------------------------------------------------

// One log interval's output: the iteration line's elapsed ms and the timer block after it.
struct TimersBlock {
  double elapsed_ms = 0.0;
  std::vector<std::pair<std::string, double>> timers;  // in print order
  double get(const std::string& name) const {
    for (const auto& [n, v] : timers)
      if (n == name) return v;
    ADD_FAILURE() << "no timer " << name;
    return 0.0;
  }
};

// Parses the lines with Megatron's grammar: the minmax header, then
// "    <name + ' ' padded with '.' to 48>: (<min>, <max>)" lines (megatron/core/timers.py).
std::vector<TimersBlock> timers_parse(const std::vector<std::string>& lines) {
  const std::regex iteration(R"( elapsed time per iteration \(ms\): (\d+\.\d) \|)");
  const std::regex timer(R"(^    (([a-z0-9-]+) \.*): \((\d+\.\d\d), (\d+\.\d\d)\)$)");
  std::vector<TimersBlock> blocks;
  bool in_block = false, header_seen = false;
  for (const std::string& line : lines) {
    std::smatch m;
    if (std::regex_search(line, m, iteration)) {
      blocks.push_back(TimersBlock{std::stod(m[1]), {}});
      in_block = false;
      header_seen = false;
    } else if (line == "(min, max) time across ranks (ms):") {
      EXPECT_FALSE(blocks.empty()) << "timer block before any iteration line";
      EXPECT_FALSE(header_seen) << "two timer headers in one interval";
      in_block = header_seen = true;
    } else if (std::regex_match(line, m, timer)) {
      EXPECT_TRUE(in_block) << "timer line outside a block: " << line;
      EXPECT_EQ(m[1].length(), 48) << line;
      EXPECT_EQ(m[3].str(), m[4].str()) << "one process: min = max: " << line;
      if (!blocks.empty()) blocks.back().timers.emplace_back(m[2].str(), std::stod(m[3]));
    } else {
      in_block = false;
    }
  }
  return blocks;
}

std::vector<std::string> names(const TimersBlock& b) {
  std::vector<std::string> n;
  for (const auto& t : b.timers) n.push_back(t.first);
  return n;
}

// llama_tiny on the CPU: GBS 4, MBS 2 (two micro-batches), seq 32; after_batch runs after each micro-batch's data.
std::vector<std::string> train(int level, int64_t iters, int64_t log_interval, const PrecisionPlan* plan = nullptr,
                               const std::function<void()>& after_batch = {}) {
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  TrainConfig t;
  t.train_iters = iters;
  t.warmup_iters = 1;
  t.global_batch_size = 4;
  t.micro_batch_size = 2;
  t.seq_length = 32;
  t.log_interval = log_interval;
  t.timing_log_level = level;
  data::MockGPTDataset data(
      data::MockDataConfig{m.vocab_size, m.vocab_size - 1, t.seq_length, iters * t.global_batch_size, 1234});
  const PrecisionPlan p = plan ? *plan : bf16_plan(m);
  LlamaModel model(m, t.micro_batch_size, t.seq_length, OpContext{}, p);
  model.init_parameters(t.seed);
  std::vector<std::string> lines;
  const auto text = test::text_log_into(lines);
  Trainer tr(
      model, t,
      Batches{[&](int64_t first, int64_t mi, std::span<int32_t> tok, std::span<int32_t> lab, std::span<int32_t>) {
        data.micro_batch(first, mi, t.micro_batch_size, tok, lab);
        if (after_batch) after_batch();
      }},
      {text.get()});
  tr.run();
  return lines;
}

// Printed values: elapsed with 1 decimal, timers with 2; the timers' regions lie inside the step.
double tolerance(size_t n_timers, double elapsed) { return 0.06 + 0.005 * static_cast<double>(n_timers) + 1e-3 * elapsed; }

const std::vector<std::string> kLevel1 = {"forward-backward", "optimizer-clip-main-grad", "optimizer-inner-step",
                                          "optimizer-copy-main-to-model-params", "optimizer"};

void check_level1(const TimersBlock& b) {
  for (const auto& [n, v] : b.timers) EXPECT_GE(v, 0.0) << n;
  const double fb = b.get("forward-backward"), opt = b.get("optimizer");
  // forward-backward and optimizer do not overlap and lie inside the iteration ...
  EXPECT_LE(fb + opt, b.elapsed_ms + tolerance(2, b.elapsed_ms));
  // ... and are most of it (the rest: zeroing the gradients, bookkeeping).
  EXPECT_GE(fb + opt, 0.5 * b.elapsed_ms);
  // The optimizer's phases are inside it and do not overlap each other.
  const double parts = b.get("optimizer-clip-main-grad") + b.get("optimizer-inner-step") +
                       b.get("optimizer-copy-main-to-model-params");
  EXPECT_LE(parts, opt + tolerance(4, opt));
}

TEST(TrainTimers, LevelZeroPrintsNoTimerLines) {
  const std::vector<std::string> lines = train(0, 2, 1);
  for (const std::string& l : lines) {
    EXPECT_EQ(l.find("time across ranks"), std::string::npos) << l;
    EXPECT_EQ(l.find("forward-backward"), std::string::npos) << l;
  }
  EXPECT_EQ(timers_parse(lines).size(), 2u);
}

TEST(TrainTimers, LevelOneBlockAfterEachIterationLine) {
  const std::vector<std::string> lines = train(1, 3, 1);
  // Megatron's order: the iteration line, (the memory line once), then the timer block.
  for (size_t i = 0; i < lines.size(); ++i)
    if (lines[i] == "(min, max) time across ranks (ms):") {
      ASSERT_GE(i, 1u);
      const bool after_iteration = lines[i - 1].find(" iteration ") != std::string::npos ||
                                   (i >= 2 && lines[i - 1].rfind("[Rank 0] (after", 0) == 0 &&
                                    lines[i - 2].find(" iteration ") != std::string::npos);
      EXPECT_TRUE(after_iteration) << lines[i - 1];
    }
  const std::vector<TimersBlock> blocks = timers_parse(lines);
  ASSERT_EQ(blocks.size(), 3u);
  for (const TimersBlock& b : blocks) {
    EXPECT_EQ(names(b), kLevel1);
    check_level1(b);
  }
}

// Every layer of llama_tiny in NVFP4.
PrecisionPlan all_nvfp4_plan() {
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  PrecisionRecipe r = load_precision_recipe(std::string(PL_CONFIG_DIR) + "/recipes/bf16_with_nvfp4_mixed.json");
  r.first_last_layers_bf16 = false;
  return make_precision_plan(m, r);
}

// The level-2 timers after kLevel1 of an all-NVFP4 run, in print order; the lm head is a BF16 GEMM.
const std::vector<std::string> kLevel2Nvfp4 = {"batch-generator", "forward-compute", "backward-compute", "gemm-bf16",
                                               "gemm-nvfp4", "attention", "quantization", "rmsnorm", "rope", "swiglu",
                                               "embedding", "cross-entropy", "elementwise"};

std::vector<std::string> level1_and(const std::vector<std::string>& level2) {
  std::vector<std::string> all = kLevel1;
  all.insert(all.end(), level2.begin(), level2.end());
  return all;
}

TEST(TrainTimers, LevelTwoAddsComputePhasesAndOpCategories) {
  const PrecisionPlan plan = all_nvfp4_plan();
  ASSERT_EQ(plan.quantized().x, QuantFormat::NVFP4);
  // Four iterations logged every two: the values are per iteration (normalized by the interval).
  const std::vector<TimersBlock> blocks = timers_parse(train(2, 4, 2, &plan));
  ASSERT_EQ(blocks.size(), 2u);
  const std::vector<std::string>& level2 = kLevel2Nvfp4;
  const std::vector<std::string> expected = level1_and(level2);
  for (const TimersBlock& b : blocks) {
    EXPECT_EQ(names(b), expected);
    check_level1(b);
    // Megatron's nesting: batch-generator in forward-compute; forward- and backward-compute in forward-backward.
    const double fc = b.get("forward-compute"), bc = b.get("backward-compute");
    EXPECT_LE(b.get("batch-generator"), fc + tolerance(2, fc));
    EXPECT_LE(fc + bc, b.get("forward-backward") + tolerance(3, fc + bc));
    EXPECT_GT(bc, 0.0);
    // The op categories are disjoint, inside the iteration, and on the CPU most of it.
    double ops = b.get("optimizer-clip-main-grad") + b.get("optimizer-inner-step");
    for (size_t i = 3; i < level2.size(); ++i) ops += b.get(level2[i]);
    EXPECT_LE(ops, b.elapsed_ms + tolerance(level2.size(), b.elapsed_ms));
    EXPECT_GE(ops, 0.5 * b.elapsed_ms);
    // The NVFP4 weights are quantized after each step, inside optimizer-copy-main-to-model-params.
    EXPECT_GT(b.get("optimizer-copy-main-to-model-params"), 0.0);
  }
}

// Two threads taking turns: only the one whose turn it is runs. hand_over passes the turn to the other
// (unless that one has finished) and waits until it comes back.
class Turns {
 public:
  void wait_for(int me) {
    std::unique_lock lock(m_);
    cv_.wait(lock, [&] { return turn_ == me; });
  }
  void hand_over(int me) {
    pass(me, false);
    wait_for(me);
  }
  void finish(int me) { pass(me, true); }

 private:
  void pass(int me, bool finished) {
    {
      const std::lock_guard lock(m_);
      done_[me] = done_[me] || finished;
      if (!done_[1 - me]) turn_ = 1 - me;
    }
    cv_.notify_all();
  }
  std::mutex m_;
  std::condition_variable cv_;
  int turn_ = 0;
  bool done_[2] = {false, false};
};

// The timers reach the ops through each model's context (OpContext::timers), not through anything the
// process shares: two trainers with their own Timers, an NVFP4 and a BF16 one, run in one process with
// their iterations interleaved micro-batch by micro-batch (two threads taking turns; one runs at a time),
// and each timer block holds the categories of its own model's ops only. With one process-wide "active
// Timers" the trainer that started last would receive the other one's ops.
TEST(TrainTimers, TwoTrainersInOneProcessTimeOnlyTheirOwnOps) {
  const PrecisionPlan nvfp4 = all_nvfp4_plan();
  Turns turns;
  std::vector<std::string> lines[2];
  const auto run = [&](int me, const PrecisionPlan* plan) {
    turns.wait_for(me);
    try {
      lines[me] = train(2, 3, 1, plan, [&] { turns.hand_over(me); });
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
    }
    turns.finish(me);
  };
  std::thread first(run, 0, &nvfp4), second(run, 1, nullptr);
  first.join();
  second.join();
  const std::vector<std::string> bf16 = level1_and({"batch-generator", "forward-compute", "backward-compute",
                                                    "gemm-bf16", "attention", "rmsnorm", "rope", "swiglu",
                                                    "embedding", "cross-entropy", "elementwise"});
  for (int who = 0; who < 2; ++who) {
    const std::vector<TimersBlock> blocks = timers_parse(lines[who]);
    ASSERT_EQ(blocks.size(), 3u) << who;
    for (const TimersBlock& b : blocks) EXPECT_EQ(names(b), who == 0 ? level1_and(kLevel2Nvfp4) : bf16) << who;
  }
}

}  // namespace
}  // namespace pl
