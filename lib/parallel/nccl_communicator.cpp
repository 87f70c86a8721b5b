// The GPU backend's Communicator: NCCL collectives on the DeviceState's communication stream, ordered
// against the compute stream by its two events (backend/cuda/device_state.h, DeviceState::comm_stream).
// Compiled only with CUDA and NCCL (lib/CMakeLists.txt). API as documented in nccl.h (NCCL 2.28):
// in-place reduce-scatter when recvbuff == sendbuff + rank * recvcount, in-place all-gather when
// sendbuff == recvbuff + rank * sendcount.
#include "parallel/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_state.h"
#include "core/error.h"
#include "parallel/collective_checks.h"

namespace pl::parallel {
namespace {

ncclDataType_t nccl_type(DType t) { return t == DType::BF16 ? ncclBfloat16 : ncclFloat32; }

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const World& world, const OpContext& ctx) : world_(world), gpu_(ctx.gpu) {
    PL_CHECK(ctx.device == Device::CUDA && gpu_ != nullptr,
             "NCCL communicator on rank {}: the op context has no CUDA device state", world.rank());
    PL_CHECK(gpu_->comm_stream != nullptr && gpu_->compute_ready != nullptr && gpu_->comm_done != nullptr,
             "NCCL communicator on rank {}: the device state has no communication stream", world.rank());
    // Rank 0 makes the unique id (the address its bootstrap listens on); MPI carries it to the others.
    ncclUniqueId id{};
    if (world.rank() == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId", "");
    world.broadcast(&id, sizeof id, 0);
    cuda::check(cudaSetDevice(gpu_->device), "cudaSetDevice", "device " + std::to_string(gpu_->device) + where());
    check(ncclCommInitRank(&comm_, world.size(), id, world.rank()), "ncclCommInitRank",
          std::to_string(world.size()) + " ranks, device " + std::to_string(gpu_->device));
    // An error on any rank ends the run through World::abort: the communicator is aborted first, so no
    // NCCL kernel keeps this GPU waiting for a peer that is gone.
    marks_.resize(4096);
    for (cudaEvent_t& e : marks_)
      cuda::check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags",
                  "the communicator's marks" + where());
    hook_ = world.add_abort_hook([this] {
      if (comm_ != nullptr) ncclCommAbort(comm_);
      comm_ = nullptr;
    });
  }

  ~NcclCommunicator() override {
    world_.remove_abort_hook(hook_);
    if (comm_ == nullptr) return;
    // Statuses ignored (nothing can be reported from a destructor). Everything queued has finished
    // before the communicator goes; a failing run ends through World::abort instead.
    cudaStreamSynchronize(gpu_->comm_stream);
    ncclCommDestroy(comm_);
    for (cudaEvent_t e : marks_) cudaEventDestroy(e);
  }

  std::string name() const override { return nccl_library_version(); }
  int rank() const override { return world_.rank(); }
  int size() const override { return world_.size(); }

  void all_reduce_sum(const Tensor& buf, bool) override { all_reduce("all_reduce_sum", ncclSum, buf); }
  void all_reduce_max(const Tensor& buf, bool) override { all_reduce("all_reduce_max", ncclMax, buf); }

  void reduce_scatter_sum(const Tensor& buf, bool) override {
    const char* op = "reduce_scatter_sum";
    check_buffer(op, buf, Device::CUDA, rank());
    const int64_t k = slice_elements(op, buf, size(), rank());
    after_compute(op, buf);
    // In place: this rank's slice of the same buffer receives the sum of that slice.
    void* mine = static_cast<char*>(buf.data) + static_cast<size_t>(k * rank()) * dtype_size(buf.dtype);
    check(ncclReduceScatter(buf.data, mine, static_cast<size_t>(k), nccl_type(buf.dtype), ncclSum, comm_,
                            gpu_->comm_stream),
          "ncclReduceScatter", describe_buffer(buf));
    mark_queued();
  }

  void reduce_sum(const Tensor& piece, int root, bool) override {
    const char* op = "reduce_sum";
    check_buffer(op, piece, Device::CUDA, rank());
    check_root(op, root, size(), rank());
    after_compute(op, piece);
    check(ncclReduce(piece.data, piece.data, static_cast<size_t>(piece.numel()), nccl_type(piece.dtype), ncclSum, root,
                     comm_, gpu_->comm_stream),
          "ncclReduce", describe_buffer(piece) + " to rank " + std::to_string(root));
    mark_queued();
  }

  void all_gather(const Tensor& buf, bool) override {
    const char* op = "all_gather";
    check_buffer(op, buf, Device::CUDA, rank());
    const int64_t k = slice_elements(op, buf, size(), rank());
    after_compute(op, buf);
    // In place: this rank's slice is the piece it sends.
    const void* mine = static_cast<const char*>(buf.data) + static_cast<size_t>(k * rank()) * dtype_size(buf.dtype);
    check(ncclAllGather(mine, buf.data, static_cast<size_t>(k), nccl_type(buf.dtype), comm_, gpu_->comm_stream),
          "ncclAllGather", describe_buffer(buf));
    mark_queued();
  }

  void broadcast(const Tensor& piece, int root, bool) override {
    const char* op = "broadcast";
    check_buffer(op, piece, Device::CUDA, rank());
    check_root(op, root, size(), rank());
    after_compute(op, piece);
    check(ncclBroadcast(piece.data, piece.data, static_cast<size_t>(piece.numel()), nccl_type(piece.dtype), root,
                        comm_, gpu_->comm_stream),
          "ncclBroadcast", describe_buffer(piece) + " from rank " + std::to_string(root));
    mark_queued();
  }

  void wait() override {
    cuda::check(cudaEventRecord(gpu_->comm_done, gpu_->comm_stream), "cudaEventRecord",
                "communication stream (Communicator::wait)" + where());
    cuda::check(cudaStreamWaitEvent(gpu_->stream, gpu_->comm_done, 0), "cudaStreamWaitEvent",
                "compute stream waits for the collectives (Communicator::wait)" + where());
    queued_ = 0;
  }
  size_t queued() const override { return queued_; }
  // The compute stream waits for the event recorded after the count-th collective since the last wait().
  void wait_first(size_t count) override {
    if (count == 0) return;
    PL_CHECK(count <= queued_ && queued_ - count < marks_.size(),
             "internal: wait for collective {} of {} queued (events kept for the last {})", count, queued_,
             marks_.size());
    cuda::check(cudaStreamWaitEvent(gpu_->stream, marks_[(count - 1) % marks_.size()], 0), "cudaStreamWaitEvent",
                "compute stream waits for collective " + std::to_string(count) + where());
  }

 private:
  std::string where() const { return " on rank " + std::to_string(world_.rank()); }

  // In place over all ranks with `reduction` (ncclSum, ncclMax), on the communication stream.
  void all_reduce(const char* op, ncclRedOp_t reduction, const Tensor& buf) {
    check_buffer(op, buf, Device::CUDA, rank());
    after_compute(op, buf);
    check(ncclAllReduce(buf.data, buf.data, static_cast<size_t>(buf.numel()), nccl_type(buf.dtype), reduction, comm_,
                        gpu_->comm_stream),
          "ncclAllReduce", std::string(op) + " " + describe_buffer(buf));
    mark_queued();
  }

  // An event after the collective just queued (the ring of marks_), for wait_first.
  void mark_queued() {
    cuda::check(cudaEventRecord(marks_[queued_ % marks_.size()], gpu_->comm_stream), "cudaEventRecord",
                "communication stream after collective " + std::to_string(queued_ + 1) + where());
    ++queued_;
  }

  // The communication stream waits for everything queued on the compute stream so far (the producer of
  // the buffer, e.g. the backward of a bucket's last layer).
  void after_compute(const char* op, const Tensor& buf) const {
    PL_CHECK(comm_ != nullptr, "{}{}: the NCCL communicator was aborted", op, where());
    const std::string what = std::string(op) + " " + describe_buffer(buf) + where();
    cuda::check(cudaEventRecord(gpu_->compute_ready, gpu_->stream), "cudaEventRecord", "compute stream before " + what);
    cuda::check(cudaStreamWaitEvent(gpu_->comm_stream, gpu_->compute_ready, 0), "cudaStreamWaitEvent",
                "communication stream before " + what);
  }

  void check(ncclResult_t st, const char* op, const std::string& what) const {
    if (st == ncclSuccess) return;
    const char* last = comm_ != nullptr ? ncclGetLastError(comm_) : ncclGetLastError(nullptr);
    fail("{} ({}){}: NCCL error {}: {}{}{}", op, what, where(), static_cast<int>(st), ncclGetErrorString(st),
         last != nullptr && *last != '\0' ? "; last error: " : "", last != nullptr ? last : "");
  }

  const World& world_;
  cuda::DeviceState* gpu_;
  ncclComm_t comm_ = nullptr;
  int hook_ = 0;
  // One event per collective since the last wait(), in a ring (made once: nothing is created in the loop;
  // a step queues at most a few hundred collectives: buckets x owners).
  std::vector<cudaEvent_t> marks_;
  size_t queued_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const World& world, const OpContext& ctx) {
  return std::make_unique<NcclCommunicator>(world, ctx);
}

std::string nccl_library_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "NCCL (version unknown)";
  // NCCL_VERSION(X,Y,Z) in nccl.h: X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z from 2.9 on.
  const int major = v >= 10000 ? v / 10000 : v / 1000, minor = v >= 10000 ? (v % 10000) / 100 : (v % 1000) / 100;
  return "NCCL " + std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(v % 100);
}

}  // namespace pl::parallel
