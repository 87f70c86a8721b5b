#include "observe/roofline_report.h"

#include "core/error.h"
#include "core/timers.h"
#include "io/atomic_file.h"

namespace pl::observe {

void validate_roofline_config(const RooflineConfig& c) {
  PL_CHECK(!c.at_log_interval || c.on, "--roofline-at-log-interval needs --roofline");
}

RooflineReport::RooflineReport(const RooflineConfig& c, const ProfileConfig& window,
                               std::shared_ptr<const roofline::MachineCeilings> ceilings, roofline::ReportContext context,
                               LineFn out)
    : cfg_(c), window_(window), ceilings_(std::move(ceilings)), context_(std::move(context)), out_(std::move(out)) {
  PL_CHECK(ceilings_ != nullptr, "internal: a roofline report without the machine's ceilings");
}

void RooflineReport::on_start(const RunStart& s, TrainerAccess&) {
  timers_ = &s.timers;
  first_iteration_ = s.first_iteration;
  train_iters_ = s.cfg.train_iters;
  m_ = {};
  reported_final_ = false;
}

bool RooflineReport::measured(int64_t iteration) const {
  if (window_.on) return window_.covers(iteration);
  const bool runs_one = train_iters_ - first_iteration_ + 1 <= 1;
  return runs_one || iteration > first_iteration_;
}

void RooflineReport::before_iteration(int64_t iteration, IterationRequests&) {
  measuring_ = measured(iteration);
  if (measuring_) timers_->set_op_rows_active(true);
}

void RooflineReport::on_iteration(const log::IterationRecord& it) {
  if (!measuring_) return;
  timers_->set_op_rows_active(false);
  if (m_.iterations++ == 0) m_.first_iteration = it.iteration;
  m_.last_iteration = it.iteration;
  m_.step_ms_sum += it.seconds * 1e3;
  measuring_ = false;
}

// (The last iteration's table is the final one, printed once when the run ends.)
void RooflineReport::on_interval(const log::IntervalRecord& r) {
  if (cfg_.at_log_interval && r.iteration != train_iters_) report(false);
}

// The final table after the last iteration's checkpoint, before the evaluations after training.
void RooflineReport::on_iteration_end(const IterationEnd& e, TrainerAccess&) {
  if (e.last) report(true);
}

void RooflineReport::on_end(const log::RunEnd&) {
  if (!reported_final_) report(true);  // (a run that ran no iteration)
}

void RooflineReport::report(bool final) {
  reported_final_ = reported_final_ || final;
  if (m_.iterations == 0) {
    if (final) out_("roofline | no iteration was measured (the --profile window lies outside this run)");
    return;
  }
  m_.rows = timers_->op_rows();
  const roofline::Report r = roofline::build_report(m_, *ceilings_, context_);
  for (const std::string& line : roofline::report_lines(r)) out_(line);
  if (!cfg_.json.empty()) {
    write_file_atomically(cfg_.json, roofline::report_json_text(r));
    if (final) out_("roofline | report written to " + cfg_.json);
  }
}

}  // namespace pl::observe
