#include "log/run_records.h"

#include <fmt/format.h>

#include <csignal>

namespace pl::log {

const char* stop_cause_name(StopCause c) {
  switch (c) {
    case StopCause::TrainIters: return "train_iters";
    case StopCause::ExitInterval: return "exit_interval";
    case StopCause::Signal: return "signal";
    case StopCause::ExitDuration: return "exit_duration";
    case StopCause::Observer: return "observer";
  }
  return "?";
}

// Megatron's exit line names the signal.
std::string signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    default: return fmt::format("signal {}", sig);
  }
}

}  // namespace pl::log
