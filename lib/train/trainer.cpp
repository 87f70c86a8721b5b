#include "train/trainer.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>

#include "core/error.h"
#include "core/step_timer.h"
#include "log/megatron_log.h"
#include "model/accounting.h"

namespace pl {

Trainer::Trainer(LlamaModel& model, const TrainConfig& cfg, BatchFn batches, LineFn out, EvalData eval)
    : model_(model),
      cfg_(cfg),
      batches_(std::move(batches)),
      out_(std::move(out)),
      eval_(std::move(eval)),
      opt_(model, OptimizerConfig{}),
      schedule_(LrSchedule::from_iterations(cfg.lr, cfg.min_lr, cfg.warmup_iters, cfg.train_iters,
                                            cfg.global_batch_size)) {
  validate_train_config(cfg_);
  PL_CHECK(model.tokens_per_micro_batch() == cfg.micro_batch_size * cfg.seq_length,
           "internal: model built for {} tokens per micro-batch, trainer needs {}", model.tokens_per_micro_batch(),
           cfg.micro_batch_size * cfg.seq_length);
}

void Trainer::log_quant_stats(int64_t iteration) {
  for (const LinearStats& ls : model_.quant_stats())
    for (const OperandStats& o : ls.operands)
      out_(fmt::format("quant stats | iteration {:8d} | layer {:3d} {:<11} | {:<13} | {:<8} | amax {:.6E} | saturated "
                       "{:.6f} | underflow blocks {:.6f} | rel error {:.6f}",
                       iteration, ls.layer, ls.linear, o.operand, quant_format_name(o.format), o.stats.amax,
                       o.stats.saturated_fraction, o.stats.underflow_fraction, o.stats.relative_error));
}

double Trainer::evaluate(const std::string& prefix, const BatchFn& data, int64_t first_sample) {
  const int64_t T = model_.tokens_per_micro_batch();
  const int64_t M = cfg_.num_micro_batches();
  std::vector<int32_t> tokens(static_cast<size_t>(T)), labels(static_cast<size_t>(T));
  // Megatron's evaluate sums every micro-batch's [loss sum, token count] over eval_iters batches and
  // reports sum / count.
  double loss_sum = 0.0;
  for (int64_t e = 0; e < cfg_.eval_iters; ++e)
    for (int64_t m = 0; m < M; ++m) {
      data(first_sample + e * cfg_.global_batch_size, m, tokens, labels);
      loss_sum += model_.forward(tokens.data(), labels.data());
    }
  const double loss = loss_sum / (static_cast<double>(T) * static_cast<double>(M * cfg_.eval_iters));
  for (const std::string& line : log::validation_lines(prefix, loss)) out_(line);
  return loss;
}

TrainResult Trainer::run() {
  StepTimer timer(model_.context().device);
  const int64_t T = model_.tokens_per_micro_batch();
  const int64_t M = cfg_.num_micro_batches();
  const double iter_flops = flops_per_iteration(model_.config(), cfg_.global_batch_size, cfg_.seq_length);
  std::vector<int32_t> tokens(static_cast<size_t>(T)), labels(static_cast<size_t>(T));
  // Megatron's backward: each micro-batch's mean token loss divided by the number of micro-batches.
  const float grad_scale = static_cast<float>(1.0 / (static_cast<double>(T) * static_cast<double>(M)));

  TrainResult res;
  res.loss.reserve(cfg_.train_iters);
  res.grad_norm.reserve(cfg_.train_iters);
  res.seconds.reserve(cfg_.train_iters);
  res.lr_used.reserve(cfg_.train_iters);

  int64_t consumed_samples = 0;   // the log's "consumed samples"
  int64_t scheduler_samples = 0;  // advances only on successful steps
  int64_t consecutive_nan = 0;
  // The validation sampler continues where the last evaluation stopped (Megatron's
  // consumed_valid_samples = (iteration / eval_interval) * eval_iters * global batch).
  int64_t valid_consumed = 0;
  // Interval accumulators (reset at each log line, as Megatron's training_log does).
  double interval_seconds = 0.0, interval_loss = 0.0;
  int64_t interval_iters = 0, interval_good = 0, interval_skipped = 0, interval_nan = 0;
  size_t allocs_after_first = 0;
  bool memory_reported = false;

  for (int64_t it = 0; it < cfg_.train_iters; ++it) {
    timer.start();
    model_.zero_grads();
    double loss_sum = 0.0;
    const bool stats_now = cfg_.quant_stats_interval > 0 && (it + 1) % cfg_.quant_stats_interval == 0;
    for (int64_t m = 0; m < M; ++m) {
      batches_(consumed_samples, m, tokens, labels);
      model_.set_micro_batch_counter(static_cast<uint64_t>(it * M + m));
      model_.set_collect_quant_stats(stats_now && m == M - 1);  // the last micro-batch of the iteration
      loss_sum += model_.forward_backward(tokens.data(), labels.data(), grad_scale);
    }
    // Reported loss: the token-weighted mean over the global batch.
    const double loss = loss_sum / (static_cast<double>(T) * static_cast<double>(M));
    const double lr = schedule_.lr_at(scheduler_samples);
    AdamW::Result step{};
    const bool loss_finite = std::isfinite(loss);
    if (loss_finite) {
      step = opt_.step(lr);
    } else {
      step.grad_norm = std::nan("");
      step.skipped = true;
    }
    consumed_samples += cfg_.global_batch_size;
    if (!step.skipped) {
      scheduler_samples += cfg_.global_batch_size;
      model_.prepare_weights();  // quantized weight copies for the next step's micro-batches
    }
    const double seconds = timer.stop_seconds();

    res.loss.push_back(loss_finite ? loss : std::nan(""));
    res.grad_norm.push_back(step.grad_norm);
    res.seconds.push_back(seconds);
    res.lr_used.push_back(lr);
    interval_seconds += seconds;
    ++interval_iters;
    if (step.skipped) {
      ++interval_skipped;
      ++interval_nan;
      ++res.nan_iterations;
      ++consecutive_nan;
    } else {
      interval_loss += loss;
      ++interval_good;
      consecutive_nan = 0;
    }

    const int64_t iteration = it + 1;
    if (iteration % cfg_.log_interval == 0 || iteration == cfg_.train_iters) {
      const double per_iter = interval_seconds / static_cast<double>(interval_iters);
      const double tflops = iter_flops / per_iter / static_cast<double>(cfg_.data_parallel_size) / 1e12;
      out_(log::step_time_line(per_iter, tflops));
      log::IterationFields f;
      f.iteration = iteration;
      f.train_iters = cfg_.train_iters;
      f.consumed_samples = consumed_samples;
      f.elapsed_ms = per_iter * 1000.0;
      f.learning_rate = schedule_.lr_at(scheduler_samples);
      f.global_batch_size = cfg_.global_batch_size;
      if (interval_good > 0) f.lm_loss = interval_loss / static_cast<double>(interval_good);
      f.grad_norm = step.grad_norm;
      f.skipped_iterations = interval_skipped;
      f.nan_iterations = interval_nan;
      out_(log::iteration_line(f, log::now_timestamp()));
      if (!memory_reported) {
        out_(log::memory_line(0, iteration, memory_stats(model_.context().device)));
        memory_reported = true;
      }
      if (stats_now) log_quant_stats(iteration);
      interval_seconds = interval_loss = 0.0;
      interval_iters = interval_good = interval_skipped = interval_nan = 0;
    }
    if (validation_on() && iteration % cfg_.eval_interval == 0) {
      res.valid_loss.emplace_back(iteration, evaluate(fmt::format("iteration {}", iteration), eval_.valid,
                                                      valid_consumed));
      valid_consumed += cfg_.eval_iters * cfg_.global_batch_size;
    }
    if (it == 0) allocs_after_first = memory_stats(model_.context().device).total_allocs;
    if (consecutive_nan >= cfg_.max_consecutive_nan_iterations)
      fail("stopping: {} consecutive iterations had a non-finite loss or gradient norm (last at iteration {}); "
           "lower --lr or check the data",
           consecutive_nan, iteration);
  }
  res.allocations_in_loop = memory_stats(model_.context().device).total_allocs - allocs_after_first;
  // After training, as Megatron's pretrain(): the validation split (continuing) and the test split.
  if (validation_on())
    res.final_valid_loss = evaluate(fmt::format("iteration {} on validation set", cfg_.train_iters), eval_.valid,
                                    valid_consumed);
  if (cfg_.eval_iters > 0 && eval_.test)
    res.final_test_loss = evaluate(fmt::format("iteration {} on test set", cfg_.train_iters), eval_.test, 0);

  // Summary over iterations 40%..100% of the run (the playbook reports iterations 20-50 of 50).
  const int64_t N = cfg_.train_iters;
  res.summary_first = std::max<int64_t>(1, static_cast<int64_t>(std::llround(0.4 * static_cast<double>(N))));
  res.summary_last = N;
  double sum = 0.0;
  for (int64_t i = res.summary_first; i <= N; ++i) sum += res.seconds[i - 1];
  res.mean_seconds = sum / static_cast<double>(N - res.summary_first + 1);
  res.mean_tflops = iter_flops / res.mean_seconds / 1e12;
  return res;
}

}  // namespace pl
