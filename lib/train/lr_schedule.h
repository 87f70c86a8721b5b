#pragma once
// Megatron's OptimizerParamScheduler, counted in samples (SPEC-MEGATRON §6; followed:
// megatron/core/optimizer_param_scheduler.py get_lr and get_wd, and megatron/training/training.py
// get_optimizer_param_scheduler for how iterations and fractions become samples): a linear warmup from
// init_lr to max_lr, then the decay style down to min_lr at decay_samples (constant min_lr after), and the
// weight decay's increment from start_wd to end_wd over wd_incr_samples.
#include <cstdint>
#include <string>

#include "config/train_config.h"

namespace pl {

struct LrSchedule {
  double max_lr = 3e-4;
  double min_lr = 3e-5;
  double init_lr = 0.0;
  // Samples. The warmup may be fractional (--lr-warmup-fraction x decay samples, as Megatron's).
  double warmup_samples = 0.0;
  int64_t decay_samples = 0;
  std::string decay_style = "cosine";           // constant | linear | cosine | inverse-square-root | WSD
  std::string wsd_decay_style = "exponential";  // WSD's anneal: exponential | linear | cosine | minus_sqrt
  int64_t wsd_decay_samples = 0;
  double start_wd = 0.033, end_wd = 0.033;
  int64_t wd_incr_samples = 0;
  std::string wd_incr_style = "constant";  // constant | linear | cosine
  // The recipe's default warmup was capped below the decay span (Bridge's rule, only when no schedule
  // flag was given): the iterations asked for, for the banner; -1 when not capped.
  int64_t capped_warmup_iters = -1;

  // The schedule of a run: the decay span is --lr-decay-iters (default --train-iters) global batches, the
  // warmup --lr-warmup-fraction of it or --warmup-iters global batches, WSD's anneal --lr-wsd-decay-iters
  // global batches, the weight decay's span --train-iters global batches (Megatron's wd_incr_steps).
  // Refuses (one pl::Error line naming the flags) what Megatron asserts: a warmup not below the decay span
  // (both in samples), WSD without its anneal length, start/end weight decays with the constant style or
  // missing with another, end below start.
  static LrSchedule from_config(const TrainConfig& t);
  // The rate after `samples` samples of successful steps (Megatron's num_steps).
  double lr_at(int64_t samples) const;
  // The weight decay after `samples` samples (Megatron's get_wd).
  double wd_at(int64_t samples) const;
  // "cosine, warmup 2 iterations (128 samples), decay over 50 iterations (3200 samples)", for the banner.
  std::string describe(int64_t global_batch) const;
};

}  // namespace pl
