// Device allocations behind Buffer. Without the CUDA build a CUDA buffer is a clear error.

#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/tensor.h"

#if defined(PL_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace pl {

#if defined(PL_WITH_CUDA)
void* cuda_alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t st = cudaMalloc(&p, bytes);
  PL_CHECK(st == cudaSuccess, "cudaMalloc of {} bytes ({:.3f} GB) failed: {}", bytes, bytes / 1e9,
           cudaGetErrorString(st));
  return p;
}
// Runs from destructors, which must not throw: a failure is reported on stderr, one line.
void cuda_free(void* p) {
  const cudaError_t st = cudaFree(p);
  if (st != cudaSuccess) std::fprintf(stderr, "pretrain_llama: warning: cudaFree failed: %s\n", cudaGetErrorString(st));
}
void cuda_zero(void* p, size_t bytes) {
  const cudaError_t st = cudaMemset(p, 0, bytes);
  PL_CHECK(st == cudaSuccess, "cudaMemset of {} bytes failed: {}", bytes, cudaGetErrorString(st));
}
static void cuda_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* what) {
  const cudaError_t st = cudaMemcpy(dst, src, bytes, kind);
  PL_CHECK(st == cudaSuccess, "{} of {} bytes failed: {}", what, bytes, cudaGetErrorString(st));
}
bool cuda_mem_info(size_t* free_bytes, size_t* total_bytes) {
  return cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess;
}
#else
bool cuda_mem_info(size_t*, size_t*) { return false; }
void* cuda_alloc(size_t bytes) {
  fail("cannot allocate {} bytes on the GPU: this build has no CUDA support (reconfigure with nvcc present)", bytes);
}
void cuda_free(void*) {}
void cuda_zero(void*, size_t) {}
#endif

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
  if (host_) {
    const cudaError_t st = cudaFreeHost(host_);
    if (st != cudaSuccess)
      std::fprintf(stderr, "pretrain_llama: warning: cudaFreeHost failed: %s\n", cudaGetErrorString(st));
  }
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
    host_ = o.host_;
    for (int i = 0; i < 4; ++i) {
      events_[i] = o.events_[i];
      pending_[i] = o.pending_[i];
      o.events_[i] = nullptr;
      o.pending_[i] = false;
    }
    o.host_ = nullptr;
  }
  return *this;
}

void UploadStaging::upload(std::initializer_list<std::pair<Tensor, const void*>> copies) {
  size_t total = 0;
  for (const auto& [dst, src] : copies) total += dst.bytes();
  for (const auto& [dst, src] : copies)
    PL_CHECK(dst.device == device_, "internal: upload of {} to {} through {} staging", dst.shape_str(),
             device_name(dst.device), device_name(device_));
  if (device_ != Device::CUDA) {
    for (const auto& [dst, src] : copies) copy_from_host(dst, src);
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
    std::memcpy(base + off, src, dst.bytes());
    const cudaError_t st = cudaMemcpyAsync(dst.data, base + off, dst.bytes(), cudaMemcpyHostToDevice, /*stream=*/0);
    PL_CHECK(st == cudaSuccess, "cudaMemcpyAsync of {} ({} bytes) from pinned staging failed: {}", dst.shape_str(),
             dst.bytes(), cudaGetErrorString(st));
    off += dst.bytes();
  }
  const cudaError_t st = cudaEventRecord(ev, /*stream=*/0);
  PL_CHECK(st == cudaSuccess, "cudaEventRecord (upload staging) failed: {}", cudaGetErrorString(st));
  pending_[slot] = true;
#else
  (void)total;
#endif
}

}  // namespace pl
