#include "parallel/mpi_communicator.h"

#if defined(PL_WITH_MPI)
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/collective_checks.h"
#include "parallel/mpi_check.h"

namespace pl::parallel {
namespace {

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(const World& world) : world_(world) {
    PL_CHECK(world.uses_mpi(), "MPI communicator on rank {}: the World was not started by an MPI launcher ({})",
             world.rank(), world.describe());
    // A communicator of its own: the World's host collectives (loss sums, NaN votes) may run while
    // nonblocking gradient collectives are still in flight here, without the two streams of
    // collectives having to interleave in one order on one communicator.
    mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup", "MPI communicator", world.rank(), 0);
    mpi_check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", "MPI communicator",
              world.rank(), 0);
  }

  ~MpiCommunicator() override {
    // Pending requests must complete before their communicator is freed; statuses ignored (nothing can
    // be reported from a destructor; an error path ends the process through World::abort instead).
    if (!requests_.empty()) MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  std::string name() const override { return "MPI (CPU ranks)"; }
  int rank() const override { return world_.rank(); }
  int size() const override { return world_.size(); }

  void all_reduce_sum(const Tensor& buf, bool async) override { all_reduce("all_reduce_sum", MPI_SUM, buf, async); }

  void all_reduce_max(const Tensor& buf, bool async) override { all_reduce("all_reduce_max", MPI_MAX, buf, async); }

  void reduce_scatter_sum(const Tensor& buf, bool async) override {
    const int64_t k = slice_elements("reduce_scatter_sum", buf, size(), rank());
    const Call c = start("MPI_Reduce_scatter_block", "reduce_scatter_sum", buf, k);
    float* p = buf.f32();
    // With MPI_IN_PLACE the sum of slice `rank` lands at the start of the buffer (MPI 3.1 §5.10.1), not
    // at the slice the header promises: moved there once the operation is complete. For rank >= 1 the
    // two ranges [0, k) and [rank*k, (rank+1)*k) do not overlap; slice 0 is "unspecified" afterwards.
    Move move{p, p + k * rank(), static_cast<size_t>(k) * sizeof(float)};
    if (async) {
      check(c, MPI_Ireduce_scatter_block(MPI_IN_PLACE, p, c.count, MPI_FLOAT, MPI_SUM, comm_, &queued(c, move)));
    } else {
      check(c, MPI_Reduce_scatter_block(MPI_IN_PLACE, p, c.count, MPI_FLOAT, MPI_SUM, comm_));
      move.run();
    }
  }

  void reduce_sum(const Tensor& piece, int root, bool async) override {
    check_root("reduce_sum", root, size(), rank());
    const Call c = start("MPI_Reduce", "reduce_sum to rank " + std::to_string(root), piece, piece.numel());
    float* p = piece.f32();
    // The root sums into its own buffer (MPI_IN_PLACE); the others only send.
    const void* send = rank() == root ? MPI_IN_PLACE : p;
    if (async)
      check(c, MPI_Ireduce(send, p, c.count, MPI_FLOAT, MPI_SUM, root, comm_, &queued(c)));
    else
      check(c, MPI_Reduce(send, p, c.count, MPI_FLOAT, MPI_SUM, root, comm_));
  }

  void all_gather(const Tensor& buf, bool async) override {
    const int64_t k = slice_elements("all_gather", buf, size(), rank());
    const Call c = start("MPI_Allgather", "all_gather", buf, k);
    float* p = buf.f32();
    // MPI_IN_PLACE: each rank's contribution is already at its slice of the receive buffer.
    if (async)
      check(c, MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, p, c.count, MPI_FLOAT, comm_, &queued(c)));
    else
      check(c, MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, p, c.count, MPI_FLOAT, comm_));
  }

  void broadcast(const Tensor& piece, int root, bool async) override {
    check_root("broadcast", root, size(), rank());
    const Call c = start("MPI_Bcast", "broadcast from rank " + std::to_string(root), piece, piece.numel());
    float* p = piece.f32();
    if (async)
      check(c, MPI_Ibcast(p, c.count, MPI_FLOAT, root, comm_, &queued(c)));
    else
      check(c, MPI_Bcast(p, c.count, MPI_FLOAT, root, comm_));
  }

  void wait() override {
    complete(requests_.size());
    requests_.clear();
    pending_.clear();
    completed_ = 0;
  }
  size_t queued() const override { return requests_.size(); }
  void wait_first(size_t count) override { complete(std::min(count, requests_.size())); }

  // Completes requests [completed_, upto) in order of starting and makes their moves.
  void complete(size_t upto) {
    if (upto <= completed_) return;
    const size_t first = completed_, n = upto - first;
    std::vector<MPI_Status> statuses(n);
    const int rc = MPI_Waitall(static_cast<int>(n), requests_.data() + first, statuses.data());
    if (rc != MPI_SUCCESS) {
      // MPI_ERR_IN_STATUS: the failing operations say so in their status; name the first.
      for (size_t i = 0; i < n; ++i)
        if (rc == MPI_ERR_IN_STATUS && statuses[i].MPI_ERROR != MPI_SUCCESS)
          mpi_fail(statuses[i].MPI_ERROR, "MPI_Waitall", pending_[first + i].what, rank(), pending_[first + i].bytes);
      mpi_fail(rc, "MPI_Waitall", std::to_string(n) + " pending collectives, the first " + pending_[first].what, rank(),
               pending_[first].bytes);
    }
    for (size_t i = first; i < upto; ++i) pending_[i].move.run();
    completed_ = upto;
  }

 private:
  // A copy to make once the data is there (the in-place reduce-scatter's result, see there).
  struct Move {
    float* from = nullptr;
    float* to = nullptr;
    size_t bytes = 0;
    void run() const {
      if (from != to && bytes > 0) std::memcpy(to, from, bytes);
    }
  };
  struct Pending {
    std::string what;  // "MPI_Ireduce_scatter_block (reduce_scatter_sum, [1024] f32, 4096 bytes)"
    size_t bytes = 0;
    Move move;
  };
  // One collective being started: what it is (for errors) and its count, checked to fit an int.
  struct Call {
    const char* mpi_op;
    std::string what;
    size_t bytes;
    int count;
  };

  // In place over all ranks with `reduction` (MPI_SUM, MPI_MAX), fp32.
  void all_reduce(const char* op, MPI_Op reduction, const Tensor& buf, bool async) {
    const Call c = start("MPI_Allreduce", op, buf, buf.numel());
    float* p = buf.f32();
    if (async)
      check(c, MPI_Iallreduce(MPI_IN_PLACE, p, c.count, MPI_FLOAT, reduction, comm_, &queued(c)));
    else
      check(c, MPI_Allreduce(MPI_IN_PLACE, p, c.count, MPI_FLOAT, reduction, comm_));
  }
  Call start(const char* mpi_op, const std::string& op, const Tensor& buf, int64_t count) const {
    check_buffer(op.c_str(), buf, Device::CPU, rank());
    return Call{mpi_op, op + ", " + describe_buffer(buf), buf.bytes(),
                mpi_count(static_cast<size_t>(count), mpi_op, op, rank())};
  }
  void check(const Call& c, int rc) const { mpi_check(rc, c.mpi_op, c.what, rank(), c.bytes); }
  // The request slot of a nonblocking collective being started (filled by the MPI call it is handed
  // to), completed and its move made in wait(). A call that fails leaves MPI_REQUEST_NULL there, which
  // MPI_Waitall skips.
  MPI_Request& queued(const Call& c) { return queued(c, Move{}); }
  MPI_Request& queued(const Call& c, Move move) {
    pending_.push_back(Pending{std::string(c.mpi_op) + " (" + c.what + ")", c.bytes, move});
    requests_.push_back(MPI_REQUEST_NULL);
    return requests_.back();
  }

  const World& world_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::vector<MPI_Request> requests_;  // in the order started; completed together in wait()
  std::vector<Pending> pending_;       // same order: what each is, and the move to make afterwards
  size_t completed_ = 0;               // the first ones already completed by wait_first
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(const World& world) {
  return std::make_unique<MpiCommunicator>(world);
}

}  // namespace pl::parallel
#endif
