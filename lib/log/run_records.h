#pragma once
// What a training run reports: one record per event, the same record for every output. The trainer
// (train/trainer.h) fills them and hands them to its observers (train/observer.h); the Megatron text log,
// TensorBoard, the JSON-lines log, the roofline and the checkpoints each read what they need from them.
// Plain values: no device, no model, so every output formats them without knowing how they were measured.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/memory_stats.h"

namespace pl::log {

// One iteration, as its step ended (before its log interval, evaluation and stop check).
struct IterationRecord {
  int64_t iteration = 0;          // 1-based
  int64_t train_iters = 0;
  int64_t consumed_samples = 0;   // after this iteration
  int64_t global_batch_size = 0;
  int64_t world_size = 1;
  double lm_loss = 0.0;           // the token-weighted mean over the global batch; NaN when it was not finite
  double loss_tokens = -1.0;      // the tokens counted in it, over the global batch (0: every label masked; -1: not known)
  double lr_used = 0.0;           // the learning rate this step used
  double learning_rate = 0.0;     // the rate the next step uses (the Megatron line prints this one)
  double grad_norm = 0.0;         // NaN when the step was skipped
  double loss_scale = 1.0;
  bool skipped = false;           // a non-finite loss or gradient norm: no update (Megatron's skipped and nan)
  int64_t consecutive_nan = 0;    // skipped iterations in a row, this one included
  double seconds = 0.0;           // the step's wall time (CUDA events on the GPU)
  double tflops_per_gpu = 0.0;    // Megatron's model FLOPs of one iteration / seconds / data-parallel ranks
  double tokens_per_second = 0.0; // every rank's tokens
  MemoryStats memory;             // this rank's, after the step
};

// Every rank's reading of one of Megatron's timers (core/timers.h), in ms per iteration.
struct TimerOverRanks {
  const char* name;
  std::vector<std::pair<int, double>> rank_ms;  // (rank, ms per iteration)
};

// The AdamW on the host (--optimizer-cpu-offload) over the interval: its time and the bytes it moved.
struct HostOptimizerReading {
  double seconds = 0.0, bytes = 0.0;
  bool overlapped = false;  // --overlap-cpu-optimizer-d2h-h2d: the host step runs beside the next forward
};

// One Megatron log interval (every --log-interval iterations, and the last iteration): the numbers of its
// Step Time, iteration and timer lines.
struct IntervalRecord {
  int64_t iteration = 0;
  int64_t train_iters = 0;
  int64_t consumed_samples = 0;
  int64_t global_batch_size = 0;
  int64_t iterations = 0;                // timed in this interval (= --log-interval but for a short last one)
  double seconds_per_iteration = 0.0;    // the interval's mean
  double tflops_per_gpu = 0.0;
  double tokens_per_second = 0.0;        // every rank's tokens
  double learning_rate = 0.0;            // the rate the next step uses
  std::optional<double> lm_loss;         // the mean of the interval's steps taken; absent when all were skipped
  double loss_scale = 1.0;
  double grad_norm = 0.0;                // the last iteration's (NaN when it was skipped)
  std::optional<double> params_norm;     // --log-params-norm: the master weights' norm after the last step
  int64_t skipped_iterations = 0;        // in this interval
  int64_t nan_iterations = 0;            // in this interval
  std::vector<TimerOverRanks> timers;    // at the last rank (which prints them): --timing-log-level's, every rank's
  std::optional<HostOptimizerReading> host_optimizer;  // --optimizer-cpu-offload at --timing-log-level 2
  MemoryStats memory;                    // this rank's
};

// One evaluation: every --eval-interval iterations, and the validation and test splits after training.
struct EvalRecord {
  int64_t iteration = 0;
  int64_t consumed_samples = 0;  // the training samples consumed so far
  bool test_split = false;       // the test split (after training); else the validation split
  bool after_training = false;
  double lm_loss = 0.0;          // the token-weighted mean over eval_iters global batches
};

// One downstream evaluation (--downstream-eval, issue 43): each task's lm-eval accuracies at an iteration
// (lib/eval: multiple-choice scoring as lm-evaluation-harness 0.4).
struct DownstreamTaskScore {
  std::string task, format;  // the file's stem; hellaswag, arc, piqa, winogrande, mmlu, generic
  int64_t documents = 0, num_fewshot = 0;
  bool has_acc_norm = false;  // lm-eval reports acc_norm for this format
  double acc = 0.0, acc_stderr = 0.0, acc_norm = 0.0, acc_norm_stderr = 0.0;  // stderr NaN below 2 documents
};
struct DownstreamEvalRecord {
  int64_t iteration = 0;
  int64_t consumed_samples = 0;
  bool after_training = false;  // the run's last iteration
  std::string forward;          // how the scores were computed ("bf16 (every linear in BF16)")
  double seconds = 0.0;         // the evaluation's wall time (outside the iteration's time)
  std::vector<DownstreamTaskScore> tasks;
};

// Why a run stops: --train-iters reached, or earlier after the iteration an observer chose.
enum class StopCause { TrainIters, ExitInterval, Signal, ExitDuration, Observer };
const char* stop_cause_name(StopCause c);  // "train_iters", "exit_interval", "signal", "exit_duration", "observer"
// "SIGTERM", "SIGINT", ..., or "signal N".
std::string signal_name(int sig);

// A request to make the current iteration the last (train/observer.h stop_requested).
struct StopRequest {
  StopCause cause = StopCause::TrainIters;  // TrainIters: no request
  int signal = 0;          // StopCause::Signal
  double minutes = 0.0;    // StopCause::ExitDuration: this rank's minutes since the program started
  explicit operator bool() const { return cause != StopCause::TrainIters; }
};

// The run as it ended: its summary line's figures (the last 60% of the iterations this process ran, as the
// playbook reports iterations 20-50 of 50; a resumed run times only its own).
struct RunEnd {
  int64_t first_iteration = 1;  // the first iteration this process ran (1-based)
  int64_t last_iteration = 0;   // the iterations completed (the checkpoint's on a run that ran none)
  int64_t train_iters = 0;
  int64_t global_batch_size = 0, seq_length = 0, data_parallel_size = 1;
  StopRequest stop;             // why it ended
  int64_t summary_first = 0, summary_last = 0;  // the range of the means (0: no iteration ran)
  double mean_seconds = 0.0;
  double mean_tflops = 0.0;     // per GPU
  double final_loss = 0.0;      // the last iteration's lm loss (NaN when it was not finite)
  int64_t nan_iterations = 0;   // over the run, restored ones included
  std::optional<double> valid_loss, test_loss;  // the evaluations after training
  size_t allocations_in_loop = 0;  // allocator calls made after the first iteration (must be 0)
  MemoryStats memory;           // this rank's, at the end
  bool ran() const { return summary_last > 0; }
  // Tokens per second over the summary's iterations, of every rank.
  double tokens_per_second() const {
    return static_cast<double>(global_batch_size * seq_length) / mean_seconds;
  }
};

}  // namespace pl::log
