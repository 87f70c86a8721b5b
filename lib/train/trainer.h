#pragma once
// The training loop: micro-batch gradient accumulation with Megatron's loss averaging (per micro-batch over
// its counted tokens, or per token over the global batch with --calculate-per-token-loss), AdamW with
// clipping, the sample-based LR schedule, NaN/Inf skipping, and evaluation. Everything it reports goes to
// its observers (train/observer.h) as records (log/run_records.h): the trainer prints nothing itself.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "config/train_config.h"
#include "log/run_records.h"
#include "model/llama.h"
#include "parallel/communicator.h"
#include "parallel/world.h"
#include "train/gradient_sync.h"
#include "train/lr_schedule.h"
#include "train/observer.h"
#include "train/optimizer.h"
#include "train/train_state.h"

namespace pl {

// Fills tokens/labels (micro_batch*seq ids each) for micro-batch `micro` (0-based) of the global
// batch whose first sample is `first_sample` (the samples consumed before it), as Megatron's
// MegatronPretrainingSampler orders them: samples first_sample + micro*micro_batch + [0, micro_batch).
// `positions` has micro_batch*seq entries when the model's packing takes explicit documents (SFT packs:
// each token's position in its example, data/documents.h), and is empty otherwise. The ids are checked
// where the batch is built (data::TrainingData::micro_batch names the sample of an id outside the vocabulary).
using BatchFn = std::function<void(int64_t first_sample, int64_t micro, std::span<int32_t> tokens,
                                   std::span<int32_t> labels, std::span<int32_t> positions)>;
// The splits a run reads: training, and for evaluation validation and test (an empty function: the split
// has no data).
struct Batches {
  BatchFn train = {};
  BatchFn valid = {};
  BatchFn test = {};
};

// The ranks a trainer runs over (data parallelism; the app's World and its Communicator). Both null: one
// rank (the trainer makes its own one-rank world and communicator).
struct DataParallelRanks {
  const parallel::World* world = nullptr;
  parallel::Communicator* comm = nullptr;
};

// With data parallelism (cfg.data_parallel_size = the world's size) every rank runs this loop in step:
// rank r's micro-batch m of an iteration holds the samples Megatron's MegatronPretrainingSampler gives it
// (megatron/legacy/data/data_samplers.py: the sampler collects micro_batch_size x dp consecutive sample
// indices from consumed_samples on and yields slice [r * micro_batch_size, (r + 1) * micro_batch_size) of
// them), i.e. global micro-batch m * dp + r of the one-rank order, with that micro-batch's stochastic-rounding
// counter; so the ranks together compute exactly the one-rank run's micro-batches. The loss and the
// gradient norm are sums over all ranks, the NaN skip is decided on them (so on every rank alike), and the
// timer readings are gathered at the last rank (which prints them, Megatron's print_rank_last).
class Trainer : private TrainerAccess {
 public:
  // The observers are called in this order at every event (train/observer.h) and must outlive the trainer.
  Trainer(LlamaModel& model, const TrainConfig& cfg, Batches batches, std::vector<TrainObserver*> observers = {},
          DataParallelRanks ranks = {});
  // Runs iterations start.iteration+1 .. cfg.train_iters, or stops after the first iteration an observer asks
  // it to (then, as Megatron's train() exits, without the evaluations after training). An observer's
  // pl::Error (e.g. too many consecutive non-finite iterations) ends it.
  log::RunEnd run(const TrainState& start = {});
  // The loop state after the last iteration run() ran.
  const TrainState& state() const { return state_; }
  // The optimizer's moments and step count, for checkpoints. With --overlap-cpu-optimizer-d2h-h2d its host
  // step, and with --overlap-param-gather the weights' all-gather, may still run beside the next forward:
  // both are finished first (a save reads the weights, the masters and the moments).
  AdamW& optimizer() { return settled_optimizer(); }
  size_t gradient_buckets() const { return sync_.bucket_count(); }

 private:
  struct RunState;  // one run()'s loop state (trainer.cpp)
  LlamaModel& model() override { return model_; }
  AdamW& settled_optimizer() override;
  log::IterationRecord step(RunState& r);
  // Returns the reported loss; `loss_tokens` receives the tokens counted in it over the global batch.
  double forward_backward(RunState& r, bool quant_stats, double& loss_tokens);
  float loss_gradient_scale(int64_t counted, double global_tokens) const;
  double global_batch_tokens(RunState& r);
  AdamW::Result optimizer_step(RunState& r, double loss, double lr);
  log::IntervalRecord interval_record(RunState& r, const log::IterationRecord& it);
  double evaluate(const BatchFn& data, int64_t first_sample);  // train/evaluation.h
  void evaluate_after_training(RunState& r, log::RunEnd& end);
  bool validation_on() const { return cfg_.eval_iters > 0 && static_cast<bool>(batches_.valid); }
  log::StopRequest stop_requested(const log::IterationRecord& it);
  template <class Event>
  void notify(Event&& event) {
    for (TrainObserver* o : observers_) event(*o);
  }

  LlamaModel& model_;
  TrainConfig cfg_;
  Batches batches_;
  std::vector<TrainObserver*> observers_;
  Instruments instruments_;  // what the observers need measured, combined
  std::unique_ptr<parallel::World> own_world_;
  std::unique_ptr<parallel::Communicator> own_comm_;
  const parallel::World* world_;
  parallel::Communicator* comm_;
  AdamW opt_;
  GradientSync sync_;
  LrSchedule schedule_;
  TrainState state_;
};

}  // namespace pl
