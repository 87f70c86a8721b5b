#pragma once
// The training loop: micro-batch gradient accumulation with Megatron's loss averaging (per micro-batch over
// its counted tokens, or per token over the global batch with --calculate-per-token-loss), AdamW with
// clipping, the sample-based LR schedule, NaN/Inf skipping, and the Megatron log lines.
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cmath>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "config/train_config.h"
#include "core/timers.h"
#include "log/megatron_log.h"
#include "log/tensorboard.h"
#include "parallel/communicator.h"
#include "parallel/world.h"
#include "model/llama.h"
#include "roofline/report.h"
#include "train/gradient_sync.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"

namespace pl {

// Fills tokens/labels (micro_batch*seq ids each) for micro-batch `micro` (0-based) of the global
// batch whose first sample is `first_sample` (the samples consumed before it), as Megatron's
// MegatronPretrainingSampler orders them: samples first_sample + micro*micro_batch + [0, micro_batch).
// `positions` has micro_batch*seq entries when the model's packing takes explicit documents (SFT packs:
// each token's position in its example, data/documents.h), and is empty otherwise.
using BatchFn = std::function<void(int64_t first_sample, int64_t micro, std::span<int32_t> tokens,
                                   std::span<int32_t> labels, std::span<int32_t> positions)>;
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
// --roofline: the op rows measured over the window so far; `final` at the end of the run (before the
// final evaluation), otherwise at a --log-interval (--roofline-at-log-interval).
using RooflineFn = std::function<void(const roofline::Measurement& m, bool final)>;
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
  int stop_signal = 0;               // the signal that stopped the run early (set_stop_flag), or 0
  TrainState state;                  // after the last iteration
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
// gradient norm are sums over all ranks, the NaN skip is decided on them (so on every rank alike). The
// lines are printed by the rank Megatron prints them from: the iteration, timer and validation lines by
// the last rank (print_rank_last), the memory line by rank 0 (report_memory on data-parallel rank 0).
class Trainer {
 public:
  Trainer(LlamaModel& model, const TrainConfig& cfg, BatchFn batches, LineFn out, EvalData eval = {},
          CheckpointFn checkpoint = {}, DataParallelRanks ranks = {});
  // Runs iterations start.iteration+1 .. cfg.train_iters, or stops after the first one divisible by
  // cfg.exit_interval (then, as Megatron's train() exits, without the final evaluation). Throws
  // pl::Error when max_consecutive_nan_iterations consecutive iterations had a non-finite loss or
  // gradient norm.
  TrainResult run(const TrainState& start = {});
  // The optimizer's moments and step count, for checkpoints. With --overlap-cpu-optimizer-d2h-h2d its host
  // step, and with --overlap-param-gather the weights' all-gather, may still run beside the next forward:
  // both are finished first (a save reads the weights, the masters and the moments). The checkpoint
  // callback runs after every iteration, so only a save that happens asks for it and the overlap survives
  // the iterations that save nothing.
  AdamW& optimizer() {
    sync_.finish_weight_gather();
    opt_.finish_host_step();
    return opt_;
  }
  size_t gradient_buckets() const { return sync_.bucket_count(); }
  // Megatron's --exit-signal-handler: *flag (set by a signal handler to the signal's number) is read after
  // every iteration (on every rank; any rank's signal counts, so all stop together); when set, that
  // iteration is the last: the checkpoint callback runs with last = true, a line says why, and run()
  // returns without the final evaluation (as an --exit-interval stop). Null: signals are not watched.
  void set_stop_flag(const volatile std::sig_atomic_t* flag) { stop_flag_ = flag; }
  // --roofline: receives the measurement (see RooflineFn). The window of iterations it covers: Megatron's
  // --profile window when --profile is given, else every iteration this process runs but its first (which
  // builds plans and warms caches) unless it runs only one.
  void set_roofline_listener(RooflineFn fn) { roofline_ = std::move(fn); }
  // --exit-duration-in-mins counts from here (default: the trainer's construction); the app passes the
  // time its process started, as Megatron's _TRAIN_START_TIME.
  void set_start_time(std::chrono::steady_clock::time_point t) { start_time_ = t; }
  // --tensorboard-dir: the writer (the app gives it to the last rank only, Megatron's writer rank) gets each
  // iteration's values, each log interval's and each evaluation's, the very numbers the log lines print.
  void set_tensorboard(log::TensorBoardLog* tensorboard) { tensorboard_ = tensorboard; }

 private:
  struct RunState;  // one run()'s loop state (trainer.cpp)
  int64_t step(RunState& r);
  double forward_backward(RunState& r);
  float loss_gradient_scale(int64_t counted, double global_tokens) const;
  double global_batch_tokens(RunState& r);
  AdamW::Result optimizer_step(RunState& r, double loss, double lr);
  void log_interval(RunState& r, int64_t iteration);
  void tensorboard_iteration(const RunState& r, int64_t iteration) const;
  bool measured_by_roofline(const RunState& r, int64_t iteration) const;
  void report_roofline(RunState& r, bool final);
  void profile_window(int64_t completed, bool before_step) const;
  // --quant-stats-interval: the iteration's last backward collects quantization telemetry.
  bool quant_stats_at(int64_t iteration) const {
    return cfg_.quant_stats_interval > 0 && iteration % cfg_.quant_stats_interval == 0;
  }
  bool after_iteration(RunState& r, int64_t iteration);
  int signal_seen() const;
  double exit_duration_minutes() const;
  void log_quant_stats(int64_t iteration);
  std::string host_optimizer_line(int64_t iterations);
  std::vector<log::TimerOverRanks> timers_over_ranks(std::span<const TimerReading> mine) const;
  // eval_iters global batches of `data` from sample `first_sample`, forward only; prints Megatron's
  // validation lines and returns the token-weighted mean loss.
  double evaluate(const std::string& prefix, const BatchFn& data, int64_t first_sample);
  bool validation_on() const { return cfg_.eval_iters > 0 && static_cast<bool>(eval_.valid); }
  // Megatron's print_rank_last.
  void print_last(const std::string& line) const {
    if (world_->rank() == world_->size() - 1) out_(line);
  }
  LlamaModel& model_;
  TrainConfig cfg_;
  BatchFn batches_;
  LineFn out_;
  EvalData eval_;
  CheckpointFn checkpoint_;
  std::unique_ptr<parallel::World> own_world_;
  std::unique_ptr<parallel::Communicator> own_comm_;
  const parallel::World* world_;
  parallel::Communicator* comm_;
  AdamW opt_;
  GradientSync sync_;
  const volatile std::sig_atomic_t* stop_flag_ = nullptr;
  RooflineFn roofline_;
  log::TensorBoardLog* tensorboard_ = nullptr;
  LrSchedule schedule_;
  std::chrono::steady_clock::time_point start_time_;
};

}  // namespace pl
