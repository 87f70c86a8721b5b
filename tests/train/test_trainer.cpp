// The training loop on llama_tiny: no allocation inside the loop, NaN handling, and the whole
// binary end to end with every line checked against Megatron-Bridge's formats.
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "core/error.h"
#include "data/mock_dataset.h"
#include "model/llama.h"
#include "observe/checkpointer.h"
#include "observe/stop_conditions.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/mock_runs.h"
#include "train/run_recorder.h"
#include "train/trainer.h"

namespace pl {
namespace {

ModelConfig trainer_tiny() { return load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json"); }

struct TrainerTinyRun {
  TrainConfig t;
  observe::StopConfig stop;
  ModelConfig m = trainer_tiny();
  std::unique_ptr<data::MockGPTDataset> data;
  std::unique_ptr<LlamaModel> model;
  std::vector<std::string> lines;
  test::RunRecorder rec;
  std::unique_ptr<observe::StopConditions> stops;
  std::unique_ptr<observe::MegatronTextLog> text = test::text_log_into(lines);

  explicit TrainerTinyRun(int64_t iters, int64_t global_batch = 4, RunLayout options = {}) {
    t.train_iters = iters;
    t.warmup_iters = 1;
    t.global_batch_size = global_batch;
    t.micro_batch_size = 2;
    t.seq_length = 32;
    data = std::make_unique<data::MockGPTDataset>(
        data::MockDataConfig{m.vocab_size, m.vocab_size - 1, t.seq_length, iters * t.global_batch_size, 1234});
    model = std::make_unique<LlamaModel>(m, t.micro_batch_size, t.seq_length, OpContext{},
                                         bf16_plan(m), options);
    model->init_parameters(t.seed);
  }
  BatchFn batches() { return test::mock_batches(*data, t); }
  // The stop conditions, the text log and the recorder, plus `more` after them.
  Trainer trainer(std::vector<TrainObserver*> more = {}) {
    stops = std::make_unique<observe::StopConditions>(stop, nullptr, std::chrono::steady_clock::now());
    std::vector<TrainObserver*> all{stops.get(), text.get(), &rec};
    all.insert(all.end(), more.begin(), more.end());
    return Trainer(*model, t, Batches{batches()}, std::move(all));
  }
};

TEST(TrainLoop, AllocatesNothingAfterTheFirstIteration) {
  TrainerTinyRun run(4);
  const log::RunEnd r = run.trainer().run();
  EXPECT_EQ(r.allocations_in_loop, 0u);
  ASSERT_EQ(run.rec.loss().size(), 4u);
  for (double l : run.rec.loss()) EXPECT_TRUE(std::isfinite(l));
}

// The per-token losses of an iteration's micro-batches stay on the device and are read once (or in
// chunks of loss_micro_batches): the reported losses are the same doubles, bit for bit, as reading
// each micro-batch's losses right after it (the same additions in the same order), and training is
// unchanged.
TEST(TrainLoop, LossReadOncePerIterationEqualsPerMicroBatchReads) {
  std::vector<std::vector<double>> losses, norms;
  for (int64_t slots : {1, 4, 3}) {  // 4 micro-batches per iteration: every one, all at once, 3 + 1
    SCOPED_TRACE("loss_micro_batches " + std::to_string(slots));
    RunLayout o;
    o.loss_micro_batches = slots;
    TrainerTinyRun run(3, 8, o);
    ASSERT_EQ(run.t.num_micro_batches(), 4);
    EXPECT_EQ(run.trainer().run().allocations_in_loop, 0u);
    losses.push_back(run.rec.loss());
    norms.push_back(run.rec.grad_norm());
  }
  for (size_t k = 1; k < losses.size(); ++k)
    for (size_t i = 0; i < losses[0].size(); ++i) {
      EXPECT_EQ(std::bit_cast<uint64_t>(losses[k][i]), std::bit_cast<uint64_t>(losses[0][i]))
          << "iteration " << i + 1 << ": " << losses[k][i] << " vs " << losses[0][i];
      EXPECT_EQ(norms[k][i], norms[0][i]) << "iteration " << i + 1;
    }
}

TEST(TrainLoop, FirstStepUsesLearningRateZeroThenFollowsTheSchedule) {
  TrainerTinyRun run(3);  // warmup 1 iteration of 4 samples, decay over 3 iterations
  run.trainer().run();
  const std::vector<double> lr = run.rec.lr_used();
  ASSERT_EQ(lr.size(), 3u);
  EXPECT_EQ(lr[0], 0.0);
  EXPECT_DOUBLE_EQ(lr[1], run.t.lr);
  EXPECT_DOUBLE_EQ(lr[2], run.t.min_lr + 0.5 * (run.t.lr - run.t.min_lr) * (std::cos(M_PI * 0.5) + 1.0));
}

TEST(TrainLoop, AStepAtLearningRateZeroLeavesTheMasterWeightsUnchanged) {
  TrainerTinyRun run(1);
  std::vector<int32_t> tok(64), lab(64);
  run.data->micro_batch(0, 0, 2, tok, lab);
  run.model->zero_grads();
  run.model->forward_backward(tok.data(), lab.data(), 1.0f / 64);
  const std::vector<float> before(run.model->master().flat.f32(),
                                  run.model->master().flat.f32() + run.model->num_params());
  AdamW opt(*run.model, OptimizerConfig{});
  const AdamW::Result r = opt.step(0.0);
  EXPECT_FALSE(r.skipped);
  EXPECT_GT(r.grad_norm, 0.0);
  const float* after = run.model->master().flat.f32();
  for (int64_t i = 0; i < run.model->num_params(); ++i) ASSERT_EQ(after[i], before[i]) << i;
}

TEST(TrainLoop, NonFiniteLossSkipsTheUpdateAndStopsAfterTheLimit) {
  TrainerTinyRun run(5);
  run.stop.max_consecutive_nan_iterations = 3;
  // A NaN in the final norm weight makes every loss NaN.
  run.model->master().final_norm.f32()[0] = std::nanf("");
  run.model->sync_weights_from_master();
  Trainer tr = run.trainer();
  try {
    tr.run();
    FAIL() << "expected the trainer to stop";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 consecutive iterations"), std::string::npos) << e.what();
  }
  ASSERT_EQ(run.lines.size(), 3u * 2 + 1);  // Step Time + iteration per iteration, memory line once
  EXPECT_NE(run.lines[1].find("number of skipped iterations:   1 | number of nan iterations:   1 |"),
            std::string::npos)
      << run.lines[1];
  EXPECT_EQ(run.lines[1].find("lm loss"), std::string::npos) << "a skipped iteration has no loss to average";
  // A skipped step does not advance the scheduler: the logged (next) lr stays at lr(0) = 0.
  EXPECT_NE(run.lines[1].find("learning rate: 0.000000E+00"), std::string::npos) << run.lines[1];
  // The records say the same: skipped, no loss, no norm, the limit's count.
  ASSERT_EQ(run.rec.iterations.size(), 3u);
  EXPECT_TRUE(run.rec.iterations[2].skipped);
  EXPECT_TRUE(std::isnan(run.rec.iterations[2].lm_loss));
  EXPECT_EQ(run.rec.iterations[2].consecutive_nan, 3);
  EXPECT_FALSE(run.rec.end) << "a run that stopped with an error has no end";
}

// An observer that asks for a stop (here after iteration 2 of 6) ends the run after that iteration: its
// checkpoint is saved (the checkpoints' observer sees last = true), the evaluations after training are
// skipped, and the end says why.
struct StopAfter : TrainObserver {
  int64_t at;
  explicit StopAfter(int64_t a) : at(a) {}
  log::StopRequest stop_requested(const log::IterationRecord& it) override {
    return it.iteration == at ? log::StopRequest{log::StopCause::Observer} : log::StopRequest{};
  }
};

TEST(TrainLoop, AnObserverThatAsksForAStopEndsTheRunWithACheckpoint) {
  test::TempDir dir;
  const std::string save = (dir.path() / "ckpt").string();
  TrainerTinyRun run(6);
  run.t.eval_iters = 1;
  run.t.eval_interval = 10;
  RunDescription d{run.m, "bf16_mixed", "", {}, run.t, {"test"}, "mock", {}};
  StopAfter stop(2);
  std::vector<std::string> saves;
  observe::Checkpointer checkpoints(observe::CheckpointConfig{.save = save}, d, std::nullopt, nullptr, "",
                                    [&](const std::string& l) { saves.push_back(l); });
  Trainer tr(*run.model, run.t, Batches{run.batches(), run.batches(), run.batches()}, {&stop, &checkpoints, &run.rec});
  const log::RunEnd end = tr.run();
  EXPECT_EQ(end.stop.cause, log::StopCause::Observer);
  EXPECT_EQ(end.last_iteration, 2);
  EXPECT_EQ(run.rec.iterations.size(), 2u);
  EXPECT_EQ(run.rec.last, (std::vector<bool>{false, true}));
  EXPECT_TRUE(run.rec.evals.empty()) << "an early stop skips the evaluations after training";
  EXPECT_FALSE(end.valid_loss);
  ASSERT_EQ(saves.size(), 2u);
  EXPECT_NE(saves[1].find("successfully saved checkpoint from iteration       2"), std::string::npos) << saves[1];
  EXPECT_EQ(verify_checkpoint(save).iteration, 2);
  // The same run without the stop runs to the end and evaluates after it.
  TrainerTinyRun full(6);
  full.t.eval_iters = 1;
  full.t.eval_interval = 10;
  Trainer straight(*full.model, full.t, Batches{full.batches(), full.batches(), full.batches()}, {&full.rec});
  EXPECT_EQ(straight.run().stop.cause, log::StopCause::TrainIters);
  EXPECT_EQ(full.rec.evals.size(), 2u);  // the validation and test splits after training
}

// Each trainer calls only the observers it was given: two trainers in one process, their iterations
// interleaved (one thread each, taking turns per micro-batch), each recorder sees its own run's events only.
TEST(TrainLoop, TwoTrainersInOneProcessReachOnlyTheirOwnObservers) {
  TrainerTinyRun a(3), b(2, 8);
  std::mutex mu;
  std::condition_variable cv;
  int turn = 0;
  bool done[2] = {false, false};
  const auto hand_over = [&](int me) {
    std::unique_lock lock(mu);
    if (!done[1 - me]) turn = 1 - me;
    cv.notify_all();
    cv.wait(lock, [&] { return turn == me || done[1 - me]; });
  };
  const auto run = [&](int me, TrainerTinyRun& r) {
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return turn == me; });
    }
    const BatchFn inner = r.batches();
    Trainer tr(*r.model, r.t,
               Batches{[&, me](int64_t f, int64_t mi, std::span<int32_t> t, std::span<int32_t> l, std::span<int32_t> p) {
                 inner(f, mi, t, l, p);
                 hand_over(me);
               }},
               {r.text.get(), &r.rec});
    tr.run();
    const std::lock_guard lock(mu);
    done[me] = true;
    turn = 1 - me;
    cv.notify_all();
  };
  std::thread ta(run, 0, std::ref(a)), tb(run, 1, std::ref(b));
  ta.join();
  tb.join();
  for (TrainerTinyRun* r : {&a, &b}) {
    SCOPED_TRACE(r == &a ? "a" : "b");
    ASSERT_EQ(r->rec.starts, 1);
    ASSERT_TRUE(r->rec.end);
    EXPECT_EQ(static_cast<int64_t>(r->rec.iterations.size()), r->t.train_iters);
    for (size_t i = 0; i < r->rec.iterations.size(); ++i) {
      EXPECT_EQ(r->rec.iterations[i].iteration, static_cast<int64_t>(i) + 1);
      EXPECT_EQ(r->rec.iterations[i].train_iters, r->t.train_iters);
      EXPECT_EQ(r->rec.iterations[i].global_batch_size, r->t.global_batch_size);
    }
    // 2 lines per iteration (Step Time, iteration) and the memory line, then the end's two lines.
    EXPECT_EQ(static_cast<int64_t>(r->lines.size()), 2 * r->t.train_iters + 1 + 2);
  }
  // The same runs one at a time give the same losses: nothing of one reached the other.
  TrainerTinyRun a2(3), b2(2, 8);
  a2.trainer().run();
  b2.trainer().run();
  EXPECT_EQ(a.rec.loss(), a2.rec.loss());
  EXPECT_EQ(b.rec.loss(), b2.rec.loss());
}

// ---- the binary, end to end ------------------------------------------------------------------

struct Output {
  int status;
  std::string out;
};

Output run_binary(const std::string& args) {
  const std::string cmd = std::string(PL_APP_PATH) + " " + args + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  return {pclose(p), out};
}

TEST(EndToEnd, ThirtyIterationsOfLlamaTinyInMegatronFormat) {
  const Output o = run_binary(
      "--model " PL_CONFIG_DIR "/models/llama_tiny.json --device cpu --disable-fp4 --train-iters 30 "
      "--warmup-iters 2 --global-batch-size 8 --micro-batch-size 2 --seq-length 128");
  ASSERT_EQ(o.status, 0) << o.out;
  // Megatron-Bridge's formats (SPEC-MEGATRON §1a), as a parser of Megatron logs would read them.
  const std::regex step_re(R"(^Step Time : \d+\.\d{2}s GPU utilization: \d+\.\dMODEL_TFLOP/s/GPU$)");
  const std::regex iter_re(
      R"(^ \[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\] iteration +(\d+)/ +30 \| consumed samples: +(\d+) \| )"
      R"(elapsed time per iteration \(ms\): \d+\.\d \| learning rate: \d\.\d{6}E[+-]\d{2} \| )"
      R"(global batch size: +8 \| lm loss: (\d\.\d{6}E[+-]\d{2}) \| loss scale: 1\.0 \| grad norm: \d+\.\d{3} \| )"
      R"(number of skipped iterations: +0 \| number of nan iterations: +0 \|$)");
  const std::regex mem_re(
      R"(^\[Rank 0\] \(after 1 iterations\) memory \(GB\) \| mem-allocated-gigabytes: [\d.e-]+ \| mem-active-gigabytes: )"
      R"([\d.e-]+ \| mem-inactive-gigabytes: [\d.e-]+ \| mem-reserved-gigabytes: [\d.e-]+ \| )"
      R"(mem-max-allocated-gigabytes: [\d.e-]+ \| mem-max-active-gigabytes: [\d.e-]+ \| )"
      R"(mem-max-inactive-gigabytes: [\d.e-]+ \| mem-max-reserved-gigabytes: [\d.e-]+ \| mem-alloc-retires: \d+ \| )"
      R"(mem-allocated-count: \d+$)");
  int steps = 0, iters = 0, mems = 0;
  std::vector<double> losses;
  std::istringstream in(o.out);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (line.starts_with("Step Time")) {
      EXPECT_TRUE(std::regex_match(line, step_re)) << line;
      ++steps;
    } else if (line.find("] iteration ") != std::string::npos) {
      ASSERT_TRUE(std::regex_match(line, m, iter_re)) << line;
      ++iters;
      EXPECT_EQ(std::stoi(m[1]), iters);
      EXPECT_EQ(std::stoll(m[2]), 8LL * iters);
      losses.push_back(std::stod(m[3]));
    } else if (line.starts_with("[Rank")) {
      EXPECT_TRUE(std::regex_match(line, mem_re)) << line;
      ++mems;
    }
  }
  EXPECT_EQ(steps, 30);
  EXPECT_EQ(iters, 30);
  EXPECT_EQ(mems, 1);
  ASSERT_EQ(losses.size(), 30u);
  EXPECT_LT(losses.back(), 0.5 * losses.front()) << "first " << losses.front() << " last " << losses.back();
}

// --deterministic-mode, --cuda-sync-every-launch and --quantize-kernels are GPU switches: on the CPU the log is the same
// line for line (timings and timestamps aside) and the losses and grad norms are the same numbers.
TEST(EndToEnd, GpuSwitchesLeaveTheCpuLogUnchanged) {
  const std::string base = "--model " PL_CONFIG_DIR "/models/llama_tiny.json --device cpu --disable-fp4 --train-iters 3 "
                           "--global-batch-size 8 --micro-batch-size 2 --seq-length 32 --threads 1";
  const Output a = run_binary(base);
  const Output b = run_binary(base + " --deterministic-mode --cuda-sync-every-launch --quantize-kernels reference");
  ASSERT_EQ(a.status, 0) << a.out;
  ASSERT_EQ(b.status, 0) << b.out;
  // Drop what varies from run to run: timestamps, times, throughput, the run's own command line.
  auto normalize = [](const std::string& out) {
    static const std::regex varying(R"(\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\]|\d+\.\d+ ?(ms|s\b|MODEL_TFLOP)|)"
                                    R"(elapsed time per iteration \(ms\): [\d.]+|Step Time : [\d.]+s|\d+ tokens/s|[\d.e+-]+ GB/s|)"
                                    R"(mem-[a-z-]+: [\d.e-]+|in \d+ ms)");
    std::vector<std::string> lines;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) lines.push_back(std::regex_replace(line, varying, "#"));
    return lines;
  };
  const std::vector<std::string> la = normalize(a.out), lb = normalize(b.out);
  ASSERT_EQ(la.size(), lb.size()) << a.out << "\n----\n" << b.out;
  int loss_lines = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    EXPECT_EQ(la[i], lb[i]) << "line " << i;
    loss_lines += la[i].find("lm loss: ") != std::string::npos;
  }
  EXPECT_EQ(loss_lines, 3);
}

}  // namespace
}  // namespace pl
