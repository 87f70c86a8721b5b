#pragma once
// What one Trainer::run() counts besides the model and the optimizer, and the records built from it: the loop
// state a checkpoint saves (TrainState: iterations, samples, the open log interval's sums), the step times
// this process measured (timings are not state: the first interval after a resume times only this process's
// iterations), and the numbers of each iteration, log interval and of the whole run (log/run_records.h).
#include <cstdint>
#include <vector>

#include "config/train_config.h"
#include "core/memory_stats.h"
#include "log/run_records.h"
#include "train/train_state.h"

namespace pl {

// One finished step, as the trainer saw it.
struct StepOutcome {
  double loss = 0.0;        // the token-weighted mean over the global batch (may be non-finite)
  double loss_tokens = -1.0; // the tokens counted in it (all ranks; -1: not known, as IterationRecord's)
  double grad_norm = 0.0;   // NaN when skipped
  bool skipped = false;     // non-finite loss or gradient norm: no update
  double lr_used = 0.0;     // the rate the step used
  double lr_next = 0.0;     // the rate the next step uses
  double seconds = 0.0;
};

class RunTally {
 public:
  // iter_flops: Megatron's model FLOPs of one iteration (all ranks).
  RunTally(const TrainConfig& cfg, const TrainState& start, double iter_flops, int64_t world_size);
  TrainState& state() { return st_; }
  const TrainState& state() const { return st_; }
  int64_t first_iteration() const { return first_iteration_; }
  // Counts one step (the iteration, the interval's sums, the NaN counters) and returns its record.
  log::IterationRecord count_step(const StepOutcome& s, const MemoryStats& memory);
  // The open log interval's means and counts (the trainer adds its timers, params norm and host optimizer
  // work), then the interval's sums start again.
  log::IntervalRecord close_interval(const log::IterationRecord& last, const MemoryStats& memory);
  // The run as it ended: the summary's means over the last 60% of the iterations run here (the playbook reports
  // iterations 20-50 of 50).
  log::RunEnd end(const log::StopRequest& stop, const MemoryStats& memory, size_t allocations_in_loop) const;
  bool ran_any() const { return !seconds_.empty(); }

 private:
  double tflops_per_gpu(double seconds) const;
  double tokens_per_second(double seconds) const;
  TrainConfig cfg_;
  TrainState st_;
  double iter_flops_;
  int64_t world_size_;
  int64_t first_iteration_;
  std::vector<double> seconds_;  // per iteration run here
  double last_loss_;
  double interval_seconds_ = 0.0;
  int64_t interval_timed_ = 0;
};

}  // namespace pl
