#include "config/train_config.h"

#include <cmath>

#include "core/error.h"

namespace pl {

void validate_train_config(const TrainConfig& t) {
  PL_CHECK(t.train_iters >= 1, "--train-iters must be >= 1, got {}", t.train_iters);
  PL_CHECK(t.warmup_iters >= 0, "--warmup-iters must be >= 0, got {}", t.warmup_iters);
  PL_CHECK(t.global_batch_size >= 1, "--global-batch-size must be >= 1, got {}", t.global_batch_size);
  PL_CHECK(t.micro_batch_size >= 1, "--micro-batch-size must be >= 1, got {}", t.micro_batch_size);
  PL_CHECK(t.seq_length >= 1, "--seq-length must be >= 1, got {}", t.seq_length);
  PL_CHECK(t.data_parallel_size >= 1, "data-parallel size must be >= 1, got {}", t.data_parallel_size);
  PL_CHECK(t.global_batch_size % (t.micro_batch_size * t.data_parallel_size) == 0,
           "--global-batch-size {} is not divisible by --micro-batch-size {} x data-parallel size {} = {}",
           t.global_batch_size, t.micro_batch_size, t.data_parallel_size, t.micro_batch_size * t.data_parallel_size);
  PL_CHECK(std::isfinite(t.lr) && t.lr >= 0.0, "--lr must be a finite number >= 0, got {}", t.lr);
  PL_CHECK(std::isfinite(t.min_lr) && t.min_lr >= 0.0, "--min-lr must be a finite number >= 0, got {}", t.min_lr);
  PL_CHECK(t.min_lr <= t.lr, "--min-lr {} exceeds --lr {}", t.min_lr, t.lr);
  PL_CHECK(t.log_interval >= 1, "--log-interval must be >= 1, got {}", t.log_interval);
  PL_CHECK(t.threads >= 0, "--threads must be >= 0 (0 = all cores), got {}", t.threads);
  PL_CHECK(t.device == "auto" || t.device == "cpu" || t.device == "cuda",
           "--device must be auto, cpu or cuda, got '{}'", t.device);
  PL_CHECK(t.quant_stats_interval >= 0, "--log-quant-stats-interval must be >= 0 (0 = off), got {}",
           t.quant_stats_interval);
  PL_CHECK(t.exit_interval >= 0, "--exit-interval must be >= 0 (0 = off), got {}", t.exit_interval);
  PL_CHECK(t.eval_interval >= 1, "--eval-interval must be >= 1, got {}", t.eval_interval);
  PL_CHECK(t.eval_iters >= 0, "--eval-iters must be >= 0 (0 = no validation), got {}", t.eval_iters);
  PL_CHECK(t.timing_log_level >= 0 && t.timing_log_level <= 2, "--timing-log-level must be 0, 1 or 2, got {}",
           t.timing_log_level);
  PL_CHECK(t.timing_log_option == "minmax" || t.timing_log_option == "max" || t.timing_log_option == "all",
           "--timing-log-option must be max, minmax or all, got '{}'", t.timing_log_option);
  PL_CHECK(t.max_consecutive_nan_iterations >= 1, "--max-nan-iterations must be >= 1, got {}",
           t.max_consecutive_nan_iterations);
}

}  // namespace pl
