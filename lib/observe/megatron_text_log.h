#pragma once
// The Megatron text log: the lines Megatron-LM and Megatron-Bridge print during training, to the character
// (SPEC-MEGATRON §1a; formats in log/megatron_log.h), from the run's records. Megatron's ranks: the
// iteration, timer, validation and summary lines from the last rank (print_rank_last), the memory line and
// the exit lines from rank 0.
#include <functional>
#include <string>

#include "train/observer.h"

namespace pl::observe {

// Receives each output line (without newline).
using LineFn = std::function<void(const std::string&)>;

class MegatronTextLog : public TrainObserver {
 public:
  // timing_log_option: --timing-log-option (max | minmax | all) for the timer block.
  explicit MegatronTextLog(LineFn out, std::string timing_log_option = "minmax");
  void on_start(const RunStart& s, TrainerAccess&) override;
  void on_interval(const log::IntervalRecord& r) override;
  void on_eval(const log::EvalRecord& e) override;
  void on_downstream_eval(const log::DownstreamEvalRecord& r) override;
  // A global batch whose every label is masked is said once (its loss prints as 0, its gradients are zero).
  void on_iteration(const log::IterationRecord& it) override;
  void on_iteration_end(const IterationEnd& e, TrainerAccess&) override;
  void on_end(const log::RunEnd& e) override;

 private:
  void print_last(const std::string& line) const {
    if (last_rank_) out_(line);
  }
  void print_first(const std::string& line) const {
    if (first_rank_) out_(line);
  }
  LineFn out_;
  std::string timing_log_option_;
  bool first_rank_ = true, last_rank_ = true;
  bool memory_reported_ = false;
  bool all_masked_reported_ = false;
};

// The summary line of a run (the last rank's timings), and the exit-interval line before it.
std::vector<std::string> summary_lines(const log::RunEnd& e);

}  // namespace pl::observe
