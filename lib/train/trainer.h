#pragma once
// The training loop: micro-batch gradient accumulation with Megatron's loss averaging, AdamW with
// clipping, the sample-based LR schedule, NaN/Inf skipping, and the Megatron log lines.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "config/train_config.h"
#include "model/llama.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"

namespace pl {

// Fills tokens/labels (micro_batch*seq ids each) for micro-batch `micro` of iteration `iteration`
// (both 0-based) in the sampler's order.
using BatchFn = std::function<void(int64_t iteration, int64_t micro, std::span<int32_t> tokens,
                                   std::span<int32_t> labels)>;
// Receives each output line (without newline).
using LineFn = std::function<void(const std::string&)>;

struct TrainResult {
  std::vector<double> loss;          // per iteration (NaN if that iteration's loss was not finite)
  std::vector<double> grad_norm;     // per iteration
  std::vector<double> seconds;       // wall time per iteration
  std::vector<double> lr_used;       // learning rate each step used
  int64_t nan_iterations = 0;        // total
  size_t allocations_in_loop = 0;    // allocator calls made after iteration 1 (must be 0)
  double mean_seconds = 0.0;         // over the summary range
  double mean_tflops = 0.0;
  int64_t summary_first = 0, summary_last = 0;  // 1-based iteration range of the means
};

class Trainer {
 public:
  Trainer(LlamaModel& model, const TrainConfig& cfg, BatchFn batches, LineFn out);
  // Runs cfg.train_iters iterations. Throws pl::Error when max_consecutive_nan_iterations
  // consecutive iterations had a non-finite loss or gradient norm.
  TrainResult run();

 private:
  void log_quant_stats(int64_t iteration);
  LlamaModel& model_;
  TrainConfig cfg_;
  BatchFn batches_;
  LineFn out_;
  AdamW opt_;
  LrSchedule schedule_;
};

}  // namespace pl
