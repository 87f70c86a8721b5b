// pretrain_llama's flags of issue 27: AdamW's and the learning-rate schedule's flags (Megatron's names and meanings).
// Followed: Megatron-LM megatron/training/arguments.py (_add_regularization_args, _add_learning_rate_args and
// the checks of validate_args), megatron/training/config/training_config.py (SchedulerConfig, LoggerConfig,
// TrainingConfig.exit_duration_in_mins) and megatron/training/training.py (get_optimizer_param_scheduler,
// the --exit-duration-in-mins check, the " params norm:" field). The defaults are Megatron-Bridge's Llama 3
// recipe, as before these flags (Megatron's own differ: --weight-decay 0.01, --adam-beta2 0.999, linear).
#include <CLI/CLI.hpp>

#include <cmath>

#include "pretrain_llama.h"
#include "core/error.h"
#include "train/lr_schedule.h"

namespace pl::pretrain {

namespace {

void add_adamw_flags(CLI::App& app, TrainConfig& t) {
  app.add_option("--weight-decay", t.weight_decay,
                 "Megatron's flag: AdamW's decoupled weight decay (not on the 1-D norm weights)")
      ->capture_default_str();
  app.add_option("--adam-beta1", t.adam_beta1, "Megatron's flag: AdamW's beta1, in [0, 1)")->capture_default_str();
  app.add_option("--adam-beta2", t.adam_beta2, "Megatron's flag: AdamW's beta2, in [0, 1)")->capture_default_str();
  app.add_option("--adam-eps", t.adam_eps, "Megatron's flag: AdamW's epsilon, > 0")->capture_default_str();
  app.add_option("--clip-grad", t.clip_grad,
                 "Megatron's flag: clip the gradients to this global L2 norm (0 = no clipping; the norm is still "
                 "logged)")
      ->capture_default_str();
  app.add_option("--start-weight-decay", t.start_weight_decay,
                 "Megatron's flag: the weight decay at the start of --weight-decay-incr-style linear|cosine");
  app.add_option("--end-weight-decay", t.end_weight_decay,
                 "Megatron's flag: the weight decay at --train-iters with --weight-decay-incr-style linear|cosine");
  app.add_option("--weight-decay-incr-style", t.weight_decay_incr_style,
                 "Megatron's flag: constant (--weight-decay) | linear | cosine (from --start-weight-decay to "
                 "--end-weight-decay over the run)")
      ->capture_default_str();
}

void add_lr_flags(CLI::App& app, TrainConfig& t) {
  // Megatron's rule for a warmup that reaches the decay span applies once the user chose the schedule.
  const auto chosen = [&t](const std::string&) { t.schedule_given = true; };
  app.get_option("--warmup-iters")->each(chosen);
  app.add_option("--lr-warmup-iters", t.warmup_iters, "Megatron's name of --warmup-iters")->each(chosen);
  app.add_option("--lr-decay-style", t.lr_decay_style,
                 "Megatron's flag: constant | linear | cosine | inverse-square-root | WSD (warmup-stable-decay)")
      ->capture_default_str();
  app.add_option("--lr-decay-iters", t.lr_decay_iters,
                 "Megatron's flag: iterations the LR decays over, to --min-lr (default: --train-iters)")
      ->each(chosen);
  app.add_option("--lr-warmup-fraction", t.lr_warmup_fraction,
                 "Megatron's flag: the warmup as a fraction of the LR decay span (fraction x decay iterations x "
                 "global batch samples, possibly not a whole iteration); not with --warmup-iters")
      ->each(chosen);
  app.add_option("--lr-wsd-decay-style", t.lr_wsd_decay_style,
                 "Megatron's flag: WSD's anneal: exponential | linear | cosine | minus_sqrt")
      ->capture_default_str();
  app.add_option("--lr-wsd-decay-iters", t.lr_wsd_decay_iters,
                 "Megatron's flag: WSD's anneal, the last N iterations of the decay span (required with WSD)");
}

void add_run_flags(CLI::App& app, TrainConfig& t, observe::StopConfig& stop) {
  app.add_option("--init-method-std", t.init_method_std,
                 "Megatron's flag: the standard deviation of the weights' normal initialisation (default: the "
                 "model config's init_method_std)");
  app.add_option("--exit-duration-in-mins", stop.exit_duration_in_mins,
                 "Megatron's flag: after the iteration during which this many minutes since start have passed, save "
                 "(with --save) and exit (0 = off)")
      ->capture_default_str();
  app.add_flag("--log-params-norm", t.log_params_norm,
               "Megatron's flag: ' params norm: X |' in the iteration line, the L2 norm of the FP32 master weights");
}

// One value's rule: finite and inside [low, high) (or (low, high) when low_open), one line naming the flag.
void check_range(const CLI::App& app, const char* flag, double v, double low, double high, bool low_open,
                 const char* rule) {
  if (!app.count(flag)) return;
  PL_CHECK(std::isfinite(v) && (low_open ? v > low : v >= low) && v < high, "{} must be {}, got {}", flag, rule, v);
}

}  // namespace

void add_schedule_flags(CLI::App& app, Options& o) {
  add_adamw_flags(app, o.train);
  add_lr_flags(app, o.train);
  add_run_flags(app, o.train, o.outputs.stop);
}

void validate_schedule_flags(const Options& o, const CLI::App& app) {
  const TrainConfig& t = o.train;
  const double inf = INFINITY;
  check_range(app, "--adam-beta1", t.adam_beta1, 0.0, 1.0, false, "in [0, 1)");
  check_range(app, "--adam-beta2", t.adam_beta2, 0.0, 1.0, false, "in [0, 1)");
  check_range(app, "--adam-eps", t.adam_eps, 0.0, inf, true, "a finite number > 0");
  check_range(app, "--weight-decay", t.weight_decay, 0.0, inf, false, "a finite number >= 0");
  check_range(app, "--start-weight-decay", t.start_weight_decay.value_or(0.0), 0.0, inf, false, "a finite number >= 0");
  check_range(app, "--end-weight-decay", t.end_weight_decay.value_or(0.0), 0.0, inf, false, "a finite number >= 0");
  check_range(app, "--clip-grad", t.clip_grad, 0.0, inf, false, "a finite number >= 0 (0 = no clipping)");
  check_range(app, "--lr-warmup-fraction", t.lr_warmup_fraction.value_or(0.0), 0.0, 1.0, false, "in [0, 1)");
  check_range(app, "--init-method-std", t.init_method_std, 0.0, inf, true, "a finite number > 0");
  check_range(app, "--exit-duration-in-mins", o.outputs.stop.exit_duration_in_mins, 0.0, inf, false, "a finite number >= 0 (0 = off)");
  for (const char* flag : {"--lr-decay-iters", "--lr-wsd-decay-iters"})
    PL_CHECK(!app.count(flag) || app.get_option(flag)->as<int64_t>() >= 1, "{} must be >= 1, got {}", flag,
             app.get_option(flag)->as<std::string>());
  const bool warmup_iters = app.count("--warmup-iters") || app.count("--lr-warmup-iters");
  PL_CHECK(!(warmup_iters && t.lr_warmup_fraction), "--lr-warmup-fraction {} cannot be combined with --warmup-iters {} "
           "(Megatron: can only specify one of lr-warmup-fraction and lr-warmup-iters)",
           t.lr_warmup_fraction.value_or(0.0), t.warmup_iters);
  PL_CHECK(!(app.count("--warmup-iters") && app.count("--lr-warmup-iters")),
           "--warmup-iters and --lr-warmup-iters are the same flag: give one");
  PL_CHECK(!(app.count("--init-method-std") && !o.init_from_hf.empty()),
           "--init-method-std {} has no effect with --init-from-hf (the weights are loaded, not drawn)",
           t.init_method_std);
  (void)LrSchedule::from_config(t);  // the rules between the flags (warmup vs decay span, WSD, weight decay)
}

void apply_init_method_std(const Options& o, RunSetup& s) {
  if (o.train.init_method_std > 0.0) s.mc.init_method_std = o.train.init_method_std;
}

}  // namespace pl::pretrain
