#pragma once
// --tensorboard-dir: Megatron-LM's TensorBoard scalars (megatron/training/training.py: training_log and
// evaluate_and_print_results; megatron/core/timers.py: Timers.write), from the run's records, through one
// event file writer (log/tensorboard.h) on the last rank, as Megatron's global_vars._set_tensorboard_writer.
// The step is the iteration; each "X vs samples" is X at step = consumed training samples.
//  Every --tensorboard-log-interval iterations: learning-rate, batch-size, lm loss (the iteration's own, as
//    Megatron's loss_dict, written for a skipped step too: with --log-interval > 1 the log line prints the
//    interval's mean of the steps taken instead),
//    loss-scale (unless --no-log-loss-scale-to-tensorboard), world-size (--log-world-size-to-tensorboard),
//    grad-norm (not for a skipped step: Megatron's optimizer returns None there), each with its "vs samples";
//    with --log-memory-to-tensorboard mem-reserved-bytes, mem-allocated-bytes, mem-max-allocated-bytes,
//    mem-allocated-count (the writer rank's).
//  Every --log-interval (with the log line): iteration-time (s), throughput (TFLOP/s/GPU, the Step Time
//    line's) and throughput/tokens_per_sec (Megatron-Bridge's tag, train_utils.py report_throughput; Megatron
//    has no tokens/s scalar). Megatron writes the first two only with --log-timers-to-tensorboard (and
//    --log-throughput); here always, since the log always prints them. With --log-timers-to-tensorboard,
//    each timer of --timing-log-level as "<name>-time": the max over ranks, in seconds per iteration
//    (Timers.write; the log prints ms).
//  Each evaluation: lm loss validation (+ vs samples), and lm loss validation ppl (+ vs samples) with
//    --log-validation-ppl-to-tensorboard; PPL = exp(min(20, loss)) as the log. The test split after
//    training goes to "lm loss test" (and ppl): Megatron writes it under the validation tag, which would put
//    the test loss on the validation curve.
// The file is flushed after each log interval and each evaluation, and closed (bounded wait) at the end,
// with a line saying how many scalars it holds.
#include <cstdint>
#include <string>

#include "log/tensorboard.h"
#include "observe/megatron_text_log.h"

namespace pl::observe {

// Megatron's flags (megatron/training/arguments.py). --tensorboard-queue-size: Megatron passes it to
// SummaryWriter's max_queue (events held before an add forces a write); here the capacity of the writer
// thread's queue, in scalars, beyond which new scalars are dropped (counted, one warning) rather than
// training waiting on the disk.
struct TensorBoardConfig {
  std::string dir;  // --tensorboard-dir ("" = off)
  int64_t log_interval = 1;
  int64_t queue_size = 1000;
  bool log_timers = false;
  bool log_loss_scale = true;  // --no-log-loss-scale-to-tensorboard turns it off
  bool log_validation_ppl = false;
  bool log_memory = false;
  bool log_world_size = false;
};

class TensorBoardLog : public TrainObserver {
 public:
  // Creates cfg.dir and the events file now (one-line error naming --tensorboard-dir); `note` gets the
  // writer's warnings and the closing line.
  TensorBoardLog(const TensorBoardConfig& cfg, log::NoteFn note);
  // A run that fails before its first record (a bad --data-path, a checkpoint refused) leaves nothing behind:
  // the events file, and the directories made for it, are removed.
  ~TensorBoardLog() override;
  TensorBoardLog(const TensorBoardLog&) = delete;
  TensorBoardLog& operator=(const TensorBoardLog&) = delete;
  const std::string& path() const { return writer_.path(); }
  void on_iteration(const log::IterationRecord& it) override;
  void on_interval(const log::IntervalRecord& r) override;
  void on_eval(const log::EvalRecord& e) override;
  void on_downstream_eval(const log::DownstreamEvalRecord& r) override;
  void on_end(const log::RunEnd&) override;
  // Closes the file and returns its summary ("tensorboard: N scalars written to FILE[, M dropped]").
  std::string close(double timeout_s = 10.0);

 private:
  void pair(const std::string& tag, double value, int64_t iteration, int64_t consumed_samples);
  TensorBoardConfig cfg_;
  log::NoteFn note_;
  log::EventFileWriter writer_;
  bool reached_a_record_ = false;  // an iteration, an evaluation or the run's end came: the file is kept
};

}  // namespace pl::observe
