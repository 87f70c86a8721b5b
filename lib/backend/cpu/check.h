#pragma once
// Argument checks shared by the CPU ops: one-line errors that name the op, the argument and its shape.
#include "core/error.h"
#include "core/tensor.h"

namespace pl::cpu {

// t must live on the CPU with dtype `dtype` and, when ndim >= 0, exactly ndim dimensions.
inline void check_cpu(const char* op, const char* name, const Tensor& t, DType dtype = DType::F32, int ndim = -1) {
  PL_CHECK(t.device == Device::CPU && t.dtype == dtype && (ndim < 0 || t.ndim == ndim),
           "{}: {} {} ({}) must be a{} {} cpu tensor", op, name, t.shape_str(), device_name(t.device),
           ndim < 0 ? "n" : fmt::format(" {}-D", ndim), dtype_name(dtype));
}

}  // namespace pl::cpu
