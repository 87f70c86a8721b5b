#pragma once
// The memory behind Tensors: Buffers, which own one allocation each and keep the per-device figures the
// memory log line prints; the device arena they are carved from; the staged uploads and the copy stream
// between pinned host memory and the device; plain copies.
#include <map>
#include <utility>
#include <vector>

#include "core/memory_stats.h"
#include "core/tensor.h"

namespace pl {

// Owns one allocation; movable, not copyable.
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, Device device);
  // Host memory, page-locked (cudaMallocHost) when `for_device` is CUDA so asynchronous copies to and
  // from that device can use it; plain host memory otherwise. Zeroed, counted as CPU memory.
  static Buffer pinned_host(size_t bytes, Device for_device);
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
  bool pinned_ = false;  // host memory from cudaMallocHost
};

MemoryStats memory_stats(Device device);
// The peaks start again from what is allocated now (PyTorch's reset_peak_memory_stats): the machine
// probe's transient operands, measured before the model's run, are not the run's peak.
void reset_peak_memory_stats(Device device);

// One device allocation for the whole run (DESIGN "Memory"): after this call, CUDA Buffers are
// carved from a single cudaMalloc of `bytes` (256-byte aligned). A freed Buffer's space goes back to
// the arena (a free list, coalesced with its neighbours; first fit), so grow-only scratch that is
// reallocated larger does not leak its old space. Reuse is safe because all device work runs on the
// default stream, in order: a kernel queued before the free finishes before any kernel queued after
// the reallocation touches the same bytes. (The other streams, the optimizer offload's CopyStream's two,
// only touch the model's weights and gradients, which live as long as the model and are never freed
// while its copies are pending.) A Buffer that does not fit is an error naming the shortfall. Without a reservation each CUDA Buffer is its own cudaMalloc.
// The reservation refuses, with one line, to leave less than device_memory_margin() free outside the
// arena (see there).
// `planned_bytes`: the run's whole plan on the device, the device state's own allocations made outside the
// arena when it was opened (kGemmWorkspaceBytes) included: the arena is the rest.
void reserve_device_arena(Device device, double planned_bytes);
// The cuBLASLt workspace the CUDA device state allocates for itself when it is opened (SPEC-GPU §2: 32 MiB on
// sm90/sm10x), outside the arena; the memory plan counts it among the library workspaces.
inline constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;
// The arena's bookkeeping in byte offsets (no memory; exposed for tests): blocks of 256-byte multiples,
// freed blocks kept coalesced (never two adjacent), first fit from the lowest address, and a block
// freed at the top lowers the top.
class ArenaBlocks {
 public:
  explicit ArenaBlocks(size_t size = 0) : size_(size) {}
  static constexpr size_t kNone = ~size_t{0};
  // The offset of a new block of `bytes` (rounded up to 256), or kNone when it does not fit.
  size_t take(size_t bytes);
  void give(size_t offset, size_t bytes);
  size_t size() const { return size_; }
  size_t top() const { return top_; }    // everything at or above is unused
  size_t peak() const { return peak_; }
  size_t free_block_count() const { return free_.size(); }

 private:
  size_t size_ = 0, top_ = 0, peak_ = 0;
  std::map<size_t, size_t> free_;  // offset -> bytes, below top_
};
// Device memory kept free outside the arena, for what allocates behind the program's back after
// start-up: CUDA lazy loading (the default since CUDA 12.2) maps each kernel module on its first launch,
// cuDNN compiles its SDPA engines at run time (NVRTC) and loads them, cuBLASLt loads kernels and may
// keep per-handle state, NCCL and the driver grow their own pools. None of it is visible to the plan.
// max(2 GiB, 3% of the device): these libraries are seen to take a few hundred MiB on first use (module
// images of every lazily loaded kernel, cuDNN's runtime-compiled SDPA engines, cuBLASLt kernels);
// 2 GiB is that with a wide margin, the floor on small devices; 3% scales it with the device (2.4 GB
// on an 80 GB H100, 4.2 GB on a 141 GB H200), where larger shapes compile more and larger engines.
// A guess to be checked against the first GPU run's free memory after a step, not a measurement.
double device_memory_margin(double total_device_bytes);

// Host -> device uploads of per-micro-batch inputs (token ids) without blocking the host on the
// device. `slots` staging regions of `bytes_per_slot` each, in page-locked host memory
// (cudaMallocHost) for CUDA, allocated once here; upload() copies the host data into the next slot
// and queues cudaMemcpyAsync from it on the default stream, in the stream order of the ops that read
// the destination. Before a slot is refilled, upload() waits on the event recorded after that slot's
// last copy: with 2 slots the host blocks only when it runs more than one upload ahead of the device
// (the copy of two uploads ago has not started), never for the copy it has just queued. On the CPU
// it is a plain memcpy and holds no staging memory.
class UploadStaging {
 public:
  UploadStaging() = default;
  UploadStaging(size_t bytes_per_slot, int slots, Device device);
  ~UploadStaging();
  UploadStaging(UploadStaging&& o) noexcept;
  UploadStaging& operator=(UploadStaging&& o) noexcept;
  UploadStaging(const UploadStaging&) = delete;
  UploadStaging& operator=(const UploadStaging&) = delete;
  // Copies each src[i] (dst[i].bytes() bytes) to dst[i], all through one slot
  // (Σ dst[i].bytes() <= bytes_per_slot).
  // A destination without data (an empty Tensor) is skipped: an optional upload that is off.
  void upload(std::initializer_list<std::pair<Tensor, const void*>> copies);

 private:
  void release();
  Device device_ = Device::CPU;
  size_t slot_bytes_ = 0;
  int slots_ = 0, next_ = 0;
  char* host_ = nullptr;          // slots_ * slot_bytes_ pinned bytes
  void* events_[4] = {};          // cudaEvent_t per slot (recorded after its copies)
  bool pending_[4] = {};          // an event was recorded for the slot
};

// Copies between pinned host memory and one device on two streams of their own, one per direction, so
// they run while the compute stream works and neither direction queues behind the other (the optimizer
// offload: gradients go down during the backward, updated weights come up during the host's optimizer
// step and the next forward; on a GPU each direction has its own copy engine, so a download and an
// upload can move at once). Each copy marks one of `marks` completion slots; the host waits on a slot,
// the compute stream waits on one slot or on every copy queued so far. Both streams are created
// non-blocking: they never synchronize implicitly with the legacy default stream the ops run on, so
// every ordering between them is one of the explicit waits below. On the CPU a copy is a memcpy done at
// once and the waits return.
// Threads: the copies to the device and wait() may run on one thread (the offload's host worker) while
// another queues downloads and the compute stream's waits, as long as no mark is used by both at once.
class CopyStream {
 public:
  CopyStream() = default;
  CopyStream(Device device, int marks);
  ~CopyStream();
  CopyStream(CopyStream&& o) noexcept;
  CopyStream& operator=(CopyStream&& o) noexcept;
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  // dst (pinned host, src.bytes()) <- src (a device tensor) on the download stream, after all work
  // queued so far on the compute stream (src is final there); marks `mark`.
  void to_host(void* dst, const Tensor& src, int mark);
  // dst (a device tensor) <- src (pinned host, dst.bytes()) on the upload stream, in order after the
  // uploads queued before; marks `mark`. src must stay untouched until wait(mark). Uploads do not wait
  // for the compute stream by themselves: see uploads_wait_for_compute.
  void to_device(const Tensor& dst, const void* src, int mark);
  // Blocks the host until the copy that last marked `mark` has finished (at once if none is pending).
  void wait(int mark);
  // Whether that copy has finished, without blocking (true if none is pending).
  bool done(int mark);
  // The uploads queued from now on start after all work queued so far on the compute stream (which may
  // still read what they overwrite).
  void uploads_wait_for_compute();
  // The compute stream waits (on the device; the host goes on) for the copy that marked `mark` (which
  // must have been queued already: waiting on an event not yet recorded waits for nothing), and with it
  // for every upload queued before it.
  void compute_waits_for(int mark);
  // The compute stream waits for every download queued so far (before it overwrites what they read).
  void compute_waits_for_downloads();
  // The compute stream waits for every copy queued so far, both directions.
  void compute_waits_for_copies();
  // Makes the calling thread's current CUDA device the one the streams were made on (the runtime's
  // current device is per thread): a thread other than the creator calls it before its first copy.
  void use_on_this_thread() const;

 private:
  void release();
  Device device_ = Device::CPU;
  int cuda_device_ = 0;            // the current device when the streams were made
  void* down_ = nullptr;           // cudaStream_t (non-blocking): device -> host
  void* up_ = nullptr;             // cudaStream_t (non-blocking): host -> device
  void* ready_ = nullptr;          // cudaEvent_t: the compute stream's point a download waits for
  void* compute_ready_ = nullptr;  // cudaEvent_t: the compute stream's point the uploads wait for
  void* drained_ = nullptr;        // cudaEvent_t: a copy stream's point the compute stream waits for
  std::vector<void*> marks_;       // cudaEvent_t per mark
  std::vector<uint8_t> pending_;   // the mark's event was recorded and not yet waited on
};

// Copies between a host array and a tensor on any device (cudaMemcpy for CUDA tensors).
void copy_from_host(const Tensor& dst, const void* src);
void copy_to_host(void* dst, const Tensor& src);
// Number of usable CUDA devices (0 without a driver, a device or a CUDA build; *why says which).
int cuda_device_count(std::string* why = nullptr);

}  // namespace pl
