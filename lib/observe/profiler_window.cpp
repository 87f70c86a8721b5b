#include "observe/profiler_window.h"

#include <algorithm>

#include "backend/profiler.h"
#include "core/error.h"
#include "core/nvtx.h"
#include "model/llama.h"

namespace pl::observe {

void validate_profile_config(const ProfileConfig& c, int64_t data_parallel_size) {
  PL_CHECK(c.step_start >= 0, "--profile-step-start must be >= 0, got {}", c.step_start);
  PL_CHECK(c.step_end > c.step_start,
           "--profile-step-end {} must be greater than --profile-step-start {} (the window is iterations start+1 "
           "to end)",
           c.step_end, c.step_start);
  for (const int64_t rank : c.ranks)
    PL_CHECK(rank >= 0 && rank < data_parallel_size,
             "--profile-ranks: rank {} is outside the data-parallel world of {} rank(s) (0 to {})", rank,
             data_parallel_size, data_parallel_size - 1);
}

ProfilerWindow::ProfilerWindow(const ProfileConfig& c) : cfg_(c) {}

void ProfilerWindow::on_start(const RunStart& s, TrainerAccess&) {
  listed_ = cfg_.on && std::find(cfg_.ranks.begin(), cfg_.ranks.end(), s.world.rank()) != cfg_.ranks.end();
  device_ = s.model.context().device;
}

// Before the step when the iterations completed equal --profile-step-start.
void ProfilerWindow::before_iteration(int64_t iteration, IterationRequests&) {
  if (!listed_ || iteration - 1 != cfg_.step_start) return;
  profiler_start(device_);
  nvtx::set_enabled(true);
}

// After the step that makes them --profile-step-end.
void ProfilerWindow::on_iteration(const log::IterationRecord& it) {
  if (!listed_ || it.iteration != cfg_.step_end) return;
  nvtx::set_enabled(false);
  profiler_stop(device_);
}

}  // namespace pl::observe
