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

struct TrainResult {
  std::vector<double> loss;          // per iteration (NaN if that iteration's loss was not finite)
  std::vector<double> grad_norm;     // per iteration
  std::vector<double> seconds;       // wall time per iteration
  std::vector<double> lr_used;       // learning rate each step used
  std::vector<std::pair<int64_t, double>> valid_loss;  // (iteration, lm loss) of each in-loop evaluation
  double final_valid_loss = std::nan("");  // after training ("on validation set"); NaN if not run
  double final_test_loss = std::nan("");   // after training ("on test set"); NaN if not run
  int64_t nan_iterations = 0;        // total
  size_t allocations_in_loop = 0;    // allocator calls made after iteration 1 (must be 0)
  double mean_seconds = 0.0;         // over the summary range
  double mean_tflops = 0.0;
  int64_t summary_first = 0, summary_last = 0;  // 1-based iteration range of the means
};

class Trainer {
 public:
  Trainer(LlamaModel& model, const TrainConfig& cfg, BatchFn batches, LineFn out, EvalData eval = {});
  // Runs cfg.train_iters iterations. Throws pl::Error when max_consecutive_nan_iterations
  // consecutive iterations had a non-finite loss or gradient norm.
  TrainResult run();

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
  AdamW opt_;
  LrSchedule schedule_;
};

}  // namespace pl
