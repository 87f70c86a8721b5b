#pragma once
// check::<op>: every shape, dtype and device rule of an op (backend/op_list.h), checked once before
// dispatch (backend/ops.cpp) with one-line errors; the backends then assume valid arguments.
#include "backend/ops.h"
#include "backend/quantize.h"

namespace pl::check {
#define PL_OP(name, ret, timer, params, args) void name params;
#define PL_QUANT_OP PL_OP
#include "backend/op_list.h"
}  // namespace pl::check
