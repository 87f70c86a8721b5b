#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <iterator>
#include <map>
#include <mutex>

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

// ---- allocation with statistics --------------------------------------------------------------

namespace {
std::mutex g_stats_mutex;
MemoryStats g_stats[2];

// from_arena: the bytes were reserved already (by reserve_device_arena), so only "allocated" grows.
void record_alloc(Device d, size_t bytes, bool from_arena = false) {
  std::lock_guard lock(g_stats_mutex);
  MemoryStats& s = g_stats[static_cast<int>(d)];
  s.allocated += bytes;
  if (!from_arena) s.reserved += bytes;
  s.max_allocated = std::max(s.max_allocated, s.allocated);
  s.max_reserved = std::max(s.max_reserved, s.reserved);
  ++s.alloc_count;
  ++s.total_allocs;
}

void record_free(Device d, size_t bytes, bool from_arena = false) {
  std::lock_guard lock(g_stats_mutex);
  MemoryStats& s = g_stats[static_cast<int>(d)];
  s.allocated -= bytes;
  if (!from_arena) s.reserved -= bytes;
  --s.alloc_count;
}
}  // namespace

void* cuda_alloc(size_t bytes);  // core/device_memory.cpp (fails without CUDA)
bool cuda_mem_info(size_t* free_bytes, size_t* total_bytes);  // false without a device
void cuda_free(void* p);
void cuda_zero(void* p, size_t bytes);
void* pinned_host_alloc(size_t bytes);  // core/device_memory.cpp: cudaMallocHost (fails without CUDA)
void pinned_host_free(void* p);

size_t ArenaBlocks::take(size_t bytes) {
  const size_t need = (bytes + 255) / 256 * 256;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const size_t off = it->first, left = it->second - need;
    free_.erase(it);
    if (left > 0) free_.emplace(off + need, left);
    return off;
  }
  if (top_ + need > size_) return kNone;
  const size_t off = top_;
  top_ += need;
  peak_ = std::max(peak_, top_);
  return off;
}

void ArenaBlocks::give(size_t offset, size_t bytes) {
  size_t off = offset, len = (bytes + 255) / 256 * 256;
  // Coalesce with the free neighbours, then give the block back to the top when it ends there.
  auto next = free_.lower_bound(off);
  if (next != free_.end() && next->first == off + len) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      len += prev->second;
      free_.erase(prev);
    }
  }
  if (off + len == top_) {
    top_ = off;
    // A free block now ending at the new top joins it too.
    if (!free_.empty()) {
      auto last = std::prev(free_.end());
      if (last->first + last->second == top_) {
        top_ = last->first;
        free_.erase(last);
      }
    }
  } else {
    free_.emplace(off, len);
  }
}

namespace {
struct Arena {
  char* base = nullptr;
  ArenaBlocks blocks;
  bool owns(const void* p) const { return base && p >= base && p < base + blocks.size(); }
};
Arena g_arena;
std::mutex g_arena_mutex;
}  // namespace

double device_memory_margin(double total_device_bytes) {
  return std::max(2.0 * 1024 * 1024 * 1024, 0.03 * total_device_bytes);
}

void reserve_device_arena(Device device, double bytes) {
  PL_CHECK(device == Device::CUDA, "a device arena is for CUDA memory");
  PL_CHECK(g_arena.base == nullptr, "the device arena is already reserved");
  const size_t n = (static_cast<size_t>(bytes) + 255) / 256 * 256;
  size_t free_bytes = 0, total_bytes = 0;
  if (cuda_mem_info(&free_bytes, &total_bytes)) {
    const double margin = device_memory_margin(static_cast<double>(total_bytes));
    PL_CHECK(static_cast<double>(n) + margin <= static_cast<double>(free_bytes),
             "the device arena of {:.2f} GB plus the {:.2f} GB kept free outside it (max(2 GiB, 3% of the {:.1f} GB "
             "device) for lazily loaded kernels, cuBLASLt and cuDNN engines) exceeds the {:.2f} GB free on the device; "
             "use a smaller --micro-batch-size or --seq-length, or --recompute full",
             static_cast<double>(n) / 1e9, margin / 1e9, static_cast<double>(total_bytes) / 1e9,
             static_cast<double>(free_bytes) / 1e9);
  }
  g_arena.base = static_cast<char*>(cuda_alloc(n));
  g_arena.blocks = ArenaBlocks(n);
  std::lock_guard lock(g_stats_mutex);
  MemoryStats& s = g_stats[static_cast<int>(Device::CUDA)];
  s.reserved += n;
  s.max_reserved = std::max(s.max_reserved, s.reserved);
}

size_t device_arena_peak() { return g_arena.blocks.peak(); }

namespace {
void* device_alloc(size_t bytes) {
  if (!g_arena.base) return cuda_alloc(bytes);
  std::lock_guard lock(g_arena_mutex);
  const size_t off = g_arena.blocks.take(bytes);
  PL_CHECK(off != ArenaBlocks::kNone,
           "device arena exhausted: {} bytes requested, {} of {} bytes used (the memory plan missed something)", bytes,
           g_arena.blocks.top(), g_arena.blocks.size());
  return g_arena.base + off;
}
void device_free(void* p, size_t bytes) {
  if (!g_arena.owns(p)) return cuda_free(p);
  std::lock_guard lock(g_arena_mutex);
  g_arena.blocks.give(static_cast<size_t>(static_cast<char*>(p) - g_arena.base), bytes);
}
}  // namespace

Buffer::Buffer(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  if (bytes == 0) return;
  if (device == Device::CPU) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    data_ = std::aligned_alloc(64, rounded);
    PL_CHECK(data_ != nullptr, "out of host memory allocating {:.3f} GB", bytes / 1e9);
    std::memset(data_, 0, bytes);
  } else {
    data_ = device_alloc(bytes);
    cuda_zero(data_, bytes);  // every Buffer starts zeroed, on every device (Adam moments rely on it)
  }
  record_alloc(device, bytes, device == Device::CUDA && g_arena.owns(data_));
}

Buffer::~Buffer() { release(); }

Buffer Buffer::pinned_host(size_t bytes, Device for_device) {
  if (for_device != Device::CUDA || bytes == 0) return Buffer(bytes, Device::CPU);
  Buffer b;
  b.bytes_ = bytes;
  b.device_ = Device::CPU;
  b.data_ = pinned_host_alloc(bytes);
  b.pinned_ = true;
  std::memset(b.data_, 0, bytes);
  record_alloc(Device::CPU, bytes);
  return b;
}

void Buffer::release() {
  if (!data_) return;
  if (pinned_)
    pinned_host_free(data_);
  else if (device_ == Device::CPU)
    std::free(data_);
  else
    device_free(data_, bytes_);
  record_free(device_, bytes_, device_ == Device::CUDA && g_arena.owns(data_));
  data_ = nullptr;
}

Buffer::Buffer(Buffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_), device_(o.device_), pinned_(o.pinned_) {
  o.data_ = nullptr;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = o.data_;
    bytes_ = o.bytes_;
    device_ = o.device_;
    pinned_ = o.pinned_;
    o.data_ = nullptr;
  }
  return *this;
}

Tensor Buffer::as(std::initializer_list<int64_t> dims, DType t, size_t byte_offset) const {
  Tensor v(static_cast<char*>(data_) + byte_offset, dims, t, device_);
  PL_CHECK(byte_offset + v.bytes() <= bytes_, "view {} at offset {} exceeds buffer of {} bytes",
           v.shape_str(), byte_offset, bytes_);
  return v;
}

MemoryStats memory_stats(Device device) {
  std::lock_guard lock(g_stats_mutex);
  return g_stats[static_cast<int>(device)];
}

}  // namespace pl
