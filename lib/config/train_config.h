#pragma once
// Training settings: the playbook's flags and Megatron-Bridge's recipe defaults.
#include <cstdint>
#include <string>

namespace pl {

struct TrainConfig {
  int64_t train_iters = 50;
  int64_t warmup_iters = 2;
  int64_t global_batch_size = 64;
  int64_t micro_batch_size = 4;
  int64_t seq_length = 4096;
  int64_t data_parallel_size = 1;
  double lr = 3e-4;
  double min_lr = 3e-5;
  uint64_t seed = 1234;
  int64_t log_interval = 1;
  int threads = 0;                    // 0: all cores
  std::string device = "auto";        // auto | cpu | cuda
  int64_t max_consecutive_nan_iterations = 10;
  bool fp32_reference = false;
  int64_t exit_interval = 0;          // --exit-interval: stop after an iteration divisible by it; 0 = off
  int64_t quant_stats_interval = 0;   // --log-quant-stats-interval; 0 = off        // no bf16 rounding anywhere (numerics studies, gradient tests)

  int64_t num_micro_batches() const { return global_batch_size / (micro_batch_size * data_parallel_size); }
};

// Checks ranges and divisibility; one-line error naming the flag.
void validate_train_config(const TrainConfig& t);

}  // namespace pl
