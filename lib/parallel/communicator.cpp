// The one-rank Communicator, make_communicator's choice of implementation, and the device/banner helpers.
#include "parallel/communicator.h"

#include <cstdlib>

#include "core/error.h"
#include "parallel/collective_checks.h"
#include "parallel/mpi_communicator.h"
#include "parallel/nccl_communicator.h"

#if defined(PL_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace pl::parallel {
namespace {

// Every collective over one rank is the identity: the checks run (so a call that is wrong here is
// wrong with more ranks too), nothing moves.
class OneRankCommunicator final : public Communicator {
 public:
  explicit OneRankCommunicator(Device device) : device_(device) {}
  std::string name() const override { return "one rank"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(const Tensor& buf, bool) override { check_buffer("all_reduce_sum", buf, device_, 0); }
  void all_reduce_max(const Tensor& buf, bool) override { check_buffer("all_reduce_max", buf, device_, 0); }
  void reduce_scatter_sum(const Tensor& buf, bool) override { check_buffer("reduce_scatter_sum", buf, device_, 0); }
  void reduce_sum(const Tensor& piece, int root, bool) override {
    check_buffer("reduce_sum", piece, device_, 0);
    check_root("reduce_sum", root, 1, 0);
  }
  void all_gather(const Tensor& buf, bool) override { check_buffer("all_gather", buf, device_, 0); }
  void broadcast(const Tensor& piece, int root, bool) override {
    check_buffer("broadcast", piece, device_, 0);
    check_root("broadcast", root, 1, 0);
  }
  void wait() override {}
  size_t queued() const override { return 0; }  // (nothing is ever in flight)
  void wait_first(size_t) override {}

 private:
  Device device_;
};

}  // namespace

std::unique_ptr<Communicator> make_communicator(const World& world, const OpContext& ctx, bool nccl_for_one_rank) {
  if (ctx.device == Device::CUDA && (world.size() > 1 || nccl_for_one_rank)) {
#if defined(PL_WITH_NCCL)
    return make_nccl_communicator(world, ctx);
#else
    if (world.size() > 1)
      fail("{}: data parallelism on GPUs needs NCCL, and this build has none (the CMake banner's NCCL line; "
           "NCCL comes with the CUDA toolkit or the nvidia-nccl package)",
           world.describe());
#endif
  }
  if (world.size() == 1) return std::make_unique<OneRankCommunicator>(ctx.device);
#if defined(PL_WITH_MPI)
  return make_mpi_communicator(world);
#else
  fail("{}: more than one rank without MPI (internal error: the World cannot have been made so)", world.describe());
#endif
}

void select_local_device([[maybe_unused]] const World& world) {
#if defined(PL_WITH_CUDA)
  if (world.size() == 1 || world.local_size() == 1) return;  // the default device (CUDA_VISIBLE_DEVICES' first)
  int count = 0;
  const cudaError_t st = cudaGetDeviceCount(&count);
  if (st != cudaSuccess) count = 0;
  if (world.local_rank() >= count) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    fail("rank {} needs GPU {}; this node has {} (CUDA_VISIBLE_DEVICES={}{}): start at most {} ranks per node",
         world.rank(), world.local_rank(), count, visible ? visible : "unset",
         st != cudaSuccess ? std::string(", cudaGetDeviceCount: ") + cudaGetErrorString(st) : std::string(),
         count);
  }
  const cudaError_t set = cudaSetDevice(world.local_rank());
  if (set != cudaSuccess)
    fail("cudaSetDevice({}) on rank {}: CUDA error {}: {}", world.local_rank(), world.rank(), cudaGetErrorName(set),
         cudaGetErrorString(set));
#endif
}

std::string nccl_version() {
#if defined(PL_WITH_NCCL)
  return nccl_library_version();
#else
  return "not built";
#endif
}

}  // namespace pl::parallel
