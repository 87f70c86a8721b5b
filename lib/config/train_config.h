#pragma once
// Training settings: the playbook's flags and Megatron-Bridge's recipe defaults.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pl {

struct TrainConfig {
  int64_t train_iters = 50;
  int64_t warmup_iters = 2;
  int64_t global_batch_size = 64;
  int64_t micro_batch_size = 4;
  int64_t seq_length = 4096;
  // Data parallelism (issue 13): the data-parallel size is the world size (one rank per GPU, started by
  // mpirun/srun; set by the app, or --dry-run-world-size for a plan). Megatron's flags:
  // --use-distributed-optimizer (ZeRO-1: FP32 master weights and Adam moments sharded over the ranks,
  // gradients reduce-scattered, BF16 weights all-gathered), --overlap-grad-reduce (each bucket of
  // gradients reduced as the last micro-batch's backward finishes it), --overlap-param-gather,
  // --ddp-bucket-size (elements per bucket; 0 = Megatron's default
  // max(40000000, 1000000 * data-parallel size), one bucket without --overlap-grad-reduce).
  // --overlap-param-gather: the weights' all-gather after the step is queued bucket by bucket and the next
  // forward waits for each bucket when it reaches it.
  int64_t data_parallel_size = 1;
  bool use_distributed_optimizer = false;
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  int64_t ddp_bucket_size = 0;
  double lr = 3e-4;
  double min_lr = 3e-5;
  uint64_t seed = 1234;
  int64_t log_interval = 1;
  int threads = 0;                    // 0: all cores
  std::string device = "auto";        // auto | cpu | cuda
  bool fp32_reference = false;       // no bf16 rounding anywhere (numerics studies, gradient tests)
  // Validation (Megatron's --eval-interval / --eval-iters): every eval_interval iterations, eval_iters
  // global batches of the validation split, forward only. The playbook sets eval_iters = 0 (off);
  // the recipe's interval is 2000.
  int64_t eval_interval = 2000;
  int64_t eval_iters = 0;
  // Megatron's --timing-log-level (0: none, Megatron's default; 1: forward-backward, optimizer;
  // 2: adds forward/backward compute, batch generation and the per-op categories). See core/timers.h; the
  // readings go to the log interval's record (--timing-log-option is the text log's, observe/).
  int timing_log_level = 0;
  // Megatron's --deterministic-mode ("Choose code that has deterministic execution"): here, cuDNN's
  // deterministic attention backward. Off: cuDNN picks its fastest backward, as Transformer Engine does
  // by default (NVTE_ALLOW_NONDETERMINISTIC_ALGO=1). The CPU backend is deterministic either way.
  bool deterministic_mode = false;
  // --cuda-sync-every-launch: synchronize the device after every CUDA launch so an asynchronous fault
  // names its op (debugging; slow). No effect on the CPU.
  bool cuda_sync_every_launch = false;
  // --quantize-kernels fast | reference: the GPU's quantize and expand kernels (DeviceState::
  // reference_quantize_kernels). "reference" runs the kernels as they were before issue 40, bit for bit
  // the same codes and losses, slower; for diagnosis, and to step around a failing fast kernel. No
  // effect on the CPU.
  std::string quantize_kernels = "fast";

  // Megatron's precision-aware optimizer (--use-precision-aware-optimizer with --main-grads-dtype,
  // --main-params-dtype, --exp-avg-dtype, --exp-avg-sq-dtype; Megatron-LM
  // megatron/core/optimizer/optimizer_config.py): the dtype of each optimizer state buffer. Without the
  // flag every dtype must stay fp32. See validate_train_config for what is refused and why.
  bool use_precision_aware_optimizer = false;
  std::string main_grads_dtype = "fp32";   // fp32 | bf16
  std::string main_params_dtype = "fp32";  // fp32 | fp16
  std::string exp_avg_dtype = "fp32";      // fp32 | fp16 | bf16
  std::string exp_avg_sq_dtype = "fp32";   // fp32 | fp16 | bf16
  // Megatron's --optimizer-cpu-offload / --optimizer-offload-fraction (megatron/training/arguments.py;
  // Megatron asserts --use-precision-aware-optimizer with it, "as the hybrid device optimizer reuses the
  // code path of this flag", and so does this project): the FP32 master weights and Adam's moments live
  // in host memory and AdamW runs on the host. Fraction: 1.0 only (a split is not implemented yet).
  bool optimizer_cpu_offload = false;
  double optimizer_offload_fraction = 1.0;
  // Megatron's --overlap-cpu-optimizer-d2h-h2d ("Overlap CPU optimizer step, gradients D2H and updated
  // parameters H2D"): the host AdamW on a worker thread, chunk by chunk in the order the next forward reads
  // the weights, and that forward waiting per layer (train/optimizer.h). Needs --optimizer-cpu-offload.
  bool overlap_cpu_optimizer_d2h_h2d = false;

  // ---- issue 27: AdamW's and the LR schedule's flags (flags_schedule.cpp) ----
  // Megatron-LM's names and meanings (megatron/training/arguments.py, megatron/training/config/
  // training_config.py SchedulerConfig, megatron/core/optimizer_param_scheduler.py). Defaults: Megatron-Bridge's
  // Llama 3 recipe as before (AdamW betas 0.9/0.95, eps 1e-8, decay 0.033, clip 1.0, cosine over train_iters).
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.95;
  double adam_eps = 1e-8;
  double clip_grad = 1.0;  // --clip-grad: the global-norm bound; 0 = no clipping
  // --weight-decay, or with --weight-decay-incr-style linear|cosine Megatron's get_wd from
  // --start-weight-decay to --end-weight-decay over the train_iters x global batch samples.
  double weight_decay = 0.033;
  std::optional<double> start_weight_decay, end_weight_decay;
  std::string weight_decay_incr_style = "constant";  // constant | linear | cosine
  std::string lr_decay_style = "cosine";             // constant | linear | cosine | inverse-square-root | WSD
  int64_t lr_decay_iters = 0;                        // 0: train_iters (Megatron's None)
  std::optional<double> lr_warmup_fraction;          // of the decay span, in samples (may be fractional)
  std::string lr_wsd_decay_style = "exponential";    // WSD's anneal: exponential | linear | cosine | minus_sqrt
  int64_t lr_wsd_decay_iters = 0;                    // WSD's anneal length (required with WSD)
  // Megatron's rule for a warmup that reaches the decay span (an error) applies when the user chose the
  // schedule (--warmup-iters, --lr-warmup-fraction or --lr-decay-iters given); the recipe's default warmup
  // of 2 against --train-iters 1 or 2 keeps Bridge's cap to decay - 1 (said in the banner).
  bool schedule_given = false;
  double init_method_std = 0.0;      // --init-method-std over the model config's (0: the config's)
  bool log_params_norm = false;      // --log-params-norm: the master weights' norm in each log interval's record

  // ---- issue 27: document-aware packing (flags_packing.cpp) ----
  // Megatron's flags (arguments.py; semantics of gpt_dataset.py _get_ltor_masks_and_position_ids, see
  // data/documents.h): no loss on predictions made from an EOD, RoPE positions and attention restarted at
  // each document. All false: today's behaviour, bit for bit.
  bool eod_mask_loss = false;
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  // --calculate-per-token-loss: the gradient is of Σ losses / (tokens counted over the global batch) instead of
  // the mean of the micro-batches' per-token means (trainer.cpp loss_gradient_scale).
  bool calculate_per_token_loss = false;

  // ---- issue 27: FP8 delayed scaling's overrides (flags_fp8.cpp) ----
  // Megatron's --fp8-amax-history-len, --fp8-amax-compute-algo, --fp8-margin: when given (the app
  // checks app.count) they replace the recipe's fp8_amax_history_len / _compute_algo / fp8_margin.
  int64_t fp8_amax_history_len = 1024;
  std::string fp8_amax_compute_algo = "max";
  int64_t fp8_margin = 0;

  int64_t num_micro_batches() const { return global_batch_size / (micro_batch_size * data_parallel_size); }
  // Samples each split needs (Megatron's get_train_valid_test_num_samples): train_iters global
  // batches; (train_iters / eval_interval + 1) * eval_iters for validation (one evaluation every
  // interval plus the final one); eval_iters for the test split.
  // (Checked: a product that overflows is a one-line error naming the flags.)
  int64_t train_samples() const;
  int64_t valid_samples() const;
  int64_t test_samples() const;
};

// Checks ranges and divisibility; one-line error naming the flag.
void validate_train_config(const TrainConfig& t);
// The data-parallel flags alone (part of validate_train_config).
void validate_data_parallel(const TrainConfig& t);
// The precision-aware optimizer's flags alone (part of validate_train_config).
void validate_optimizer_dtypes(const TrainConfig& t);

}  // namespace pl
