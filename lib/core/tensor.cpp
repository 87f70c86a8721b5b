#include "core/tensor.h"

#include <fmt/format.h>

#include "core/checked_math.h"
#include "core/error.h"

namespace pl {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::U8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
    case DType::U8: return "u8";
  }
  return "?";
}

const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

Tensor::Tensor(void* d, std::initializer_list<int64_t> dims, DType t, Device dev)
    : data(d), dtype(t), device(dev) {
  PL_CHECK(dims.size() <= kMaxDims, "tensor with {} dims (max {})", dims.size(), kMaxDims);
  for (int64_t s : dims) {
    PL_CHECK(s >= 0, "tensor dimension {} is negative", s);
    shape[ndim++] = s;
  }
  // numel() and bytes() stay unchecked (hot); every shape passes through here once.
  (void)checked_mul(checked_product(dims, "a tensor's element count"), static_cast<int64_t>(dtype_size(t)),
                    "a tensor's byte size");
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

std::string Tensor::shape_str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + "] " + dtype_name(dtype);
}

float* Tensor::f32() const {
  PL_CHECK(dtype == DType::F32, "expected an f32 tensor, got {}", shape_str());
  return static_cast<float*>(data);
}

int32_t* Tensor::i32() const {
  PL_CHECK(dtype == DType::I32, "expected an i32 tensor, got {}", shape_str());
  return static_cast<int32_t*>(data);
}

uint8_t* Tensor::u8() const {
  PL_CHECK(dtype == DType::U8, "expected a u8 tensor, got {}", shape_str());
  return static_cast<uint8_t*>(data);
}

Tensor Tensor::rows(int64_t row0, int64_t nrows) const {
  PL_CHECK(ndim >= 1 && row0 >= 0 && row0 + nrows <= shape[0], "rows [{}, {}) out of {}", row0,
           row0 + nrows, shape_str());
  Tensor t = *this;
  t.shape[0] = nrows;
  t.data = static_cast<char*>(data) + row0 * (numel() / shape[0]) * dtype_size(dtype);
  return t;
}

Tensor Tensor::view(std::initializer_list<int64_t> dims) const {
  Tensor t(data, dims, dtype, device);
  PL_CHECK(t.numel() == numel(), "cannot view {} as {}", shape_str(), t.shape_str());
  return t;
}

}  // namespace pl
