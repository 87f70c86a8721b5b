// Buffer, the per-device figures and the device arena over the CUDA runtime's allocations, the staged
// uploads and the copy stream. Without the CUDA build a CUDA buffer is a clear error.
#include "backend/device_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>
#include <string>
#include <utility>

#include "core/error.h"

#if defined(PL_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace pl {

namespace {
#if defined(PL_WITH_CUDA)
void* cuda_alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t st = cudaMalloc(&p, bytes);
  PL_CHECK(st == cudaSuccess, "cudaMalloc of {} bytes ({:.3f} GB) failed: {}", bytes, bytes / 1e9,
           cudaGetErrorString(st));
  return p;
}
// For destructors, which must not throw: a failure is reported on stderr, one line.
void warn_on_error(cudaError_t st, const char* what) {
  if (st != cudaSuccess)
    std::fprintf(stderr, "%s: warning: %s failed: %s\n", program_invocation_short_name, what, cudaGetErrorString(st));
}
void cuda_free(void* p) { warn_on_error(cudaFree(p), "cudaFree"); }
void cuda_zero(void* p, size_t bytes) {
  const cudaError_t st = cudaMemset(p, 0, bytes);
  PL_CHECK(st == cudaSuccess, "cudaMemset of {} bytes failed: {}", bytes, cudaGetErrorString(st));
}
void cuda_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* what) {
  const cudaError_t st = cudaMemcpy(dst, src, bytes, kind);
  PL_CHECK(st == cudaSuccess, "{} of {} bytes failed: {}", what, bytes, cudaGetErrorString(st));
}
bool cuda_mem_info(size_t* free_bytes, size_t* total_bytes) {
  return cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess;
}
void* pinned_host_alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t st = cudaMallocHost(&p, bytes);
  PL_CHECK(st == cudaSuccess, "cudaMallocHost of {} bytes ({:.3f} GB of page-locked host memory) failed: {}", bytes,
           bytes / 1e9, cudaGetErrorString(st));
  return p;
}
void pinned_host_free(void* p) { warn_on_error(cudaFreeHost(p), "cudaFreeHost"); }
#else
void* pinned_host_alloc(size_t bytes) {
  fail("cannot allocate {} bytes of page-locked host memory: this build has no CUDA support", bytes);
}
void pinned_host_free(void*) {}
bool cuda_mem_info(size_t*, size_t*) { return false; }
void* cuda_alloc(size_t bytes) {
  fail("cannot allocate {} bytes on the GPU: this build has no CUDA support (reconfigure with nvcc present)", bytes);
}
void cuda_free(void*) {}
void cuda_zero(void*, size_t) {}
#endif
}  // namespace

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

void reserve_device_arena(Device device, double planned_bytes) {
  PL_CHECK(device == Device::CUDA, "a device arena is for CUDA memory");
  PL_CHECK(g_arena.base == nullptr, "the device arena is already reserved");
  const double bytes = planned_bytes - static_cast<double>(kGemmWorkspaceBytes);  // (the device state's, allocated)
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

Buffer::Buffer(Buffer&& o) noexcept { *this = std::move(o); }

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = o.bytes_;
    device_ = o.device_;
    pinned_ = o.pinned_;
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

void reset_peak_memory_stats(Device device) {
  std::lock_guard lock(g_stats_mutex);
  MemoryStats& s = g_stats[static_cast<int>(device)];
  s.max_allocated = s.allocated;
  s.max_reserved = s.reserved;
}

int cuda_device_count(std::string* why) {
#if defined(PL_WITH_CUDA)
  int n = 0;
  const cudaError_t st = cudaGetDeviceCount(&n);
  if (st != cudaSuccess) {
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(st);
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount returned 0 devices";
  return n;
#else
  if (why) *why = "this build has no CUDA support";
  return 0;
#endif
}

void copy_from_host(const Tensor& dst, const void* src) {
  if (dst.device == Device::CPU) {
    std::memcpy(dst.data, src, dst.bytes());
    return;
  }
#if defined(PL_WITH_CUDA)
  cuda_copy(dst.data, src, dst.bytes(), cudaMemcpyHostToDevice, "copy to device");
#else
  fail("copy to a CUDA tensor {} in a build without CUDA", dst.shape_str());
#endif
}

void copy_to_host(void* dst, const Tensor& src) {
  if (src.device == Device::CPU) {
    std::memcpy(dst, src.data, src.bytes());
    return;
  }
#if defined(PL_WITH_CUDA)
  cuda_copy(dst, src.data, src.bytes(), cudaMemcpyDeviceToHost, "copy to host");
#else
  fail("copy from a CUDA tensor {} in a build without CUDA", src.shape_str());
#endif
}

// ---- pinned staging for uploads -------------------------------------------------------------------

UploadStaging::UploadStaging(size_t bytes_per_slot, int slots, Device device)
    : device_(device), slot_bytes_(bytes_per_slot), slots_(slots) {
  PL_CHECK(slots >= 1 && slots <= 4, "internal: UploadStaging with {} slots (1 to 4)", slots);
  if (device != Device::CUDA) return;
#if defined(PL_WITH_CUDA)
  void* p = nullptr;
  cudaError_t st = cudaMallocHost(&p, bytes_per_slot * static_cast<size_t>(slots));
  PL_CHECK(st == cudaSuccess, "cudaMallocHost of {} bytes (upload staging) failed: {}",
           bytes_per_slot * static_cast<size_t>(slots), cudaGetErrorString(st));
  host_ = static_cast<char*>(p);
  for (int i = 0; i < slots; ++i) {
    cudaEvent_t e = nullptr;
    st = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    PL_CHECK(st == cudaSuccess, "cudaEventCreate (upload staging) failed: {}", cudaGetErrorString(st));
    events_[i] = e;
  }
#else
  fail("upload staging for the GPU in a build without CUDA");
#endif
}

UploadStaging::~UploadStaging() { release(); }

void UploadStaging::release() {
#if defined(PL_WITH_CUDA)
  // Destructors must not throw: failures are reported on stderr. The events are synchronized first
  // so no queued copy still reads the pinned memory being freed (cudaFreeHost synchronizes too).
  for (int i = 0; i < 4; ++i)
    if (events_[i]) {
      if (pending_[i]) (void)cudaEventSynchronize(static_cast<cudaEvent_t>(events_[i]));
      (void)cudaEventDestroy(static_cast<cudaEvent_t>(events_[i]));
      events_[i] = nullptr;
    }
  if (host_) pinned_host_free(host_);
#endif
  host_ = nullptr;
  for (bool& p : pending_) p = false;
}

UploadStaging::UploadStaging(UploadStaging&& o) noexcept { *this = std::move(o); }

UploadStaging& UploadStaging::operator=(UploadStaging&& o) noexcept {
  if (this != &o) {
    release();
    device_ = o.device_;
    slot_bytes_ = o.slot_bytes_;
    slots_ = o.slots_;
    next_ = o.next_;
    host_ = std::exchange(o.host_, nullptr);
    for (int i = 0; i < 4; ++i) {
      events_[i] = std::exchange(o.events_[i], nullptr);
      pending_[i] = std::exchange(o.pending_[i], false);
    }
  }
  return *this;
}

void UploadStaging::upload(std::initializer_list<std::pair<Tensor, const void*>> copies) {
  [[maybe_unused]] size_t total = 0;
  for (const auto& [dst, src] : copies) total += dst.data != nullptr ? dst.bytes() : 0;
  for (const auto& [dst, src] : copies)
    PL_CHECK(dst.data == nullptr || dst.device == device_, "internal: upload of {} to {} through {} staging", dst.shape_str(),
             device_name(dst.device), device_name(device_));
  if (device_ != Device::CUDA) {
    for (const auto& [dst, src] : copies)
      if (dst.data != nullptr) copy_from_host(dst, src);
    return;
  }
#if defined(PL_WITH_CUDA)
  PL_CHECK(host_ != nullptr && total <= slot_bytes_, "internal: upload of {} bytes through staging slots of {} bytes",
           total, slot_bytes_);
  const int slot = next_;
  next_ = (next_ + 1) % slots_;
  auto* ev = static_cast<cudaEvent_t>(events_[slot]);
  // The slot's previous copies must have left the pinned memory before it is overwritten.
  if (pending_[slot]) {
    const cudaError_t st = cudaEventSynchronize(ev);
    PL_CHECK(st == cudaSuccess, "upload: waiting for the previous copy from staging slot {} failed: {}", slot,
             cudaGetErrorString(st));
  }
  char* base = host_ + static_cast<size_t>(slot) * slot_bytes_;
  size_t off = 0;
  for (const auto& [dst, src] : copies) {
    if (dst.data == nullptr) continue;  // an optional upload that is off
    std::memcpy(base + off, src, dst.bytes());
    const cudaError_t st = cudaMemcpyAsync(dst.data, base + off, dst.bytes(), cudaMemcpyHostToDevice, /*stream=*/0);
    PL_CHECK(st == cudaSuccess, "cudaMemcpyAsync of {} ({} bytes) from pinned staging failed: {}", dst.shape_str(),
             dst.bytes(), cudaGetErrorString(st));
    off += dst.bytes();
  }
  const cudaError_t st = cudaEventRecord(ev, /*stream=*/0);
  PL_CHECK(st == cudaSuccess, "cudaEventRecord (upload staging) failed: {}", cudaGetErrorString(st));
  pending_[slot] = true;
#endif
}

// ---- the copy stream of the optimizer offload --------------------------------------------------------

#if defined(PL_WITH_CUDA)
namespace {
void check_copy(cudaError_t st, const char* what, size_t bytes = 0) {
  PL_CHECK(st == cudaSuccess, "copy stream: {}{} failed: {}", what,
           bytes ? fmt::format(" of {} bytes", bytes) : std::string(), cudaGetErrorString(st));
}
cudaEvent_t new_event() {
  cudaEvent_t e = nullptr;
  check_copy(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  return e;
}
}  // namespace
#endif

CopyStream::CopyStream(Device device, int marks) : device_(device) {
  PL_CHECK(marks >= 1, "internal: CopyStream with {} marks", marks);
  pending_.assign(static_cast<size_t>(marks), 0);
  if (device != Device::CUDA) return;
#if defined(PL_WITH_CUDA)
  check_copy(cudaGetDevice(&cuda_device_), "cudaGetDevice");
  for (void** stream : {&down_, &up_}) {
    cudaStream_t s = nullptr;
    check_copy(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    *stream = s;
  }
  ready_ = new_event();
  compute_ready_ = new_event();
  drained_ = new_event();
  marks_.resize(static_cast<size_t>(marks));
  for (void*& m : marks_) m = new_event();
#else
  fail("a copy stream for the GPU in a build without CUDA");
#endif
}

CopyStream::~CopyStream() { release(); }

void CopyStream::release() {
#if defined(PL_WITH_CUDA)
  // Destructors must not throw: the streams are drained first (no copy still reads or writes memory that
  // is about to be freed), failures go to stderr.
  for (void* stream : {down_, up_})
    if (stream) {
      warn_on_error(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "copy stream synchronize");
      (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream));
    }
  for (void* e : {ready_, compute_ready_, drained_})
    if (e) (void)cudaEventDestroy(static_cast<cudaEvent_t>(e));
  for (void* m : marks_)
    if (m) (void)cudaEventDestroy(static_cast<cudaEvent_t>(m));
#endif
  down_ = up_ = ready_ = compute_ready_ = drained_ = nullptr;
  marks_.clear();
  pending_.clear();
}

CopyStream::CopyStream(CopyStream&& o) noexcept { *this = std::move(o); }

CopyStream& CopyStream::operator=(CopyStream&& o) noexcept {
  if (this != &o) {
    release();
    device_ = o.device_;
    cuda_device_ = o.cuda_device_;
    down_ = std::exchange(o.down_, nullptr);
    up_ = std::exchange(o.up_, nullptr);
    ready_ = std::exchange(o.ready_, nullptr);
    compute_ready_ = std::exchange(o.compute_ready_, nullptr);
    drained_ = std::exchange(o.drained_, nullptr);
    marks_ = std::move(o.marks_);
    pending_ = std::move(o.pending_);
    o.marks_.clear();
    o.pending_.clear();
  }
  return *this;
}

void CopyStream::to_host(void* dst, const Tensor& src, int mark) {
  PL_CHECK(src.device == device_ && mark >= 0 && static_cast<size_t>(mark) < pending_.size(),
           "internal: copy of {} ({}) to the host through a {} copy stream, mark {} of {}", src.shape_str(),
           device_name(src.device), device_name(device_), mark, pending_.size());
  if (device_ != Device::CUDA) return copy_to_host(dst, src);
#if defined(PL_WITH_CUDA)
  auto* s = static_cast<cudaStream_t>(down_);
  check_copy(cudaEventRecord(static_cast<cudaEvent_t>(ready_), /*legacy default stream=*/0), "cudaEventRecord");
  check_copy(cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(ready_), 0), "cudaStreamWaitEvent");
  check_copy(cudaMemcpyAsync(dst, src.data, src.bytes(), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync to the host",
             src.bytes());
  check_copy(cudaEventRecord(static_cast<cudaEvent_t>(marks_[static_cast<size_t>(mark)]), s), "cudaEventRecord");
  pending_[static_cast<size_t>(mark)] = 1;
#endif
}

void CopyStream::to_device(const Tensor& dst, const void* src, int mark) {
  PL_CHECK(dst.device == device_ && mark >= 0 && static_cast<size_t>(mark) < pending_.size(),
           "internal: copy of {} ({}) from the host through a {} copy stream, mark {} of {}", dst.shape_str(),
           device_name(dst.device), device_name(device_), mark, pending_.size());
  if (device_ != Device::CUDA) return copy_from_host(dst, src);
#if defined(PL_WITH_CUDA)
  auto* s = static_cast<cudaStream_t>(up_);
  check_copy(cudaMemcpyAsync(dst.data, src, dst.bytes(), cudaMemcpyHostToDevice, s), "cudaMemcpyAsync to the device",
             dst.bytes());
  check_copy(cudaEventRecord(static_cast<cudaEvent_t>(marks_[static_cast<size_t>(mark)]), s), "cudaEventRecord");
  pending_[static_cast<size_t>(mark)] = 1;
#endif
}

void CopyStream::wait(int mark) {
  PL_CHECK(mark >= 0 && static_cast<size_t>(mark) < pending_.size(), "internal: copy stream mark {} of {}", mark,
           pending_.size());
  if (!pending_[static_cast<size_t>(mark)]) return;
#if defined(PL_WITH_CUDA)
  check_copy(cudaEventSynchronize(static_cast<cudaEvent_t>(marks_[static_cast<size_t>(mark)])),
             "waiting for a copy (cudaEventSynchronize)");
#endif
  pending_[static_cast<size_t>(mark)] = 0;
}

bool CopyStream::done(int mark) {
  PL_CHECK(mark >= 0 && static_cast<size_t>(mark) < pending_.size(), "internal: copy stream mark {} of {}", mark,
           pending_.size());
  if (!pending_[static_cast<size_t>(mark)]) return true;
#if defined(PL_WITH_CUDA)
  const cudaError_t st = cudaEventQuery(static_cast<cudaEvent_t>(marks_[static_cast<size_t>(mark)]));
  if (st == cudaErrorNotReady) return false;
  check_copy(st, "asking whether a copy is done (cudaEventQuery)");
#endif
  pending_[static_cast<size_t>(mark)] = 0;
  return true;
}

void CopyStream::uploads_wait_for_compute() {
  if (device_ != Device::CUDA) return;
#if defined(PL_WITH_CUDA)
  check_copy(cudaEventRecord(static_cast<cudaEvent_t>(compute_ready_), /*legacy default stream=*/0), "cudaEventRecord");
  check_copy(cudaStreamWaitEvent(static_cast<cudaStream_t>(up_), static_cast<cudaEvent_t>(compute_ready_), 0),
             "cudaStreamWaitEvent");
#endif
}

// (Reads no host-side state of the mark: the host worker may be queueing other marks meanwhile.)
void CopyStream::compute_waits_for(int mark) {
  PL_CHECK(mark >= 0 && static_cast<size_t>(mark) < pending_.size(), "internal: copy stream mark {} of {}", mark,
           pending_.size());
  if (device_ != Device::CUDA) return;
#if defined(PL_WITH_CUDA)
  check_copy(cudaStreamWaitEvent(/*legacy default stream=*/0, static_cast<cudaEvent_t>(marks_[static_cast<size_t>(mark)]), 0),
             "cudaStreamWaitEvent");
#endif
}

#if defined(PL_WITH_CUDA)
namespace {
// The legacy default stream waits for everything queued so far on `stream` (through `event`; a
// cudaStreamWaitEvent takes the event's state when it is called, so the event can be recorded again).
void compute_waits_for_stream(void* stream, void* event) {
  check_copy(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)), "cudaEventRecord");
  check_copy(cudaStreamWaitEvent(/*legacy default stream=*/0, static_cast<cudaEvent_t>(event), 0), "cudaStreamWaitEvent");
}
}  // namespace
#endif

void CopyStream::compute_waits_for_downloads() {
  if (device_ != Device::CUDA) return;
#if defined(PL_WITH_CUDA)
  compute_waits_for_stream(down_, drained_);
#endif
}

void CopyStream::use_on_this_thread() const {
  if (device_ != Device::CUDA) return;
#if defined(PL_WITH_CUDA)
  check_copy(cudaSetDevice(cuda_device_), "cudaSetDevice");
#endif
}

void CopyStream::compute_waits_for_copies() {
  if (device_ != Device::CUDA) return;
#if defined(PL_WITH_CUDA)
  compute_waits_for_stream(down_, drained_);
  compute_waits_for_stream(up_, drained_);
#endif
}

}  // namespace pl
