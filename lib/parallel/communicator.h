#pragma once
// Collectives over the ranks of a World on the flat buffers (gradients, weights) of one backend:
// NCCL on the GPU backend, MPI on the CPU backend, and nothing at all for one rank.
//
// Ordering (what the trainer relies on):
//   - A collective is queued after everything already queued on the compute stream of the context it
//     was made with (GPU: an event on the compute stream, waited for by the communication stream, which
//     lives in the context's DeviceState; CPU: the caller's thread has finished that work already).
//   - wait() makes the compute stream wait for every collective queued so far (GPU: an event recorded
//     on the communication stream; CPU: MPI_Waitall). Nothing may read or write a buffer handed to a
//     collective before wait().
//   - Every rank queues the same collectives, with the same sizes, in the same order.
// With async (the overlap flags) the CPU implementation starts nonblocking MPI operations
// (MPI_Ireduce_scatter_block, ...) and completes them in wait(); without, it completes each at once.
// The GPU implementation always queues on the communication stream; `async` only says whether the
// caller is still computing meanwhile (no difference to NCCL).
//
// Buffers are Tensors of F32 or BF16 (BF16: on the GPU; the CPU backend stores bf16 values as F32) on
// the communicator's device. Sums of F32 are F32 sums; the result of a 2-rank sum is the same on every
// rank and equals a + b exactly as the one-rank code would add them.
//
// Errors: a pl::Error naming the op, this rank, the bytes and the library's status string (ncclGetErrorString,
// MPI_Error_string) and, for NCCL, ncclGetLastError.
#include <memory>
#include <string>

#include "backend/ops.h"
#include "core/tensor.h"
#include "parallel/world.h"

namespace pl::parallel {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string name() const = 0;  // "one rank" | "MPI (CPU ranks)" | "NCCL 2.27.3"
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Sum in place over all ranks (plain data parallelism's gradient all-reduce).
  virtual void all_reduce_sum(const Tensor& buf, bool async) = 0;
  // Maximum in place over all ranks, fp32 (Transformer Engine's reduce_amax: FP8 delayed scaling's amaxes of
  // this step over the data-parallel group before the history update).
  virtual void all_reduce_max(const Tensor& buf, bool async) = 0;
  // buf: [size() * k] elements on every rank. Afterwards buf's slice [rank*k, (rank+1)*k) holds the sum
  // over the ranks of that slice; the other slices are unspecified (the distributed optimizer's
  // gradient reduce-scatter, in place as Megatron's).
  virtual void reduce_scatter_sum(const Tensor& buf, bool async) = 0;
  // Sum over the ranks of `piece` into root's `piece` (the other ranks' piece is unspecified): one
  // bucket's part owned by one rank, when buckets are reduced as the backward finishes them.
  virtual void reduce_sum(const Tensor& piece, int root, bool async) = 0;
  // buf: [size() * k]: every rank's slice r becomes rank r's slice r (in place).
  virtual void all_gather(const Tensor& buf, bool async) = 0;
  // root's `piece` to every rank (in place).
  virtual void broadcast(const Tensor& piece, int root, bool async) = 0;
  // The compute stream (CPU: the caller) waits for every collective queued so far.
  virtual void wait() = 0;
  // Partial waits (--overlap-param-gather: the forward waits for each bucket's weights only when it
  // reaches them): how many collectives were queued since the last wait(), and a wait for the first
  // `count` of them only (the later ones stay in flight; wait() still completes all).
  virtual size_t queued() const = 0;
  virtual void wait_first(size_t count) = 0;
};

// The communicator for ctx's backend over `world`:
//   - world.size() == 1: one that does nothing (every collective over one rank is the identity),
//     except on the GPU with NCCL built, where NCCL runs over one rank through the same code (so the
//     GPU conformance suite exercises it) when `nccl_for_one_rank` is true.
//   - CPU, size > 1: MPI (needs world.uses_mpi()).
//   - CUDA, size > 1: NCCL (ncclCommInitRank with the unique id broadcast from rank 0 through the World;
//     the device is the one ctx's DeviceState opened, chosen by select_local_device). Not built with NCCL:
//     a pl::Error saying so.
// The communicator registers an abort hook with the world (ncclCommAbort) and removes it when destroyed.
std::unique_ptr<Communicator> make_communicator(const World& world, const OpContext& ctx, bool nccl_for_one_rank = false);

// Before open_device_state on a multi-GPU node (only for --device cuda: on a CPU run it would ask the
// CUDA runtime for GPUs the run does not use): cudaSetDevice(world.local_rank()) when this build has
// CUDA and the world has more than one rank on this node; a pl::Error when the node has fewer GPUs than
// local ranks ("rank 5 needs GPU 5; this node has 4 (CUDA_VISIBLE_DEVICES=...)"). No-op otherwise.
void select_local_device(const World& world);

// "NCCL 2.27.3" (ncclGetVersion) or "not built": for the banner.
std::string nccl_version();

}  // namespace pl::parallel
