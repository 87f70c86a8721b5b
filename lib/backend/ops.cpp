// The dispatcher of every op of backend/op_list.h: the device must have a backend (a build without
// CUDA fails naming the op), the arguments are checked once (check::<op>, backend/op_checks.cpp; no
// GPU needed for that), a CUDA op needs its device state (ctx.gpu), the op is timed by an OpTimer of its category
// on ctx.timers (core/timers.h: --timing-log-level; with timing off that is one branch per op) and runs on
// ctx.device's backend.
#include "backend/ops.h"

#include "backend/cpu/cpu_ops.h"
#include "backend/op_checks.h"
#include "backend/op_costs.h"
#include "backend/quantize.h"
#include "core/error.h"
#include "core/timers.h"

#if defined(PL_WITH_CUDA)
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_state.h"
#endif

namespace pl {

namespace {

// Before the argument checks: a CUDA op needs the CUDA backend.
void require_backend(const OpContext& ctx, const char* op) {
#if !defined(PL_WITH_CUDA)
  PL_CHECK(ctx.device == Device::CPU,
           "op {} needs the CUDA backend, which this build does not have (configure with nvcc present)", op);
#else
  (void)ctx;
  (void)op;
#endif
}

// After them (so arguments are judged without a GPU): a CUDA op runs on a device state.
void require_state(const OpContext& ctx, const char* op) {
  PL_CHECK(ctx.device == Device::CPU || ctx.gpu != nullptr,
           "{}: the OpContext of the cuda device has no device state (open one with open_device_state)", op);
}

// The timer category of a quantized GEMM (--timing-log-level 2): by A's format; FP8 E4M3 and E5M2
// (Megatron's "hybrid") are one category.
TimerId gemm_timer(QuantFormat f) {
  switch (f) {
    case QuantFormat::NVFP4: return TimerId::GemmNvfp4;
    case QuantFormat::MXFP8: return TimerId::GemmMxfp8;
    case QuantFormat::FP8_E4M3:
    case QuantFormat::FP8_E5M2: return TimerId::GemmFp8;
  }
  return TimerId::GemmFp8;
}

}  // namespace

#if defined(PL_WITH_CUDA)
#define PL_CUDA_CALL(name, args) return cuda::name args
#else
#define PL_CUDA_CALL(name, args) fail("unreachable: {} without the CUDA backend", #name)
#endif

#define PL_OP(name, ret, timer, params, args)                  \
  ret name params {                                            \
    require_backend(ctx, #name);                               \
    check::name args;                                          \
    require_state(ctx, #name);                                 \
    const OpTimer op_timer(ctx.timers, timer);                 \
    if (op_timer.measuring_rows())                             \
      op_timer.attach(#name, ctx.tag, cost::name args);        \
    if (ctx.device == Device::CPU) return cpu::name args;      \
    PL_CUDA_CALL(name, args);                                  \
  }
#define PL_QUANT_OP PL_OP
#include "backend/op_list.h"
#undef PL_CUDA_CALL

void op_next_phase(const OpContext& ctx) {
  if (ctx.timers != nullptr) ctx.timers->op_next_phase();
}

void adamw_update(const OpContext& ctx, const Tensor& param, const Tensor& master, const Tensor& grad,
                  const Tensor& m, const Tensor& v, const AdamWStep& step) {
  adamw_update_multi(ctx, param, master, grad, m, v, ElementRanges{}, step);
}

void DeviceStateDeleter::operator()(cuda::DeviceState* s) const {
#if defined(PL_WITH_CUDA)
  cuda::close_device_state(s);
#else
  (void)s;
#endif
}

DeviceStateHandle open_device_state(Device device) {
  if (device == Device::CPU) return {};
#if defined(PL_WITH_CUDA)
  return DeviceStateHandle(cuda::open_device_state());
#else
  fail("open_device_state: this build has no CUDA backend (configure with nvcc present)");
#endif
}

int device_sm(const OpContext& ctx) {
#if defined(PL_WITH_CUDA)
  if (ctx.device == Device::CUDA && ctx.gpu != nullptr) return cuda::device_sm(*ctx.gpu);
#else
  (void)ctx;
#endif
  return 0;
}

}  // namespace pl
