#pragma once
// What the training tests watch a run with: an observer that keeps every record it is given (train/observer.h),
// and a text log whose lines go into a vector.
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "observe/megatron_text_log.h"
#include "train/observer.h"

namespace pl::test {

// Every event of the runs it observes, in order.
struct RunRecorder : TrainObserver {
  std::vector<log::IterationRecord> iterations;
  std::vector<log::IntervalRecord> intervals;
  std::vector<log::EvalRecord> evals;
  std::vector<TrainState> states;  // after each iteration (on_iteration_end)
  std::vector<bool> last;          // on_iteration_end's `last`
  std::optional<log::RunEnd> end;
  int starts = 0;

  void on_start(const RunStart&, TrainerAccess&) override { ++starts; }
  void on_iteration(const log::IterationRecord& it) override { iterations.push_back(it); }
  void on_interval(const log::IntervalRecord& r) override { intervals.push_back(r); }
  void on_eval(const log::EvalRecord& e) override { evals.push_back(e); }
  void on_iteration_end(const IterationEnd& e, TrainerAccess&) override {
    states.push_back(e.state);
    last.push_back(e.last);
  }
  void on_end(const log::RunEnd& e) override { end = e; }

  // Per iteration: the loss (NaN when it was not finite), the gradient norm, the learning rate its step used.
  std::vector<double> loss() const { return values(&log::IterationRecord::lm_loss); }
  std::vector<double> grad_norm() const { return values(&log::IterationRecord::grad_norm); }
  std::vector<double> lr_used() const { return values(&log::IterationRecord::lr_used); }
  // The in-loop validation losses (iteration, loss).
  std::vector<std::pair<int64_t, double>> valid_loss() const {
    std::vector<std::pair<int64_t, double>> v;
    for (const log::EvalRecord& e : evals)
      if (!e.after_training && !e.test_split) v.emplace_back(e.iteration, e.lm_loss);
    return v;
  }

 private:
  std::vector<double> values(double log::IterationRecord::*field) const {
    std::vector<double> v;
    for (const log::IterationRecord& it : iterations) v.push_back(it.*field);
    return v;
  }
};

// The Megatron text log into `lines`.
inline std::unique_ptr<observe::MegatronTextLog> text_log_into(std::vector<std::string>& lines,
                                                               const std::string& timing_log_option = "minmax") {
  return std::make_unique<observe::MegatronTextLog>([&lines](const std::string& l) { lines.push_back(l); },
                                                    timing_log_option);
}

}  // namespace pl::test
