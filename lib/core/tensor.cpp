#include "core/tensor.h"

#include <fmt/format.h>

#include "core/checked_math.h"
#include "core/error.h"

namespace pl {

namespace {
struct DTypeInfo {
  size_t size;
  const char* name;
};
constexpr DTypeInfo kDTypes[] = {{4, "f32"}, {2, "bf16"}, {4, "i32"}, {1, "u8"}};  // in DType's order

// The typed pointer of f32(), i32(), u8(); `kind` names the dtype expected ("an f32").
template <class T>
T* typed_data(const Tensor& t, DType want, const char* kind) {
  PL_CHECK(t.dtype == want, "expected {} tensor, got {}", kind, t.shape_str());
  return static_cast<T*>(t.data);
}
}  // namespace

size_t dtype_size(DType t) { return kDTypes[static_cast<size_t>(t)].size; }
const char* dtype_name(DType t) { return kDTypes[static_cast<size_t>(t)].name; }

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

float* Tensor::f32() const { return typed_data<float>(*this, DType::F32, "an f32"); }
int32_t* Tensor::i32() const { return typed_data<int32_t>(*this, DType::I32, "an i32"); }
uint8_t* Tensor::u8() const { return typed_data<uint8_t>(*this, DType::U8, "a u8"); }

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

Tensor Tensor::leading(int64_t nrows, int64_t cols) const {
  PL_CHECK(nrows >= 0 && cols >= 0 && nrows * cols <= numel(), "cannot take [{}, {}] from the front of {}", nrows, cols,
           shape_str());
  return view({numel()}).rows(0, nrows * cols).view({nrows, cols});
}

}  // namespace pl
