#pragma once
// Megatron's --profile / --profile-step-start / --profile-step-end / --profile-ranks
// (megatron/training/config/common_config.py ProfilingConfig; megatron/training/training.py train()): a window
// for Nsight Systems / Nsight Compute (nsys profile --capture-range=cudaProfilerApi), with NVTX ranges on.
// Megatron's counter `iteration` holds the iterations completed so far (the checkpoint's on a resume):
// cudaProfilerStart is called at the top of the loop when iteration == start, before that step runs, and
// cudaProfilerStop after a step when the incremented counter == end. So the window covers the 1-based
// iterations start+1 .. end (the defaults 10 and 12: iterations 11 and 12, the numbers of the log's iteration
// lines); a start below the resumed iteration never opens it. Only on the ranks listed. Defaults: Megatron's
// 10 and 12; ranks {0}, Megatron's default until Feb 2026 (Megatron-LM #3273 made it [] = every rank; one rank
// is the usual Nsight use and what this project keeps). On the CPU the window bounds the roofline's
// measurement (observe/roofline_report.h) instead.
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "train/observer.h"

namespace pl::observe {

struct ProfileConfig {
  bool on = false;  // --profile
  int64_t step_start = 10;
  int64_t step_end = 12;
  std::vector<int64_t> ranks{0};
  // The 1-based iterations the window covers: step_start + 1 .. step_end.
  bool covers(int64_t iteration) const { return on && iteration > step_start && iteration <= step_end; }
};
// Megatron checks none of these (the window just never opens); a window that cannot open is refused here,
// one line naming the flag. As in Megatron, the --profile-step-* flags without --profile are accepted and do
// nothing.
void validate_profile_config(const ProfileConfig& c, int64_t data_parallel_size);

class ProfilerWindow : public TrainObserver {
 public:
  explicit ProfilerWindow(const ProfileConfig& c);
  // NVTX ranges come from the ops' timers, so every op reports to them while profiling.
  Instruments instruments() const override { return {false, true}; }
  void on_start(const RunStart& s, TrainerAccess&) override;
  void before_iteration(int64_t iteration, IterationRequests&) override;
  void on_iteration(const log::IterationRecord& it) override;

 private:
  ProfileConfig cfg_;
  bool listed_ = false;  // this rank is one of --profile-ranks
  Device device_ = Device::CPU;
};

}  // namespace pl::observe
