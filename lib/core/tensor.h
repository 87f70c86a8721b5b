#pragma once
// A Tensor is a non-owning view: pointer, shape, dtype, device. Storage is owned by Buffers
// (backend/device_memory.h, the device layer's).
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace pl {

enum class DType : uint8_t { F32, BF16, I32, U8 };  // U8: packed FP4 / FP8 codes and scale bytes
enum class Device : uint8_t { CPU, CUDA };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
const char* device_name(Device d);

// f(T*) (a null pointer) with T the element type a tensor of `dtype` stores as a float value: float for
// F32, uint16_t (bf16 bits) for BF16. The ops that take either storage instantiate one kernel per type.
template <class F>
void with_float_storage(DType dtype, F&& f) {
  if (dtype == DType::BF16)
    f(static_cast<uint16_t*>(nullptr));
  else
    f(static_cast<float*>(nullptr));
}

struct Tensor {
  static constexpr int kMaxDims = 4;
  void* data = nullptr;
  std::array<int64_t, kMaxDims> shape{};
  int ndim = 0;
  DType dtype = DType::F32;
  Device device = Device::CPU;

  Tensor() = default;
  Tensor(void* d, std::initializer_list<int64_t> dims, DType t, Device dev = Device::CPU);

  int64_t numel() const;
  int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  std::string shape_str() const;  // "[2, 128, 64] f32"
  template <class T>
  T* ptr() const { return static_cast<T*>(data); }
  float* f32() const;    // checks dtype == F32
  int32_t* i32() const;  // checks dtype == I32
  uint8_t* u8() const;   // checks dtype == U8
  // A view of rows [row0, row0+rows) of the leading dimension.
  Tensor rows(int64_t row0, int64_t nrows) const;
  // The same memory seen with another shape of equal numel.
  Tensor view(std::initializer_list<int64_t> dims) const;
  // The first rows * cols elements seen as [rows, cols] (a scratch buffer sized for its largest use).
  Tensor leading(int64_t nrows, int64_t cols) const;
};

}  // namespace pl

