#pragma once
// The loop's position: everything of the loop, besides the model and optimizer buffers, that a resumed
// run needs to print the same lines as a run that never stopped (timings aside). A checkpoint stores it.
#include <cstdint>

namespace pl {

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

}  // namespace pl
