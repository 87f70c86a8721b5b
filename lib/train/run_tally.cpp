#include "train/run_tally.h"

#include <algorithm>
#include <cmath>

namespace pl {

RunTally::RunTally(const TrainConfig& cfg, const TrainState& start, double iter_flops, int64_t world_size)
    : cfg_(cfg),
      st_(start),
      iter_flops_(iter_flops),
      world_size_(world_size),
      first_iteration_(start.iteration + 1),
      last_loss_(std::nan("")) {
  seconds_.reserve(static_cast<size_t>(std::max<int64_t>(0, cfg.train_iters - st_.iteration)));
}

// Per GPU: Megatron's model FLOPs / seconds / data-parallel ranks.
double RunTally::tflops_per_gpu(double seconds) const {
  return iter_flops_ / seconds / static_cast<double>(cfg_.data_parallel_size) / 1e12;
}

// Every rank's tokens.
double RunTally::tokens_per_second(double seconds) const {
  return static_cast<double>(cfg_.global_batch_size * cfg_.seq_length) / seconds;
}

log::IterationRecord RunTally::count_step(const StepOutcome& s, const MemoryStats& memory) {
  seconds_.push_back(s.seconds);
  last_loss_ = std::isfinite(s.loss) ? s.loss : std::nan("");
  interval_seconds_ += s.seconds;
  ++interval_timed_;
  ++st_.interval_iters;
  if (s.skipped) {
    ++st_.interval_skipped;
    ++st_.interval_nan;
    ++st_.nan_iterations;
    ++st_.consecutive_nan;
  } else {
    st_.interval_loss += s.loss;
    ++st_.interval_good;
    st_.consecutive_nan = 0;
  }
  ++st_.iteration;
  log::IterationRecord it;
  it.iteration = st_.iteration;
  it.train_iters = cfg_.train_iters;
  it.consumed_samples = st_.consumed_samples;
  it.global_batch_size = cfg_.global_batch_size;
  it.world_size = world_size_;
  it.lm_loss = last_loss_;
  it.loss_tokens = s.loss_tokens;
  it.lr_used = s.lr_used;
  it.learning_rate = s.lr_next;
  it.grad_norm = s.grad_norm;
  it.skipped = s.skipped;
  it.consecutive_nan = st_.consecutive_nan;
  it.seconds = s.seconds;
  it.tflops_per_gpu = tflops_per_gpu(s.seconds);
  it.tokens_per_second = tokens_per_second(s.seconds);
  it.memory = memory;
  return it;
}

log::IntervalRecord RunTally::close_interval(const log::IterationRecord& last, const MemoryStats& memory) {
  log::IntervalRecord in;
  in.iteration = last.iteration;
  in.train_iters = cfg_.train_iters;
  in.consumed_samples = st_.consumed_samples;
  in.global_batch_size = cfg_.global_batch_size;
  in.iterations = interval_timed_;
  in.seconds_per_iteration = interval_seconds_ / static_cast<double>(interval_timed_);
  in.tflops_per_gpu = tflops_per_gpu(in.seconds_per_iteration);
  in.tokens_per_second = tokens_per_second(in.seconds_per_iteration);
  in.learning_rate = last.learning_rate;
  if (st_.interval_good > 0) in.lm_loss = st_.interval_loss / static_cast<double>(st_.interval_good);
  in.grad_norm = last.grad_norm;
  in.skipped_iterations = st_.interval_skipped;
  in.nan_iterations = st_.interval_nan;
  in.memory = memory;
  interval_seconds_ = st_.interval_loss = 0.0;
  interval_timed_ = 0;
  st_.interval_iters = st_.interval_good = st_.interval_skipped = st_.interval_nan = 0;
  return in;
}

log::RunEnd RunTally::end(const log::StopRequest& stop, const MemoryStats& memory, size_t allocations_in_loop) const {
  log::RunEnd e;
  e.first_iteration = first_iteration_;
  e.last_iteration = st_.iteration;
  e.train_iters = cfg_.train_iters;
  e.global_batch_size = cfg_.global_batch_size;
  e.seq_length = cfg_.seq_length;
  e.data_parallel_size = cfg_.data_parallel_size;
  e.stop = stop;
  e.final_loss = last_loss_;
  e.nan_iterations = st_.nan_iterations;
  e.memory = memory;
  e.allocations_in_loop = allocations_in_loop;
  const auto ran = static_cast<int64_t>(seconds_.size());
  if (ran == 0) return e;
  const int64_t first_idx = std::clamp<int64_t>(std::llround(0.4 * static_cast<double>(ran)) - 1, 0, ran - 1);
  e.summary_first = first_iteration_ + first_idx;
  e.summary_last = first_iteration_ + ran - 1;
  double sum = 0.0;
  for (int64_t i = first_idx; i < ran; ++i) sum += seconds_[static_cast<size_t>(i)];
  e.mean_seconds = sum / static_cast<double>(ran - first_idx);
  e.mean_tflops = tflops_per_gpu(e.mean_seconds);
  return e;
}

}  // namespace pl
