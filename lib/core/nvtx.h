#pragma once
// NVTX ranges (NVIDIA Tools Extension) for Nsight Systems / Nsight Compute: named, nested ranges on the
// host timeline around each iteration and op category, as Megatron's --profile with nvtx_ranges puts
// them (megatron/training/training.py, configure_nvtx_profiling).
//
// Off by default: push/pop then return at once (one relaxed atomic load), so a run without --profile
// pays nothing; the trainer turns them on for --profile. In a CUDA build they call nvtxRangePushA /
// nvtxRangePop of the toolkit's header-only NVTX 3 (nvtx3/nvToolsExt.h: no library to link; without a
// tool attached each call returns at once); without CUDA they do nothing.
namespace pl::nvtx {

void set_enabled(bool on);
bool enabled();

// A range opened by push is closed by the next pop on the same thread (NVTX's thread-local stack).
// Switch set_enabled between iterations, where no range is open, so pushes and pops stay paired.
void push(const char* name);
void pop();

// push in the constructor, pop in the destructor. Whether it pushed is remembered, so a range open
// when set_enabled(false) is called is still closed.
class Range {
 public:
  explicit Range(const char* name);
  ~Range();
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  bool pushed_;
};

}  // namespace pl::nvtx
