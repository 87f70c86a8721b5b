// Megatron's timers (core/timers.h) and the step timer (core/step_timer.h): CUDA events on the default
// stream, the steady clock on the CPU.
#include "core/timers.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <exception>
#include <utility>

#include "core/error.h"
#include "core/nvtx.h"
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
      std::fprintf(stderr, "%s: warning: %s failed: %s\n", program_invocation_short_name, what, cudaGetErrorString(st));
  }
}
#endif

}  // namespace

const char* timer_name(TimerId id) { return kInfo[idx(id)].name; }
int timer_level(TimerId id) { return kInfo[idx(id)].level; }

Timers::Timers(Device device, int level, bool op_rows) : device_(device), level_(level), op_rows_(op_rows) {
  PL_CHECK(level >= 0 && level <= kMaxLevel, "--timing-log-level must be 0, 1 or 2, got {}", level);
  running_.fill(kNotRunning);
#if defined(PL_WITH_CUDA)
  if (device_ == Device::CUDA && (level_ > 0 || op_rows_)) {
    const size_t pairs = level_ >= 2 || op_rows_ ? kPoolPairsLevel2 : kPoolPairsLevel1;
    events_.assign(2 * pairs, nullptr);
    pending_owner_.assign(pairs, TimerId::kCount);
    pending_row_.assign(pairs, -1);
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
    pending_row_[k] = static_cast<TimerId>(i) == op_category_ ? op_row_ : -1;
    running_[i] = kNotRunning;
    ++counts_[i];
    return;
  }
#endif
  const auto now = std::chrono::steady_clock::now();
  const double ms = std::chrono::duration<double, std::milli>(now - t0_[i]).count();
  sums_ms_[i] += ms;
  if (static_cast<TimerId>(i) == op_category_) add_row_ms(op_row_, ms);
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
    add_row_ms(pending_row_[k], static_cast<double>(ms));
  }
  next_pair_ = 0;
  for (size_t i = 0; i < kTimerCount; ++i)
    if (was_running[i]) record_start(i);
#endif
}

void Timers::begin_region(TimerId id) {
  rethrow_deferred();
  PL_CHECK(!running(id), "internal: timer {} started while running", timer_name(id));
  record_start(idx(id));
}

void Timers::end_region(TimerId id) {
  rethrow_deferred();
  PL_CHECK(running(id), "internal: timer {} stopped while not running", timer_name(id));
  record_stop(idx(id));
}

void Timers::start(TimerId id) {
  if (enabled(id)) begin_region(id);
}

void Timers::stop(TimerId id) {
  if (enabled(id)) end_region(id);
}

// An op's NVTX range (--profile) and its timer: the range whatever the level, the timer when the level
// or the op rows ask for it.
bool Timers::op_begin(TimerId id) {
  if (op_depth_ > 0) return false;
  const bool timed = op_timed(id);
  if (!timed && !nvtx::enabled()) return false;
  if (timed) {
    begin_region(id);
    op_category_ = id;
  }
  ++op_depth_;
  op_nvtx_ = nvtx::enabled();
  if (op_nvtx_) nvtx::push(timer_name(id));
  return true;
}

void Timers::op_end(TimerId id) noexcept {
  --op_depth_;
  if (std::exchange(op_nvtx_, false)) nvtx::pop();
  if (op_category_ != id) return;  // not timed
  try {
    end_region(id);
  } catch (const std::exception& e) {
    if (deferred_error_.empty()) deferred_error_ = e.what();
    running_[idx(id)] = kNotRunning;
  }
  op_category_ = TimerId::kCount;
  op_row_ = op_next_row_ = -1;
}

// ---- op rows ---------------------------------------------------------------------------------------

void Timers::set_op_rows_active(bool on) {
  PL_CHECK(!on || op_rows_, "internal: op rows activated on timers made without them");
  rows_active_ = on;
}

// The row of (c, tag), added on first sight; its calls and costs grow by this call's.
int Timers::row_of(const OpCost& c, OpTag tag, TimerId category) {
  const OpRowKey key{c.op, tag, c.kind, c.format};
  auto it = std::find_if(rows_.begin(), rows_.end(), [&](const OpRow& r) { return r.key == key; });
  if (it == rows_.end()) it = rows_.insert(rows_.end(), OpRow{.key = key, .category = category});
  ++it->calls;
  it->flops += c.flops;
  it->bytes += c.bytes;
  it->working_set = std::max(it->working_set, c.working_set);
  return static_cast<int>(it - rows_.begin());
}

void Timers::op_attach(const OpCosts& costs, OpTag tag) {
  if (!op_rows_active() || op_category_ == TimerId::kCount) return;
  op_row_ = row_of(costs.phase[0], tag, op_category_);
  op_next_row_ = costs.phases > 1 ? row_of(costs.phase[1], tag, op_category_) : -1;
}

// The running op's time is split at this point: its category's region stops (the first phase's row
// gets it) and starts again at once for the second phase, so the category's sum is unchanged.
void Timers::op_next_phase() {
  if (op_next_row_ < 0 || !running(op_category_)) return;
  record_stop(idx(op_category_));
  --counts_[idx(op_category_)];
  op_row_ = std::exchange(op_next_row_, -1);
  record_start(idx(op_category_));
}

std::span<const OpRow> Timers::op_rows() {
  drain();
  return rows_;
}

void Timers::clear_op_rows() {
  drain();
  rows_.clear();
  op_row_ = op_next_row_ = -1;
}

std::span<const TimerReading> Timers::read(double normalizer) {
  rethrow_deferred();
  PL_CHECK(normalizer > 0.0, "internal: timers read with normalizer {}", normalizer);
  drain();
  size_t n = 0;
  for (size_t i = 0; i < kTimerCount; ++i) {
    if (counts_[i] > 0 && enabled(static_cast<TimerId>(i)))
      readings_[n++] = {static_cast<TimerId>(i), kInfo[i].name, sums_ms_[i] / normalizer};
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
