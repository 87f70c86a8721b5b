#pragma once
// --roofline [FILE]: every op of the training step timed over a window of iterations and judged against
// this machine's measured ceilings (roofline/report.h): the table ("roofline |" lines) at the end of the
// run, or at every --log-interval too with --roofline-at-log-interval, and its JSON in FILE
// (scripts/roofline_plot.py reads it). The window: Megatron's --profile window when --profile is given,
// else every iteration this process runs but its first (which builds plans and warms caches) unless it runs
// only one. Rank 0's: it measures its own ops (the other ranks run unmeasured).
#include <memory>
#include <string>

#include "observe/megatron_text_log.h"
#include "observe/profiler_window.h"
#include "roofline/report.h"

namespace pl::observe {

struct RooflineConfig {
  bool on = false;               // --roofline
  std::string json;              // its FILE ("" = the table only)
  bool at_log_interval = false;  // --roofline-at-log-interval
};
void validate_roofline_config(const RooflineConfig& c);  // --roofline-at-log-interval needs --roofline

class RooflineReport : public TrainObserver {
 public:
  RooflineReport(const RooflineConfig& c, const ProfileConfig& window, std::shared_ptr<const roofline::MachineCeilings> ceilings,
                 roofline::ReportContext context, LineFn out);
  Instruments instruments() const override { return {true, true}; }
  void on_start(const RunStart& s, TrainerAccess&) override;
  void before_iteration(int64_t iteration, IterationRequests&) override;
  void on_iteration(const log::IterationRecord& it) override;
  void on_interval(const log::IntervalRecord& r) override;
  void on_iteration_end(const IterationEnd& e, TrainerAccess&) override;
  void on_end(const log::RunEnd& e) override;

 private:
  bool measured(int64_t iteration) const;
  void report(bool final);
  RooflineConfig cfg_;
  ProfileConfig window_;
  std::shared_ptr<const roofline::MachineCeilings> ceilings_;
  roofline::ReportContext context_;
  LineFn out_;
  Timers* timers_ = nullptr;
  int64_t first_iteration_ = 1, train_iters_ = 0;
  roofline::Measurement m_;
  bool measuring_ = false, reported_final_ = false;
};

}  // namespace pl::observe
