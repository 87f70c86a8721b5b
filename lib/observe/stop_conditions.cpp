#include "observe/stop_conditions.h"

#include <cmath>

#include "core/error.h"

namespace pl::observe {

void validate_stop_config(const StopConfig& c) {
  PL_CHECK(c.exit_interval >= 0, "--exit-interval must be >= 0 (0 = off), got {}", c.exit_interval);
  PL_CHECK(c.max_consecutive_nan_iterations >= 1, "--max-nan-iterations must be >= 1, got {}",
           c.max_consecutive_nan_iterations);
}

StopConditions::StopConditions(const StopConfig& c, const volatile std::sig_atomic_t* signal_flag,
                               std::chrono::steady_clock::time_point program_start)
    : cfg_(c), signal_flag_(signal_flag), program_start_(program_start) {
  validate_stop_config(c);
}

void StopConditions::on_start(const RunStart& s, TrainerAccess&) { world_ = &s.world; }

// Megatron's order (training.py, train()): the NaN limit, the exit interval, the signal, the wall time. The
// signal and the wall time are combined over the ranks every iteration (a collective on every rank), and
// count only when the iteration is not the last anyway.
log::StopRequest StopConditions::stop_requested(const log::IterationRecord& it) {
  if (it.consecutive_nan >= cfg_.max_consecutive_nan_iterations)
    fail("stopping: {} consecutive iterations had a non-finite loss or gradient norm (last at iteration {}); "
         "lower --lr or check the data",
         it.consecutive_nan, it.iteration);
  log::StopRequest stop;
  if (cfg_.exit_interval > 0 && it.iteration % cfg_.exit_interval == 0 && it.iteration < it.train_iters)
    stop.cause = log::StopCause::ExitInterval;
  const bool last = it.iteration == it.train_iters || stop;
  if (const int sig = signal_seen(); sig != 0 && !last) return {log::StopCause::Signal, sig, 0.0};
  if (const double minutes = exit_duration_minutes(); minutes > 0.0 && !last)
    return {log::StopCause::ExitDuration, 0, minutes};
  return stop;
}

// --exit-duration-in-mins (Megatron's training.py after every iteration: the minutes since the program
// started, the ranks' decisions combined with a MAX all-reduce, then save and exit): this rank's elapsed
// minutes when any rank is past the budget, else 0.
double StopConditions::exit_duration_minutes() const {
  if (!(cfg_.exit_duration_in_mins > 0.0)) return 0.0;
  const double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - program_start_).count() / 60.0;
  const double over = minutes > cfg_.exit_duration_in_mins ? 1.0 : 0.0;
  return (world_->size() > 1 ? world_->all_reduce_sum(over) : over) > 0.0 ? minutes : 0.0;
}

// --exit-signal-handler (Megatron's DistributedSignalHandler: every rank's signal state is gathered after
// each iteration, and a signal on any rank stops all): the signal received, or 0.
int StopConditions::signal_seen() const {
  if (signal_flag_ == nullptr) return 0;
  const int sig = *signal_flag_;
  const double signalled = world_->size() > 1 ? world_->all_reduce_sum(sig != 0 ? 1.0 : 0.0) : (sig != 0 ? 1.0 : 0.0);
  if (!(signalled > 0.0)) return 0;
  return sig != 0 ? sig : SIGTERM;  // (another rank's signal; SIGTERM is what launchers send)
}

}  // namespace pl::observe
