#pragma once
// The training loop: micro-batch gradient accumulation with Megatron's loss averaging, AdamW with
// clipping, the sample-based LR schedule, NaN/Inf skipping, and the Megatron log lines.
#include <cstdint>
#include <cmath>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "config/train_config.h"
#include "model/llama.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"

namespace pl {

// Fills tokens/labels (micro_batch*seq ids each) for micro-batch `micro` (0-based) of the global
// batch whose first sample is `first_sample` (the samples consumed before it), as Megatron's
// MegatronPretrainingSampler orders them: samples first_sample + micro*micro_batch + [0, micro_batch).
using BatchFn = std::function<void(int64_t first_sample, int64_t micro, std::span<int32_t> tokens,
                                   std::span<int32_t> labels)>;
// The validation and test splits for evaluation; an empty function means the split has no data.
struct EvalData {
  BatchFn valid;
  BatchFn test;
};
// Receives each output line (without newline).
using LineFn = std::function<void(const std::string&)>;

// Everything of the loop, besides the model and optimizer buffers, that a resumed run needs to
// print the same lines as a run that never stopped (timings aside). A checkpoint stores it.
struct TrainState {
  int64_t iteration = 0;               // iterations completed
  int64_t consumed_samples = 0;        // the log's "consumed samples" and the data position
  int64_t scheduler_samples = 0;       // LR scheduler position: advances only on successful steps
  int64_t micro_batches_done = 0;      // stochastic-rounding counter of the next micro-batch
  int64_t valid_consumed_samples = 0;  // where the next validation reads (Megatron's consumed_valid_samples)
  int64_t nan_iterations = 0;          // total over the run
  int64_t consecutive_nan = 0;
  // The current log interval's accumulators (not yet printed when the checkpoint falls inside one).
  double interval_loss = 0.0;
  int64_t interval_iters = 0, interval_good = 0, interval_skipped = 0, interval_nan = 0;
};
// Called after each iteration (after its log line and validation) with the state after it; `last`
// is true for the last iteration this process runs (--train-iters or --exit-interval reached).
using CheckpointFn = std::function<void(const TrainState& state, bool last)>;

struct TrainResult {
  std::vector<double> loss;          // per iteration (NaN if that iteration's loss was not finite)
  std::vector<double> grad_norm;     // per iteration
  std::vector<double> seconds;       // wall time per iteration
  std::vector<double> lr_used;       // learning rate each step used
  std::vector<std::pair<int64_t, double>> valid_loss;  // (iteration, lm loss) of each in-loop evaluation
  double final_valid_loss = std::nan("");  // after training ("on validation set"); NaN if not run
  double final_test_loss = std::nan("");   // after training ("on test set"); NaN if not run
  int64_t first_iteration = 1;       // 1-based number of the first iteration this process ran
  int64_t nan_iterations = 0;        // total over the run (restored ones included)
  size_t allocations_in_loop = 0;    // allocator calls made after iteration 1 (must be 0)
  double mean_seconds = 0.0;         // over the summary range
  double mean_tflops = 0.0;
  int64_t summary_first = 0, summary_last = 0;  // 1-based iteration range of the means (ran here)
  TrainState state;                  // after the last iteration
};

class Trainer {
 public:
  Trainer(LlamaModel& model, const TrainConfig& cfg, BatchFn batches, LineFn out, EvalData eval = {},
          CheckpointFn checkpoint = {});
  // Runs iterations start.iteration+1 .. cfg.train_iters, or stops after the first one divisible by
  // cfg.exit_interval (then, as Megatron's train() exits, without the final evaluation). Throws
  // pl::Error when max_consecutive_nan_iterations consecutive iterations had a non-finite loss or
  // gradient norm.
  TrainResult run(const TrainState& start = {});
  // The optimizer's moments and step count, for checkpoints.
  AdamW& optimizer() { return opt_; }

 private:
  void log_quant_stats(int64_t iteration);
  // eval_iters global batches of `data` from sample `first_sample`, forward only; prints Megatron's
  // validation lines and returns the token-weighted mean loss.
  double evaluate(const std::string& prefix, const BatchFn& data, int64_t first_sample);
  bool validation_on() const { return cfg_.eval_iters > 0 && static_cast<bool>(eval_.valid); }
  LlamaModel& model_;
  TrainConfig cfg_;
  BatchFn batches_;
  LineFn out_;
  EvalData eval_;
  CheckpointFn checkpoint_;
  AdamW opt_;
  LrSchedule schedule_;
};

}  // namespace pl
