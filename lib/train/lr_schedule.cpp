#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace pl {

LrSchedule LrSchedule::from_iterations(double max_lr, double min_lr, int64_t warmup_iters, int64_t decay_iters,
                                       int64_t global_batch) {
  LrSchedule s;
  s.max_lr = max_lr;
  s.min_lr = min_lr;
  if (warmup_iters >= decay_iters) warmup_iters = std::max<int64_t>(decay_iters - 1, 0);
  s.warmup_samples = warmup_iters * global_batch;
  s.decay_samples = decay_iters * global_batch;
  return s;
}

double LrSchedule::lr_at(int64_t n) const {
  if (warmup_samples > 0 && n <= warmup_samples)
    return init_lr + (max_lr - init_lr) * static_cast<double>(n) / static_cast<double>(warmup_samples);
  if (n > decay_samples) return min_lr;
  const double ratio =
      static_cast<double>(n - warmup_samples) / static_cast<double>(std::max<int64_t>(decay_samples - warmup_samples, 1));
  const double coeff = 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
  return min_lr + coeff * (max_lr - min_lr);
}

}  // namespace pl
