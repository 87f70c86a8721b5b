#pragma once
// Megatron's OptimizerParamScheduler, counted in samples (SPEC-MEGATRON §6): linear warmup from
// init_lr, then cosine decay to min_lr at decay_samples, constant min_lr after.
#include <cstdint>

namespace pl {

struct LrSchedule {
  double max_lr = 3e-4;
  double min_lr = 3e-5;
  double init_lr = 0.0;
  int64_t warmup_samples = 0;
  int64_t decay_samples = 0;

  // Bridge: warmup/decay iterations times the global batch; warmup >= decay is capped to decay-1.
  static LrSchedule from_iterations(double max_lr, double min_lr, int64_t warmup_iters, int64_t decay_iters,
                                    int64_t global_batch);
  double lr_at(int64_t samples) const;
};

}  // namespace pl
