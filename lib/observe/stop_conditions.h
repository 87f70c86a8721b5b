#pragma once
// When a run stops before --train-iters, decided after each iteration as Megatron's train() does: too many
// consecutive non-finite iterations (an error), --exit-interval, a SIGTERM/SIGINT (--exit-signal-handler),
// --exit-duration-in-mins. An early stop saves a checkpoint (with --save) and skips the evaluations after
// training.
#include <chrono>
#include <csignal>
#include <cstdint>

#include "train/observer.h"

namespace pl::observe {

struct StopConfig {
  int64_t exit_interval = 0;                    // --exit-interval: stop after an iteration divisible by it; 0 = off
  double exit_duration_in_mins = 0.0;           // --exit-duration-in-mins: save and stop after this wall time; 0 = off
  int64_t max_consecutive_nan_iterations = 10;  // --max-nan-iterations: then stop with an error
};
// One-line errors naming the flag.
void validate_stop_config(const StopConfig& c);

class StopConditions : public TrainObserver {
 public:
  // signal_flag (Megatron's --exit-signal-handler): set by a signal handler to the signal's number, read after
  // every iteration on every rank (any rank's signal stops all); null: signals are not watched.
  // program_start: where --exit-duration-in-mins counts from (Megatron's _TRAIN_START_TIME).
  StopConditions(const StopConfig& c, const volatile std::sig_atomic_t* signal_flag,
                 std::chrono::steady_clock::time_point program_start);
  void on_start(const RunStart& s, TrainerAccess&) override;
  log::StopRequest stop_requested(const log::IterationRecord& it) override;

 private:
  int signal_seen() const;
  double exit_duration_minutes() const;
  StopConfig cfg_;
  const volatile std::sig_atomic_t* signal_flag_;
  std::chrono::steady_clock::time_point program_start_;
  const parallel::World* world_ = nullptr;
};

}  // namespace pl::observe
