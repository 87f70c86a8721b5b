#include "config/train_config.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>

#include "core/checked_math.h"
#include "core/error.h"

namespace pl {

// Megatron-LM's rules (megatron/training/arguments.py, validate_args): --overlap-param-gather needs the
// distributed optimizer and --overlap-grad-reduce. Not implemented here yet, refused with one line: with
// more than one rank, the optimizer offload and BF16 main grads (both
// would need the reduction in another dtype or place; Megatron-Bridge's Llama 3 recipes reduce FP32).
void validate_data_parallel(const TrainConfig& t) {
  PL_CHECK(t.ddp_bucket_size >= 0, "--ddp-bucket-size must be >= 0 (0 = Megatron's default), got {}", t.ddp_bucket_size);
  PL_CHECK(!t.overlap_param_gather || t.use_distributed_optimizer,
           "--overlap-param-gather needs --use-distributed-optimizer (as Megatron)");
  PL_CHECK(!t.overlap_param_gather || t.overlap_grad_reduce,
           "--overlap-param-gather needs --overlap-grad-reduce (as Megatron)");
  PL_CHECK(!(t.use_distributed_optimizer && t.optimizer_cpu_offload),
           "--optimizer-cpu-offload with --use-distributed-optimizer is not implemented yet");
  if (t.data_parallel_size > 1) {
    PL_CHECK(!t.optimizer_cpu_offload, "--optimizer-cpu-offload with {} data-parallel ranks is not implemented yet",
             t.data_parallel_size);
    PL_CHECK(t.main_grads_dtype == "fp32",
             "--main-grads-dtype {} with {} data-parallel ranks is not implemented yet (gradients are reduced in "
             "FP32, as Megatron-Bridge's Llama 3 recipes do)",
             t.main_grads_dtype, t.data_parallel_size);
    PL_CHECK(!t.use_precision_aware_optimizer || t.use_distributed_optimizer,
             "--use-precision-aware-optimizer with {} data-parallel ranks needs --use-distributed-optimizer (as "
             "Megatron)",
             t.data_parallel_size);
  }
}

int64_t TrainConfig::train_samples() const {
  return checked_mul(train_iters, global_batch_size, "--train-iters x --global-batch-size (training samples)");
}

int64_t TrainConfig::valid_samples() const {
  const int64_t evaluations = train_iters / eval_interval + 1;
  return checked_product({evaluations, eval_iters, global_batch_size},
                         "(--train-iters / --eval-interval + 1) x --eval-iters x --global-batch-size (validation samples)");
}

int64_t TrainConfig::test_samples() const {
  return checked_mul(eval_iters, global_batch_size, "--eval-iters x --global-batch-size (test samples)");
}

void validate_train_config(const TrainConfig& t) {
  PL_CHECK(t.train_iters >= 1, "--train-iters must be >= 1, got {}", t.train_iters);
  PL_CHECK(t.warmup_iters >= 0, "--warmup-iters must be >= 0, got {}", t.warmup_iters);
  PL_CHECK(t.global_batch_size >= 1, "--global-batch-size must be >= 1, got {}", t.global_batch_size);
  PL_CHECK(t.micro_batch_size >= 1, "--micro-batch-size must be >= 1, got {}", t.micro_batch_size);
  PL_CHECK(t.seq_length >= 1, "--seq-length must be >= 1, got {}", t.seq_length);
  PL_CHECK(t.data_parallel_size >= 1, "data-parallel size must be >= 1, got {}", t.data_parallel_size);
  PL_CHECK(t.eval_interval >= 1, "--eval-interval must be >= 1, got {}", t.eval_interval);
  PL_CHECK(t.eval_iters >= 0, "--eval-iters must be >= 0 (0 = no validation), got {}", t.eval_iters);
  // Sizes derived from the batch flags fit int64 (every buffer and sample count is bounded by these).
  (void)checked_mul(t.micro_batch_size, t.data_parallel_size, "--micro-batch-size x data-parallel size");
  (void)checked_mul(t.global_batch_size, t.seq_length, "--global-batch-size x --seq-length (tokens per iteration)");
  (void)checked_product({t.global_batch_size, t.seq_length, t.train_iters},
                        "--global-batch-size x --seq-length x --train-iters (tokens of the run)");
  (void)t.train_samples();
  (void)t.valid_samples();
  (void)t.test_samples();
  PL_CHECK(t.global_batch_size % (t.micro_batch_size * t.data_parallel_size) == 0,
           "--global-batch-size {} is not divisible by --micro-batch-size {} x data-parallel size {} = {}",
           t.global_batch_size, t.micro_batch_size, t.data_parallel_size, t.micro_batch_size * t.data_parallel_size);
  validate_data_parallel(t);
  PL_CHECK(std::isfinite(t.lr) && t.lr >= 0.0, "--lr must be a finite number >= 0, got {}", t.lr);
  PL_CHECK(std::isfinite(t.min_lr) && t.min_lr >= 0.0, "--min-lr must be a finite number >= 0, got {}", t.min_lr);
  PL_CHECK(t.min_lr <= t.lr, "--min-lr {} exceeds --lr {}", t.min_lr, t.lr);
  PL_CHECK(t.log_interval >= 1, "--log-interval must be >= 1, got {}", t.log_interval);
  PL_CHECK(t.threads >= 0, "--threads must be >= 0 (0 = all cores), got {}", t.threads);
  PL_CHECK(t.device == "auto" || t.device == "cpu" || t.device == "cuda",
           "--device must be auto, cpu or cuda, got '{}'", t.device);
  PL_CHECK(t.timing_log_level >= 0 && t.timing_log_level <= 2, "--timing-log-level must be 0, 1 or 2, got {}",
           t.timing_log_level);
  validate_optimizer_dtypes(t);
  PL_CHECK(t.quantize_kernels == "fast" || t.quantize_kernels == "reference",
           "--quantize-kernels must be one of fast, reference, got '{}'", t.quantize_kernels);
}

// Megatron-LM's rules (megatron/core/optimizer/optimizer_config.py, OptimizerConfig.__post_init__, and
// the flag definitions in megatron/training/arguments.py): each dtype flag takes Megatron's value set;
// without --use-precision-aware-optimizer every state dtype must be fp32 ("main_grads_dtype can only be
// fp32 when not using precision-aware optimizer", and the same for the other three). Megatron also
// asserts --use-distributed-optimizer with the precision-aware optimizer; this project has no such flag
// yet and runs one rank, whose distributed optimizer would hold the whole state, so the flags are
// accepted as they are. Not implemented yet, refused with one line: the FP16
// states (Transformer Engine's FusedAdam keeps an FP16 master or moment with a per-tensor scale,
// absmax / (65504 / 2), that this project does not implement), and an offload fraction below 1.
void validate_optimizer_dtypes(const TrainConfig& t) {
  struct Flag {
    const char* name;
    const std::string& value;
    std::initializer_list<const char*> allowed;
  };
  const Flag flags[] = {{"--main-grads-dtype", t.main_grads_dtype, {"fp32", "bf16"}},
                        {"--main-params-dtype", t.main_params_dtype, {"fp32", "fp16"}},
                        {"--exp-avg-dtype", t.exp_avg_dtype, {"fp32", "fp16", "bf16"}},
                        {"--exp-avg-sq-dtype", t.exp_avg_sq_dtype, {"fp32", "fp16", "bf16"}}};
  for (const Flag& f : flags) {
    PL_CHECK(std::find(f.allowed.begin(), f.allowed.end(), f.value) != f.allowed.end(),
             "{} must be one of {}, got '{}'", f.name, fmt::join(f.allowed, ", "), f.value);
    PL_CHECK(t.use_precision_aware_optimizer || f.value == "fp32",
             "{} {} needs --use-precision-aware-optimizer (without it every optimizer state is fp32, as Megatron)",
             f.name, f.value);
  }
  PL_CHECK(t.main_params_dtype == "fp32",
           "--main-params-dtype fp16 is not implemented yet (TE keeps an FP16 master with a per-tensor scale)");
  PL_CHECK(t.exp_avg_dtype != "fp16",
           "--exp-avg-dtype fp16 is not implemented yet (TE keeps an FP16 moment with a per-tensor scale; use bf16)");
  PL_CHECK(t.exp_avg_sq_dtype != "fp16",
           "--exp-avg-sq-dtype fp16 is not implemented yet (TE keeps an FP16 moment with a per-tensor scale; use bf16)");
  // Megatron's optimizer CPU offload check (megatron/training/arguments.py, validate_args).
  PL_CHECK(t.optimizer_offload_fraction >= 0.0 && t.optimizer_offload_fraction <= 1.0,
           "--optimizer-offload-fraction must be in [0, 1], got {}", t.optimizer_offload_fraction);
  PL_CHECK(!t.optimizer_cpu_offload || t.use_precision_aware_optimizer,
           "--optimizer-cpu-offload needs --use-precision-aware-optimizer (as Megatron: the offloaded optimizer "
           "reuses its code path)");
  // (The overlap flag means nothing without the offload; refused, so no one believes it ran.
  // The offload's own refusals -- a fraction below 1, data parallelism -- cover the overlap too.)
  PL_CHECK(!t.overlap_cpu_optimizer_d2h_h2d || t.optimizer_cpu_offload,
           "--overlap-cpu-optimizer-d2h-h2d needs --optimizer-cpu-offload (it overlaps the offloaded optimizer's "
           "copies and host step)");
  PL_CHECK(!t.optimizer_cpu_offload || t.optimizer_offload_fraction == 1.0,
           "--optimizer-offload-fraction {} is not implemented yet (1.0 only: the whole optimizer on the host)",
           t.optimizer_offload_fraction);
}

}  // namespace pl
