// Megatron's timers (core/timers.h) and the step timer (core/step_timer.h): CUDA events on the default
// stream, the steady clock on the CPU.
#include "core/timers.h"

#include <cstdio>
#include <exception>
#include <utility>

#include "core/error.h"
#include "core/step_timer.h"

#if defined(PL_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace pl {

namespace {

struct TimerInfo {
  const char* name;
  int level;
};
// Indexed by TimerId. Names and levels of the Megatron timers: megatron/training/training.py
// (training_log's timers_to_log), megatron/core/optimizer/optimizer.py, and
// megatron/core/pipeline_parallel/schedules.py (where each is created with its log_level).
constexpr std::array<TimerInfo, kTimerCount> kInfo = {{
    {"forward-backward", 1},
    {"optimizer-copy-to-main-grad", 1},
    {"optimizer-clip-main-grad", 1},
    {"optimizer-inner-step", 1},
    {"optimizer-copy-main-to-model-params", 1},
    {"optimizer", 1},
    {"all-grads-sync", 1},
    {"params-all-gather", 1},
    {"batch-generator", 2},
    {"forward-compute", 2},
    {"backward-compute", 2},
    {"gemm-bf16", 2},
    {"gemm-fp8", 2},
    {"gemm-mxfp8", 2},
    {"gemm-nvfp4", 2},
    {"attention", 2},
    {"quantization", 2},
    {"quant-stats", 2},
    {"rmsnorm", 2},
    {"rope", 2},
    {"swiglu", 2},
    {"embedding", 2},
    {"cross-entropy", 2},
    {"elementwise", 2},
}};

constexpr size_t idx(TimerId id) { return static_cast<size_t>(id); }

#if defined(PL_WITH_CUDA)
void check(cudaError_t st, const char* what) {
  PL_CHECK(st == cudaSuccess, "{} failed: {}", what, cudaGetErrorString(st));
}

// For destructors, which must not throw: every event destroyed, the first failure reported on stderr.
void destroy_events(std::span<void* const> events, const char* what) {
  bool warned = false;
  for (void* e : events) {
    const cudaError_t st = e != nullptr ? cudaEventDestroy(static_cast<cudaEvent_t>(e)) : cudaSuccess;
    if (st != cudaSuccess && !std::exchange(warned, true))
      std::fprintf(stderr, "pretrain_llama: warning: %s failed: %s\n", what, cudaGetErrorString(st));
  }
}
#endif

}  // namespace

const char* timer_name(TimerId id) { return kInfo[idx(id)].name; }
int timer_level(TimerId id) { return kInfo[idx(id)].level; }

Timers::Timers(Device device, int level) : device_(device), level_(level) {
  PL_CHECK(level >= 0 && level <= kMaxLevel, "--timing-log-level must be 0, 1 or 2, got {}", level);
  running_.fill(kNotRunning);
#if defined(PL_WITH_CUDA)
  if (device_ == Device::CUDA && level_ > 0) {
    const size_t pairs = level_ >= 2 ? kPoolPairsLevel2 : kPoolPairsLevel1;
    events_.assign(2 * pairs, nullptr);
    pending_owner_.assign(pairs, TimerId::kCount);
    for (void*& e : events_) {
      cudaEvent_t ev;
      check(cudaEventCreate(&ev), "cudaEventCreate (timers)");
      e = ev;
    }
  }
#endif
}

Timers::~Timers() {
#if defined(PL_WITH_CUDA)
  destroy_events(events_, "cudaEventDestroy (timers)");
#endif
}

void Timers::rethrow_deferred() {
  if (deferred_error_.empty()) return;
  const std::string msg = std::move(deferred_error_);
  deferred_error_.clear();
  fail("{}", msg);
}

// CUDA: pair k's start event. CPU: the clock.
void Timers::record_start(size_t i) {
#if defined(PL_WITH_CUDA)
  if (device_ == Device::CUDA) {
    if (next_pair_ == pending_owner_.size()) drain();
    const size_t k = next_pair_++;
    pending_owner_[k] = TimerId::kCount;  // started, not stopped
    auto* ev = static_cast<cudaEvent_t>(events_[2 * k]);
    check(cudaEventRecord(ev, 0), "cudaEventRecord (timer start)");
    last_recorded_ = ev;
    running_[i] = static_cast<uint32_t>(k);
    return;
  }
#endif
  t0_[i] = std::chrono::steady_clock::now();
  running_[i] = 0;
}

void Timers::record_stop(size_t i) {
#if defined(PL_WITH_CUDA)
  if (device_ == Device::CUDA) {
    const size_t k = running_[i];
    auto* ev = static_cast<cudaEvent_t>(events_[2 * k + 1]);
    check(cudaEventRecord(ev, 0), "cudaEventRecord (timer stop)");
    last_recorded_ = ev;
    pending_owner_[k] = static_cast<TimerId>(i);
    running_[i] = kNotRunning;
    ++counts_[i];
    return;
  }
#endif
  const auto now = std::chrono::steady_clock::now();
  sums_ms_[i] += std::chrono::duration<double, std::milli>(now - t0_[i]).count();
  running_[i] = kNotRunning;
  ++counts_[i];
}

void Timers::drain() {
#if defined(PL_WITH_CUDA)
  if (device_ != Device::CUDA || next_pair_ == 0) return;
  // A running timer is split at this point: stopped now and restarted on a fresh pair right after,
  // with nothing queued in between, so its sum is unchanged (its region count grows by one).
  std::array<bool, kTimerCount> was_running{};
  for (size_t i = 0; i < kTimerCount; ++i)
    if (running_[i] != kNotRunning) {
      was_running[i] = true;
      record_stop(i);
      --counts_[i];
    }
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(last_recorded_)), "cudaEventSynchronize (timers)");
  for (size_t k = 0; k < next_pair_; ++k) {
    const TimerId owner = pending_owner_[k];
    if (owner == TimerId::kCount) continue;
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(events_[2 * k]), static_cast<cudaEvent_t>(events_[2 * k + 1])),
          "cudaEventElapsedTime (timers)");
    sums_ms_[idx(owner)] += static_cast<double>(ms);
  }
  next_pair_ = 0;
  for (size_t i = 0; i < kTimerCount; ++i)
    if (was_running[i]) record_start(i);
#endif
}

void Timers::start(TimerId id) {
  if (!enabled(id)) return;
  rethrow_deferred();
  PL_CHECK(!running(id), "internal: timer {} started while running", timer_name(id));
  record_start(idx(id));
}

void Timers::stop(TimerId id) {
  if (!enabled(id)) return;
  rethrow_deferred();
  PL_CHECK(running(id), "internal: timer {} stopped while not running", timer_name(id));
  record_stop(idx(id));
}

void Timers::mark_loss_computed() {
  if (!running(TimerId::ForwardCompute)) return;
  stop(TimerId::ForwardCompute);
  start(TimerId::BackwardCompute);
}

bool Timers::op_begin(TimerId id) {
  if (op_depth_ > 0 || !enabled(id)) return false;
  start(id);
  ++op_depth_;
  return true;
}

void Timers::op_end(TimerId id) noexcept {
  --op_depth_;
  try {
    stop(id);
  } catch (const std::exception& e) {
    if (deferred_error_.empty()) deferred_error_ = e.what();
    running_[idx(id)] = kNotRunning;
  }
}

std::span<const TimerReading> Timers::read(double normalizer) {
  rethrow_deferred();
  PL_CHECK(normalizer > 0.0, "internal: timers read with normalizer {}", normalizer);
  drain();
  size_t n = 0;
  for (size_t i = 0; i < kTimerCount; ++i) {
    if (counts_[i] > 0) readings_[n++] = {static_cast<TimerId>(i), kInfo[i].name, sums_ms_[i] / normalizer};
    sums_ms_[i] = 0.0;
    counts_[i] = 0;
  }
  return {readings_.data(), n};
}

// ---- the step timer ------------------------------------------------------------------------------

StepTimer::StepTimer(Device device) : device_(device) {
#if defined(PL_WITH_CUDA)
  if (device_ == Device::CUDA) {
    cudaEvent_t a, b;
    check(cudaEventCreate(&a), "cudaEventCreate (step timer)");
    check(cudaEventCreate(&b), "cudaEventCreate (step timer)");
    start_event_ = a;
    stop_event_ = b;
  }
#endif
}

StepTimer::~StepTimer() {
#if defined(PL_WITH_CUDA)
  void* const events[] = {start_event_, stop_event_};
  destroy_events(events, "cudaEventDestroy");
#endif
}

void StepTimer::start() {
#if defined(PL_WITH_CUDA)
  if (device_ == Device::CUDA) {
    check(cudaEventRecord(static_cast<cudaEvent_t>(start_event_)), "cudaEventRecord (step start)");
    return;
  }
#endif
  t0_ = std::chrono::steady_clock::now();
}

double StepTimer::stop_seconds() {
#if defined(PL_WITH_CUDA)
  if (device_ == Device::CUDA) {
    auto* a = static_cast<cudaEvent_t>(start_event_);
    auto* b = static_cast<cudaEvent_t>(stop_event_);
    check(cudaEventRecord(b), "cudaEventRecord (step stop)");
    check(cudaEventSynchronize(b), "cudaEventSynchronize (step stop)");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    return ms / 1000.0;
  }
#endif
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

DeviceMemoryInfo device_memory_info([[maybe_unused]] Device device) {
  DeviceMemoryInfo m;
#if defined(PL_WITH_CUDA)
  if (device == Device::CUDA) check(cudaMemGetInfo(&m.free, &m.total), "cudaMemGetInfo");
#endif
  return m;
}

}  // namespace pl
