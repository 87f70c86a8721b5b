#include "train/lr_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "core/error.h"

namespace pl {

namespace {

bool one_of(const std::string& v, std::initializer_list<const char*> names) {
  return std::any_of(names.begin(), names.end(), [&](const char* n) { return v == n; });
}

int64_t samples_of(int64_t iters, int64_t global_batch, const char* flag) {
  PL_CHECK(iters <= std::numeric_limits<int64_t>::max() / std::max<int64_t>(global_batch, 1),
           "{} {} x --global-batch-size {} overflows a 64-bit sample count", flag, iters, global_batch);
  return iters * global_batch;
}

// Megatron's start/end weight decay (arguments.py: the constant style takes --weight-decay and refuses the
// other two; linear and cosine need both) and the scheduler's asserts (start >= 0, end >= start).
void set_weight_decay(LrSchedule& s, const TrainConfig& t) {
  s.wd_incr_style = t.weight_decay_incr_style;
  PL_CHECK(one_of(s.wd_incr_style, {"constant", "linear", "cosine"}),
           "--weight-decay-incr-style must be constant, linear or cosine, got '{}'", s.wd_incr_style);
  s.wd_incr_samples = samples_of(t.train_iters, t.global_batch_size, "--train-iters");
  if (s.wd_incr_style == "constant") {
    PL_CHECK(!t.start_weight_decay && !t.end_weight_decay,
             "--start-weight-decay/--end-weight-decay need --weight-decay-incr-style linear or cosine (the constant "
             "style uses --weight-decay {}; Megatron's rule)",
             t.weight_decay);
    s.start_wd = s.end_wd = t.weight_decay;
    return;
  }
  PL_CHECK(t.start_weight_decay && t.end_weight_decay,
           "--weight-decay-incr-style {} needs both --start-weight-decay and --end-weight-decay (Megatron's rule)",
           s.wd_incr_style);
  s.start_wd = *t.start_weight_decay;
  s.end_wd = *t.end_weight_decay;
  PL_CHECK(s.start_wd >= 0.0 && s.end_wd >= s.start_wd,
           "--start-weight-decay {} and --end-weight-decay {} must satisfy 0 <= start <= end (Megatron's "
           "OptimizerParamScheduler)",
           s.start_wd, s.end_wd);
}

// The warmup in samples: --lr-warmup-fraction of the decay span, or --warmup-iters global batches (the
// recipe's default capped as Bridge does when no schedule flag was given). Megatron's assert
// lr_warmup_steps < lr_decay_steps as a one-line error in samples.
void set_warmup(LrSchedule& s, const TrainConfig& t, int64_t decay_iters, const std::string& decay_flag) {
  std::string warmup_flag;
  if (t.lr_warmup_fraction) {
    PL_CHECK(std::isfinite(*t.lr_warmup_fraction) && *t.lr_warmup_fraction >= 0.0,
             "--lr-warmup-fraction must be a finite number >= 0, got {}", *t.lr_warmup_fraction);
    s.warmup_samples = *t.lr_warmup_fraction * static_cast<double>(s.decay_samples);
    warmup_flag = fmt::format("--lr-warmup-fraction {} of the decay span", *t.lr_warmup_fraction);
  } else {
    PL_CHECK(t.warmup_iters >= 0, "--warmup-iters must be >= 0, got {}", t.warmup_iters);
    int64_t warmup = t.warmup_iters;
    if (!t.schedule_given && warmup >= decay_iters) {
      s.capped_warmup_iters = warmup;
      warmup = std::max<int64_t>(decay_iters - 1, 0);
    }
    s.warmup_samples = static_cast<double>(samples_of(warmup, t.global_batch_size, "--warmup-iters"));
    warmup_flag = fmt::format("--warmup-iters {} x global batch {}", t.warmup_iters, t.global_batch_size);
  }
  PL_CHECK(s.warmup_samples < static_cast<double>(s.decay_samples),
           "the LR warmup ({}: {} samples) must end before the LR decay span ({} x global batch {}: {} samples); "
           "Megatron's rule lr_warmup_steps < lr_decay_steps",
           warmup_flag, s.warmup_samples, decay_flag, t.global_batch_size, s.decay_samples);
}

}  // namespace

LrSchedule LrSchedule::from_config(const TrainConfig& t) {
  LrSchedule s;
  s.max_lr = t.lr;
  s.min_lr = t.min_lr;
  s.decay_style = t.lr_decay_style;
  PL_CHECK(one_of(s.decay_style, {"constant", "linear", "cosine", "inverse-square-root", "WSD"}),
           "--lr-decay-style must be constant, linear, cosine, inverse-square-root or WSD, got '{}'", s.decay_style);
  PL_CHECK(t.lr_decay_iters >= 0, "--lr-decay-iters must be >= 1, got {}", t.lr_decay_iters);
  PL_CHECK(t.train_iters >= 1, "--train-iters must be >= 1, got {}", t.train_iters);
  const int64_t decay_iters = t.lr_decay_iters > 0 ? t.lr_decay_iters : t.train_iters;
  const std::string decay_flag = t.lr_decay_iters > 0 ? fmt::format("--lr-decay-iters {}", decay_iters)
                                                      : fmt::format("--train-iters {} (no --lr-decay-iters)", decay_iters);
  s.decay_samples = samples_of(decay_iters, t.global_batch_size, "--lr-decay-iters");
  set_warmup(s, t, decay_iters, decay_flag);
  s.wsd_decay_style = t.lr_wsd_decay_style;
  PL_CHECK(one_of(s.wsd_decay_style, {"exponential", "linear", "cosine", "minus_sqrt"}),
           "--lr-wsd-decay-style must be exponential, linear, cosine or minus_sqrt, got '{}'", s.wsd_decay_style);
  PL_CHECK(t.lr_wsd_decay_iters >= 0, "--lr-wsd-decay-iters must be >= 1, got {}", t.lr_wsd_decay_iters);
  if (s.decay_style == "WSD") {
    PL_CHECK(t.lr_wsd_decay_iters >= 1,
             "--lr-decay-style WSD needs --lr-wsd-decay-iters N (the length of its anneal; Megatron asserts it)");
    PL_CHECK(t.lr_wsd_decay_iters <= decay_iters, "--lr-wsd-decay-iters {} must not exceed the LR decay span of {}",
             t.lr_wsd_decay_iters, decay_flag);
  }
  s.wsd_decay_samples = samples_of(t.lr_wsd_decay_iters, t.global_batch_size, "--lr-wsd-decay-iters");
  set_weight_decay(s, t);
  return s;
}

double LrSchedule::lr_at(int64_t samples) const {
  const double n = static_cast<double>(samples);
  if (warmup_samples > 0.0 && n <= warmup_samples) return init_lr + (max_lr - init_lr) * n / warmup_samples;
  if (decay_style == "constant") return max_lr;
  if (samples > decay_samples) return min_lr;
  if (decay_style == "inverse-square-root") {
    const double warmup = std::max(warmup_samples, 1.0), steps = std::max(n, 1.0);
    return std::max(min_lr, max_lr * std::sqrt(warmup) / std::sqrt(steps));
  }
  const double ratio = (n - warmup_samples) / (static_cast<double>(decay_samples) - warmup_samples);
  double coeff = 0.0;
  if (decay_style == "linear") {
    coeff = 1.0 - ratio;
  } else if (decay_style == "cosine") {
    coeff = 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
  } else {  // WSD: max_lr until the anneal's start, then the anneal's style over its samples
    const int64_t anneal_start = decay_samples - wsd_decay_samples;
    if (samples <= anneal_start) {
      coeff = 1.0;
    } else {
      const double r = static_cast<double>(samples - anneal_start) / static_cast<double>(wsd_decay_samples);
      if (wsd_decay_style == "linear") coeff = 1.0 - r;
      else if (wsd_decay_style == "cosine") coeff = 0.5 * (std::cos(std::numbers::pi * r) + 1.0);
      else if (wsd_decay_style == "exponential") coeff = 2.0 * std::pow(0.5, r) - 1.0;
      else coeff = 1.0 - std::sqrt(r);  // minus_sqrt
    }
  }
  return min_lr + coeff * (max_lr - min_lr);
}

double LrSchedule::wd_at(int64_t samples) const {
  if (samples > wd_incr_samples || wd_incr_style == "constant") return end_wd;
  const double ratio = static_cast<double>(samples) / static_cast<double>(wd_incr_samples);
  const double coeff = wd_incr_style == "linear" ? ratio : 0.5 * (std::cos(std::numbers::pi * (1.0 - ratio)) + 1.0);
  return start_wd + coeff * (end_wd - start_wd);
}

std::string LrSchedule::describe(int64_t global_batch) const {
  const double gb = static_cast<double>(std::max<int64_t>(global_batch, 1));
  std::string s = fmt::format("{}, warmup {:g} iterations ({:g} samples{}), decay over {} iterations ({} samples)",
                              decay_style, warmup_samples / gb, warmup_samples,
                              capped_warmup_iters >= 0
                                  ? fmt::format("; the default {} capped below the decay span, as Bridge", capped_warmup_iters)
                                  : std::string(),
                              decay_samples / std::max<int64_t>(global_batch, 1), decay_samples);
  if (decay_style == "WSD")
    s += fmt::format(", {} anneal over the last {} iterations", wsd_decay_style,
                     wsd_decay_samples / std::max<int64_t>(global_batch, 1));
  if (decay_style == "constant") s += " (constant: the decay span is unused)";
  return s;
}

}  // namespace pl
