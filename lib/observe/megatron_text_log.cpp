#include "observe/megatron_text_log.h"

#include <fmt/format.h>

#include <algorithm>

#include "log/megatron_log.h"

namespace pl::observe {

MegatronTextLog::MegatronTextLog(LineFn out, std::string timing_log_option)
    : out_(std::move(out)), timing_log_option_(std::move(timing_log_option)) {}

void MegatronTextLog::on_start(const RunStart& s, TrainerAccess&) {
  first_rank_ = s.world.rank() == 0;
  last_rank_ = s.world.rank() == s.world.size() - 1;
  memory_reported_ = false;
}

// Megatron's training_log at the end of a log interval: the Step Time and iteration lines, the memory line
// (once), the timers (Megatron's timers.log(timers_to_log, normalizer=log_interval)), and with the optimizer
// offloaded at level 2 the host AdamW's time per iteration and the bandwidth it reached (bytes moved / time
// inside the update op; with the overlap the chunks of a step still running count in the next interval).
void MegatronTextLog::on_interval(const log::IntervalRecord& r) {
  print_last(log::step_time_line(r.seconds_per_iteration, r.tflops_per_gpu));
  print_last(log::iteration_line(r, log::now_timestamp()));
  if (!memory_reported_) {
    print_first(log::memory_line(0, r.iteration, r.memory));
    memory_reported_ = true;
  }
  if (!r.timers.empty())
    for (const std::string& line : log::timer_lines(std::span<const log::TimerOverRanks>(r.timers), timing_log_option_))
      print_last(line);
  if (r.host_optimizer) {
    const log::HostOptimizerReading& h = *r.host_optimizer;
    const double per_iter_ms = h.seconds * 1e3 / static_cast<double>(std::max<int64_t>(1, r.iterations));
    print_last(fmt::format("    {:.<48}: {:.2f} ms per iteration, {:.2f} GB moved, {:.2f} GB/s{}",
                           "host-optimizer-step (AdamW on the host) ", per_iter_ms, h.bytes / 1e9,
                           h.seconds > 0.0 ? h.bytes / h.seconds / 1e9 : 0.0,
                           h.overlapped ? " (overlapped with the next forward)" : ""));
  }
}

// Megatron would print 0/0 = nan for such a batch; here the loss prints as 0 and the step is taken with zero
// gradients (weight decay alone moves the weights), so a data set that masks everything must not pass unsaid.
void MegatronTextLog::on_iteration(const log::IterationRecord& it) {
  if (it.loss_tokens != 0.0 || all_masked_reported_) return;
  all_masked_reported_ = true;
  print_first(fmt::format("WARNING: iteration {}: every label of the global batch is masked (the SFT loss mask, "
                          "--eod-mask-loss): no token is counted in its loss, which is reported as 0, and its gradients "
                          "are zero; said once",
                          it.iteration));
}

// Megatron's evaluate_and_print_results: "iteration N" during training, "iteration N on validation set" /
// "... on test set" after it.
void MegatronTextLog::on_eval(const log::EvalRecord& e) {
  const std::string prefix = !e.after_training ? fmt::format("iteration {}", e.iteration)
                                               : fmt::format("iteration {} on {} set", e.iteration,
                                                             e.test_split ? "test" : "validation");
  for (const std::string& line : log::validation_lines(prefix, e.lm_loss)) print_last(line);
}

// --downstream-eval: one line per task (the last rank, as the validation lines).
void MegatronTextLog::on_downstream_eval(const log::DownstreamEvalRecord& r) {
  for (const std::string& line : log::downstream_eval_lines(r)) print_last(line);
}

// After the iteration's checkpoint: Megatron's line for a signal stop (its DistributedSignalHandler) and its
// print_datetime line for --exit-duration-in-mins.
void MegatronTextLog::on_iteration_end(const IterationEnd& e, TrainerAccess&) {
  if (e.stop.cause == log::StopCause::Signal)
    print_first(fmt::format("exiting program after receiving {} at iteration {}", log::signal_name(e.stop.signal),
                            e.state.iteration));
  else if (e.stop.cause == log::StopCause::ExitDuration)
    print_first(fmt::format("[exiting program after {} minutes] datetime: {} ", e.stop.minutes, log::now_timestamp()));
}

void MegatronTextLog::on_end(const log::RunEnd& e) {
  print_first(log::final_memory_line(e.memory));
  for (const std::string& line : summary_lines(e)) print_last(line);
}

std::vector<std::string> summary_lines(const log::RunEnd& e) {
  if (!e.ran())
    return {fmt::format("pretrain_llama | summary: no iterations run (the checkpoint is at iteration {} of {})",
                        e.last_iteration, e.train_iters)};
  std::vector<std::string> lines;
  if (e.stop.cause == log::StopCause::ExitInterval)
    lines.push_back(fmt::format("exiting program at iteration {}", e.last_iteration));  // Megatron's --exit-interval line
  // tokens/s of the whole run, then per GPU (the data-parallel ranks) when there is more than one.
  const double tokens_per_s = e.tokens_per_second();
  const std::string per_gpu =
      e.data_parallel_size > 1
          ? fmt::format(" ({:.0f} tokens/s/GPU)", tokens_per_s / static_cast<double>(e.data_parallel_size))
          : std::string();
  lines.push_back(fmt::format(
      "pretrain_llama | summary: iterations {}-{} of {} (run by this process: {}-{}): mean step time {:.3f} s, "
      "{:.3f} MODEL_TFLOP/s/GPU, {:.0f} tokens/s{} | final lm loss {:.6E} | nan iterations {}",
      e.summary_first, e.summary_last, e.train_iters, e.first_iteration, e.last_iteration, e.mean_seconds,
      e.mean_tflops, tokens_per_s, per_gpu, e.final_loss, e.nan_iterations));
  return lines;
}

}  // namespace pl::observe
