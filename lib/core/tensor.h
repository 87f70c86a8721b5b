#pragma once
// A Tensor is a non-owning view: pointer, shape, dtype, device. Storage is owned by Buffers, which
// come from a per-device Allocator that keeps the figures the memory log line prints.
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
};

// Allocation figures of one device, in the spirit of torch.cuda.memory_stats().
struct MemoryStats {
  size_t allocated = 0;
  size_t max_allocated = 0;
  size_t reserved = 0;
  size_t max_reserved = 0;
  size_t alloc_count = 0;   // live allocations
  size_t total_allocs = 0;  // allocations ever made; the trainer checks it does not move in the loop
};

// Owns one allocation; movable, not copyable.
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, Device device);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  Tensor as(std::initializer_list<int64_t> dims, DType t, size_t byte_offset = 0) const;

 private:
  void release();
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::CPU;
};

MemoryStats memory_stats(Device device);

// One device allocation for the whole run (DESIGN "Memory"): after this call, CUDA Buffers are
// carved from a single cudaMalloc of `bytes` (bump allocation, 256-byte aligned; freeing a Buffer
// returns nothing to it). A Buffer that does not fit is an error naming the shortfall. Without a
// reservation each CUDA Buffer is its own cudaMalloc.
void reserve_device_arena(Device device, double bytes);
// High-water mark of the arena (0 without one).
size_t device_arena_peak();

}  // namespace pl

namespace pl {
// Copies between a host array and a tensor on any device (cudaMemcpy for CUDA tensors).
void copy_from_host(const Tensor& dst, const void* src);
void copy_to_host(void* dst, const Tensor& src);
// Number of usable CUDA devices (0 without a driver, a device or a CUDA build; *why says which).
int cuda_device_count(std::string* why = nullptr);
}  // namespace pl
