#include "core/nvtx.h"

#include <atomic>

#if defined(PL_WITH_CUDA)
#include <nvtx3/nvToolsExt.h>
#endif

namespace pl::nvtx {

namespace {
// Read by every op of every thread; relaxed: a range missed or added around the switch is harmless.
std::atomic<bool> g_enabled{false};
}  // namespace

void set_enabled(bool on) { g_enabled.store(on, std::memory_order_relaxed); }
bool enabled() { return g_enabled.load(std::memory_order_relaxed); }

#if defined(PL_WITH_CUDA)

void push(const char* name) {
  if (enabled()) nvtxRangePushA(name);
}

void pop() {
  if (enabled()) nvtxRangePop();
}

Range::Range(const char* name) : pushed_(enabled()) {
  if (pushed_) nvtxRangePushA(name);
}

Range::~Range() {
  if (pushed_) nvtxRangePop();
}

#else

void push(const char*) {}
void pop() {}
Range::Range(const char*) : pushed_(false) {}
Range::~Range() {}

#endif

}  // namespace pl::nvtx
